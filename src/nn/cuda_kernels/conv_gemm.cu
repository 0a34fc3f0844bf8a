// A Code2Wav causal convolution as one implicit GEMM on the tensor cores (bf16 in, f32 accumulate),
// reading the input where it lies and writing the output in its final [batch, channels, time]
// layout, with the bias add and what follows it (bias_epilogue.cuh) in the same pass.
// Reference: `StreamingCausalConv1d::forward` and `StreamingCausalConvTranspose1d::forward`
// (src/nn/conv.rs), which run candle's im2col, a GEMM and a transposing copy, or a GEMM, an
// overlap-add and a permuting copy.
//
//   acc[b, m, n] = sum over tap j < taps, input channel ci < cin of
//                  w[m, j * cin + ci] * xp[b, ci, n + j * dilation]
//   out[b, m / phases, n * phases + m % phases] = epilogue(round_to<bf16>(acc[b, m, n]))
//
// xp is the stream's past input (`hist` [batch, cin, ctx], ctx = (taps - 1) * dilation, absent when
// ctx = 0) followed by the chunk (`x` [batch, cin, len]), so the concatenation is never made.
// A causal convolution (kernel k, dilation d) is taps = k, phases = 1, w [cout, k * cin] (the
// weight's taps outermost). A causal transposed convolution (stride s, q = ceil(k / s)) is taps = q,
// dilation 1, phases = s: output sample n * s + r of channel co is row m = co * s + r, and its tap j
// is the weight's tap (q - 1 - j) * s + r against input frame n - (q - 1 - j).
//
// Tiles: a block of 4 warps makes a 64 (rows m) x 64 (columns n) tile of one batch row; each warp a
// 32 x 32 quarter as 2 x 2 WMMA 16x16x16 fragments. The reduction runs tap by tap over 32 input
// channels at a time (zeros past cin), so any cin works. Launch: grid (ceil(len / 64),
// ceil(rows / 64), batch), block 128 threads.
#include <mma.h>

#include "bias_epilogue.cuh"

using namespace omnitts;
using namespace nvcuda;

#define CONV_BM 64
#define CONV_BN 64
#define CONV_BK 32
#define CONV_THREADS 128
// Shared-memory row pitches (elements); multiples of 8 as WMMA needs, padded against bank conflicts.
#define CONV_LDA (CONV_BK + 8)
#define CONV_LDB (CONV_BN + 8)
#define CONV_LDC (CONV_BN + 4)

struct ConvTiles {
    __nv_bfloat16 a[CONV_BM][CONV_LDA];
    __nv_bfloat16 b[CONV_BK][CONV_LDB];
};
union ConvShared {
    ConvTiles tiles;
    float c[CONV_BM][CONV_LDC];
};

template <int MODE>
__device__ void conv_gemm(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ hist,
                          const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ bias,
                          const float* __restrict__ frequency,
                          const float* __restrict__ inv_magnitude,
                          const __nv_bfloat16* __restrict__ residual,
                          __nv_bfloat16* __restrict__ out, int rows, int cin, int taps,
                          int dilation, int len, int phases) {
    __shared__ __align__(32) ConvShared sh;
    const int tid = threadIdx.x, warp = tid >> 5;
    const int wm = warp >> 1, wn = warp & 1;
    const int n0 = blockIdx.x * CONV_BN, m0 = blockIdx.y * CONV_BM, b = blockIdx.z;
    const int ctx = (taps - 1) * dilation;
    const long k_total = (long)taps * cin;
    const __nv_bfloat16* xb = x + (long)b * cin * len;
    const __nv_bfloat16* hb = hist + (long)b * cin * ctx;
    const __nv_bfloat16 zero = __float2bfloat16(0.f);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.f);

    for (int tap = 0; tap < taps; ++tap) {
        const int shift = tap * dilation;
        for (int c0 = 0; c0 < cin; c0 += CONV_BK) {
            // A tile: w[m0 + r, tap * cin + c0 + k]; 32 consecutive k a row (coalesced).
#pragma unroll
            for (int e = 0; e < CONV_BM * CONV_BK / CONV_THREADS; ++e) {
                const int idx = e * CONV_THREADS + tid;
                const int r = idx / CONV_BK, k = idx % CONV_BK;
                const int m = m0 + r, ci = c0 + k;
                sh.tiles.a[r][k] =
                    (m < rows && ci < cin) ? w[(long)m * k_total + (long)tap * cin + ci] : zero;
            }
            // B tile: xp[b, c0 + k, n0 + col + shift]; 64 consecutive columns a row (coalesced).
#pragma unroll
            for (int e = 0; e < CONV_BK * CONV_BN / CONV_THREADS; ++e) {
                const int idx = e * CONV_THREADS + tid;
                const int k = idx / CONV_BN, col = idx % CONV_BN;
                const int n = n0 + col, ci = c0 + k;
                __nv_bfloat16 v = zero;
                if (n < len && ci < cin) {
                    const int p = n + shift;  // position in xp
                    v = p < ctx ? hb[(long)ci * ctx + p] : xb[(long)ci * len + (p - ctx)];
                }
                sh.tiles.b[k][col] = v;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < CONV_BK; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb[2];
#pragma unroll
                for (int i = 0; i < 2; ++i)
                    wmma::load_matrix_sync(fa[i], &sh.tiles.a[wm * 32 + i * 16][kk], CONV_LDA);
#pragma unroll
                for (int j = 0; j < 2; ++j)
                    wmma::load_matrix_sync(fb[j], &sh.tiles.b[kk][wn * 32 + j * 16], CONV_LDB);
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
            }
            __syncthreads();
        }
    }

    // The tiles are dead (the loop ends on a barrier): the accumulators go through shared memory
    // so that the stores below are laid out by output position, not by fragment.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&sh.c[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], CONV_LDC,
                                    wmma::mem_row_major);
    __syncthreads();
    const int channels = rows / phases;
    const long out_len = (long)len * phases;
    for (int idx = tid; idx < CONV_BM * CONV_BN; idx += CONV_THREADS) {
        const int r = idx / CONV_BN, col = idx % CONV_BN;
        const int m = m0 + r, n = n0 + col;
        if (m >= rows || n >= len) continue;
        const int c = m / phases;
        const long o = ((long)b * channels + c) * out_len + (long)n * phases + (m % phases);
        const float y = round_to<__nv_bfloat16>(sh.c[r][col]);
        const float res = MODE == 3 ? to_f(residual[o]) : 0.f;
        out[o] = from_f<__nv_bfloat16>(
            epilogue_value<__nv_bfloat16, MODE>(y, c, bias, frequency, inv_magnitude, res));
    }
}

#define CONV_GEMM_OP(MODE, NAME)                                                                 \
    extern "C" __global__ void __launch_bounds__(CONV_THREADS)                                  \
        NAME(const __nv_bfloat16* w, const __nv_bfloat16* hist, const __nv_bfloat16* x,          \
             const __nv_bfloat16* bias, const float* frequency, const float* inv_magnitude,     \
             const __nv_bfloat16* residual, __nv_bfloat16* out, int rows, int cin, int taps,     \
             int dilation, int len, int phases) {                                                \
        conv_gemm<MODE>(w, hist, x, bias, frequency, inv_magnitude, residual, out, rows, cin,   \
                        taps, dilation, len, phases);                                            \
    }

CONV_GEMM_OP(0, conv_gemm_plain_bf16)
CONV_GEMM_OP(1, conv_gemm_bias_bf16)
CONV_GEMM_OP(2, conv_gemm_snake_bf16)
CONV_GEMM_OP(3, conv_gemm_residual_bf16)
