// One-row matmuls of the decode path (GEMV: `rows` <= GEMV_MAX_ROWS query rows against a weight
// [n, k] in the checkpoint's [out, in] layout), with the RMSNorm before them and the residual add
// or SwiGLU after them fused in, so a decoder layer's MLP and projections need 4 launches
// instead of 7 (docs/cuda.md, "One-row matmuls").
//
// Five variants (PROLOGUE x EPILOGUE):
//   gemv_norm        out = norm(x) W^T             (input RMSNorm + q/k/v projections)
//   gemv_norm_logits out = f32(T(norm(x) W^T))     (final norm + a head, logits as f32, as the
//                                                   unfused `head(norm(h)).to_dtype(F32)`)
//   gemv_residual    out = res + x W^T             (o_proj, down_proj + the residual add)
//   gemv_bias        out = x W^T + bias            (a Linear with a bias; `res` is the bias [n])
//   gemv_norm_silu   out = silu(norm(x) G^T) * (norm(x) U^T), W = [G; U] ([2n, k], gate rows
//                    first: the fused gate/up weight)
// Numerics follow the unfused candle ops they replace: norm(x) = x * rsqrt(mean(x^2) + eps) * w
// in f32, rounded to T (candle's rms_norm); dot products in f32, rounded to T (cuBLAS's output);
// the residual add and SiLU * up in f32 from those T values, rounded once.
//
// Work split: each output element is one row of W read once, by `wpr` warps (warps per row,
// 1/2/4/8) that split k; a block of GEMV_THREADS threads handles 8/wpr output elements. Each lane
// reads 8 consecutive k (16-byte loads for bf16), so k must be a multiple of 8 and every row
// 16-byte aligned (checked by the launcher).
//
// Inputs: x [rows, k]; res [rows, n]; w_norm [k]; W [n, k] (or [2n, k] for silu); all
// contiguous. Output: out [rows, n] (T; f32 for the logits variant). Launch: grid
// ceil(n * wpr / 8), block GEMV_THREADS.
#include "common.cuh"

using namespace omnitts;

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_MAX_ROWS 4

enum Epilogue { EPI_PLAIN = 0, EPI_RESIDUAL = 1, EPI_SILU = 2, EPI_LOGITS = 3, EPI_BIAS = 4 };

template <typename T, bool NORM, int EPI>
__device__ void gemv(const T* __restrict__ x, const T* __restrict__ w_norm, float eps,
                     const T* __restrict__ W, const T* __restrict__ res, void* __restrict__ out_,
                     int rows, int k, int n, int wpr) {
    T* out = reinterpret_cast<T*>(out_);
    __shared__ float scratch[32];
    __shared__ float scale[GEMV_MAX_ROWS];
    __shared__ float partial[GEMV_WARPS][GEMV_MAX_ROWS][2];

    // RMS statistics of each input row (every block recomputes them: k values, from L2).
    if (NORM) {
        for (int m = 0; m < rows; ++m) {
            float ss = 0.f;
            for (int c = threadIdx.x; c < k; c += blockDim.x) {
                const float f = to_f(x[(long)m * k + c]);
                ss += f * f;
            }
            const float total = block_sum(ss, scratch);
            if (threadIdx.x == 0) scale[m] = rsqrtf(total / (float)k + eps);
        }
        __syncthreads();
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_block = GEMV_WARPS / wpr;
    const int j = blockIdx.x * per_block + warp / wpr;  // output element of this warp
    const int part = warp % wpr;                         // its share of k
    const bool live = j < n;

    float acc[GEMV_MAX_ROWS][2];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) acc[m][0] = acc[m][1] = 0.f;

    if (live) {
        const T* wa = W + (long)j * k;
        const T* wb = EPI == EPI_SILU ? W + (long)(j + n) * k : wa;  // the up row (silu only)
#pragma unroll 4
        for (int c = (part * 32 + lane) * 8; c < k; c += wpr * 256) {
            float wv[8], ub[8];
            load8(wa + c, wv);
            if (EPI == EPI_SILU) load8(wb + c, ub);
            float nw[8];
            if (NORM) load8(w_norm + c, nw);
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                if (m < rows) {
                    float xv[8];
                    load8(x + (long)m * k + c, xv);
                    if (NORM) {
                        const float s = scale[m];
#pragma unroll
                        for (int i = 0; i < 8; ++i) xv[i] = round_to<T>(xv[i] * s * nw[i]);
                    }
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        acc[m][0] = fmaf(xv[i], wv[i], acc[m][0]);
                        if (EPI == EPI_SILU) acc[m][1] = fmaf(xv[i], ub[i], acc[m][1]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
        acc[m][0] = warp_sum(acc[m][0]);
        if (EPI == EPI_SILU) acc[m][1] = warp_sum(acc[m][1]);
    }
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                partial[warp][m][0] = acc[m][0];
                partial[warp][m][1] = acc[m][1];
            }
        }
        __syncthreads();
        if (part != 0) return;
        for (int p = 1; p < wpr; ++p) {
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                acc[m][0] += partial[warp + p][m][0];
                acc[m][1] += partial[warp + p][m][1];
            }
        }
    }
    if (!live || lane != 0) return;
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
        if (m >= rows) break;
        const long o = (long)m * n + j;
        if (EPI == EPI_PLAIN) {
            out[o] = from_f<T>(acc[m][0]);
        } else if (EPI == EPI_LOGITS) {
            reinterpret_cast<float*>(out_)[o] = round_to<T>(acc[m][0]);
        } else if (EPI == EPI_RESIDUAL) {
            out[o] = from_f<T>(to_f(res[o]) + round_to<T>(acc[m][0]));
        } else if (EPI == EPI_BIAS) {
            out[o] = from_f<T>(round_to<T>(acc[m][0]) + to_f(res[j]));
        } else {
            const float g = round_to<T>(acc[m][0]);
            const float u = round_to<T>(acc[m][1]);
            out[o] = from_f<T>(g / (1.f + expf(-g)) * u);
        }
    }
}

#define GEMV_OP(T, NORM, EPI, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        NAME(const T* x, const T* w_norm, float eps, const T* W, const T* res, void* out,       \
             int rows, int k, int n, int wpr) {                                                 \
        gemv<T, NORM, EPI>(x, w_norm, eps, W, res, out, rows, k, n, wpr);                       \
    }

GEMV_OP(__nv_bfloat16, true, EPI_PLAIN, gemv_norm_bf16)
GEMV_OP(float, true, EPI_PLAIN, gemv_norm_f32)
GEMV_OP(__nv_bfloat16, false, EPI_BIAS, gemv_bias_bf16)
GEMV_OP(float, false, EPI_BIAS, gemv_bias_f32)
GEMV_OP(__nv_bfloat16, false, EPI_RESIDUAL, gemv_residual_bf16)
GEMV_OP(float, false, EPI_RESIDUAL, gemv_residual_f32)
GEMV_OP(__nv_bfloat16, true, EPI_LOGITS, gemv_norm_logits_bf16)
GEMV_OP(float, true, EPI_LOGITS, gemv_norm_logits_f32)
GEMV_OP(__nv_bfloat16, true, EPI_SILU, gemv_norm_silu_bf16)
GEMV_OP(float, true, EPI_SILU, gemv_norm_silu_f32)
