// The input of a causal convolution's product, tap by tap: every tap's shifted view of the stream's
// past input followed by the chunk, laid out so that the convolution is one plain batched GEMM whose
// output is already [batch, channels, time]:
//   cols[b, j * cin + ci, n] = xp[b, ci, n + j * dilation]      (j < taps, ci < cin, n < len)
// with xp = [hist (ctx = (taps - 1) * dilation positions), x (len positions)] along time, read in
// place (the concatenation is never made). Reference: candle's `im2col1d`, which writes
// [batch, len, cin * k] (the GEMM's output then needs a transposing copy), after a concatenation.
// Reads and writes run along time, so both are coalesced. Elements move as 2- or 4-byte words.
// Launch: grid (ceil(len / (SHIFT_THREADS * 16 bytes / word size)), taps * cin, batch), block
// SHIFT_THREADS threads.

#define SHIFT_THREADS 256

// Each thread writes 16 bytes (VEC words) of one output row: a 16-byte store when the row's length
// keeps every such group aligned, else word by word. The reads (the same run shifted by
// j * dilation, from hist or x) go word by word; consecutive threads read consecutive words.
template <typename U>
__device__ void shift_cols(const U* __restrict__ hist, const U* __restrict__ x, U* __restrict__ cols,
                           int cin, int dilation, int ctx, int len) {
    constexpr int VEC = 16 / sizeof(U);
    const int n0 = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (n0 >= len) return;
    const int row = blockIdx.y;  // j * cin + ci
    const int j = row / cin, ci = row - j * cin;
    const long b = blockIdx.z;
    const U* __restrict__ h = hist + (b * cin + ci) * ctx;
    const U* __restrict__ xr = x + (b * cin + ci) * len - ctx;  // xr[p] = x[p - ctx] for p >= ctx
    U* __restrict__ out = cols + (b * gridDim.y + row) * len;
    const int shift = j * dilation;
    if (n0 + VEC <= len && len % VEC == 0) {
        union {
            uint4 v;
            U w[VEC];
        } buf;
#pragma unroll
        for (int k = 0; k < VEC; ++k) {
            const int p = n0 + k + shift;
            buf.w[k] = p < ctx ? h[p] : xr[p];
        }
        *reinterpret_cast<uint4*>(out + n0) = buf.v;
    } else {
        for (int k = 0; k < VEC && n0 + k < len; ++k) {
            const int p = n0 + k + shift;
            out[n0 + k] = p < ctx ? h[p] : xr[p];
        }
    }
}

extern "C" __global__ void __launch_bounds__(SHIFT_THREADS)
    shift_cols_u16(const unsigned short* hist, const unsigned short* x, unsigned short* cols, int cin,
                   int dilation, int ctx, int len) {
    shift_cols<unsigned short>(hist, x, cols, cin, dilation, ctx, len);
}
extern "C" __global__ void __launch_bounds__(SHIFT_THREADS)
    shift_cols_u32(const unsigned int* hist, const unsigned int* x, unsigned int* cols, int cin,
                   int dilation, int ctx, int len) {
    shift_cols<unsigned int>(hist, x, cols, cin, dilation, ctx, len);
}
