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
#include "gemv.cuh"

using namespace omnitts;

#define GEMV_OP(T, NORM, EPI, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_THREADS)                                 \
        NAME(const T* x, const T* w_norm, float eps, const T* W, const T* res, void* out,       \
             int rows, int k, int n, int wpr) {                                                 \
        gemv<T, NORM, EPI>(x, w_norm, eps, W, res, out, rows, k, n, wpr, blockIdx.x);          \
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
