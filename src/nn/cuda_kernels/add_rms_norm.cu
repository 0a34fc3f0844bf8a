// Residual add + RMSNorm in one pass: sum = a + b (rounded to T, the residual stream), then
// normed = sum * rsqrt(mean(sum^2) + eps) * w, accumulated in f32 and rounded once to T (as
// candle's rms_norm on the rounded sum).
//
// Replaces, per layer: the residual add and the following RMSNorm (2 launches -> 1), twice per
// decoder layer when the layer boundary is fused too.
//
// Inputs: a, b [rows, cols] contiguous; w [cols]. Outputs: sum, normed [rows, cols].
// Launch: grid rows, block ADD_RMS_THREADS threads.
#include "common.cuh"

using namespace omnitts;

#define ADD_RMS_THREADS 256

template <typename T>
__device__ void add_rms_norm(const T* __restrict__ a, const T* __restrict__ b,
                             const T* __restrict__ w, T* __restrict__ sum,
                             T* __restrict__ normed, int cols, float eps) {
    __shared__ float scratch[32];
    const long base = (long)blockIdx.x * cols;
    float ss = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const T s = from_f<T>(to_f(a[base + c]) + to_f(b[base + c]));
        sum[base + c] = s;
        const float f = to_f(s);
        ss += f * f;
    }
    const float scale = rsqrtf(block_sum(ss, scratch) / (float)cols + eps);
    // Each thread re-reads only the elements it wrote itself.
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        normed[base + c] = from_f<T>(to_f(sum[base + c]) * scale * to_f(w[c]));
    }
}

#define ADD_RMS_NORM_OP(T, NAME)                                                                \
    extern "C" __global__ void __launch_bounds__(ADD_RMS_THREADS)                              \
        NAME(const T* a, const T* b, const T* w, T* sum, T* normed, int cols, float eps) {      \
        add_rms_norm<T>(a, b, w, sum, normed, cols, eps);                                       \
    }

ADD_RMS_NORM_OP(__nv_bfloat16, add_rms_norm_bf16)
ADD_RMS_NORM_OP(float, add_rms_norm_f32)
