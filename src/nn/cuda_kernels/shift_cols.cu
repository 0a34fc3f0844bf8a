// The input of a causal convolution's product, tap by tap: every tap's shifted view of the stream's
// past input followed by the chunk, laid out so that the convolution is one plain batched GEMM whose
// output is already [batch, channels, time]:
//   cols[b, j * cin + ci, n] = xp[b, ci, n + j * dilation]      (j < taps, ci < cin, n < len)
// with xp = [hist (ctx = (taps - 1) * dilation positions), x (len positions)] along time, read in
// place (the concatenation is never made). Reference: candle's `im2col1d`, which writes
// [batch, len, cin * k] (the GEMM's output then needs a transposing copy), after a concatenation.
// Reads and writes run along time, so both are coalesced. Elements move as 2- or 4-byte words.
// Launch: grid (ceil(len / SHIFT_THREADS), taps * cin, batch), block SHIFT_THREADS threads.

#define SHIFT_THREADS 256

template <typename U>
__device__ void shift_cols(const U* __restrict__ hist, const U* __restrict__ x, U* __restrict__ cols,
                           int cin, int dilation, int ctx, int len) {
    const int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= len) return;
    const int row = blockIdx.y;  // j * cin + ci
    const int j = row / cin, ci = row - j * cin;
    const long b = blockIdx.z;
    const int p = n + j * dilation;  // position in xp
    const U v = p < ctx ? hist[(b * cin + ci) * ctx + p] : x[(b * cin + ci) * len + (p - ctx)];
    cols[(b * gridDim.y + row) * len + n] = v;
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
