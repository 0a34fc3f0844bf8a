// The value of a Code2Wav convolution output element after its bias add and what follows it
// (reference: the tensor operations of src/nn/conv.rs then SnakeBeta or the residual add):
//   MODE 0: y (no bias)
//   MODE 1: y + bias[c]
//   MODE 2: snake(y + bias[c])        (SnakeBeta, as snake_beta.cu)
//   MODE 3: residual + (y + bias[c])
// `y` is the convolution's output already rounded to T; each intermediate is rounded to T as the
// unfused tensors are, without fused multiply-adds. Shared by bias_epilogue.cu (a pass of its own
// after a product) and conv_gemm.cu (the convolution's own output stage).
#pragma once
#include "common.cuh"

namespace omnitts {

template <typename T, int MODE>
__device__ __forceinline__ float epilogue_value(float y, int c, const T* __restrict__ bias,
                                                const float* __restrict__ frequency,
                                                const float* __restrict__ inv_magnitude,
                                                float residual) {
    if (MODE == 0) return y;
    const float h = round_to<T>(__fadd_rn(y, to_f(bias[c])));
    if (MODE == 2) {
        const float s = sinf(__fmul_rn(h, frequency[c]));
        return __fadd_rn(h, __fmul_rn(__fmul_rn(s, s), inv_magnitude[c]));
    }
    if (MODE == 3) return __fadd_rn(residual, h);
    return h;
}

}  // namespace omnitts
