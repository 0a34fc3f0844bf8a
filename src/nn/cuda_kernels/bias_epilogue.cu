// A convolution's bias add with what follows it in the Code2Wav decoder, in one pass over a
// [batch, channels, time] activation (reference: the tensor operations of
// `StreamingCausalConv1d::forward` / `StreamingCausalConvTranspose1d::forward` then
// `SnakeBeta::forward` or the residual add, src/nn/conv.rs):
//   mode 0: out = y + bias[c]
//   mode 1: out = snake(y + bias[c])        (SnakeBeta, as snake_beta.cu)
//   mode 2: out = residual + (y + bias[c])
// Each intermediate is rounded to T as the unfused tensors are, without fused multiply-adds.
//
// Replaces candle's broadcast add (an index computation per element for the [1, C, 1] bias) and the
// separate SnakeBeta / residual passes.
//
// Inputs: y rows at y + r * y_stride (r = b * channels + c; each `time` wide), bias [channels] (T),
// or, with phases > 1 (a transposed convolution's product [batch, channels * phases, time / phases]),
// output sample t of row r at y[(r * phases + t % phases) * y_stride + t / phases];
// frequency and inv_magnitude [channels] f32 (mode 1), residual [rows, time] contiguous (mode 2).
// Output out [rows, time] contiguous.
// Launch: grid (rows, ceil(time / EPILOGUE_THREADS)), block EPILOGUE_THREADS threads.
#include "common.cuh"

using namespace omnitts;

// MODE 0: y (no bias), 1: y + bias[c], 2: snake(y + bias[c]), 3: residual + (y + bias[c]); `y`
// already rounded to T, each intermediate rounded to T as the unfused tensors are.
template <typename T, int MODE>
static __device__ __forceinline__ float epilogue_value(float y, int c, const T* __restrict__ bias,
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


#define EPILOGUE_THREADS 256

template <typename T, int MODE>
__device__ void bias_epilogue(const T* __restrict__ y, long y_stride, const T* __restrict__ bias,
                              const float* __restrict__ frequency,
                              const float* __restrict__ inv_magnitude,
                              const T* __restrict__ residual, T* __restrict__ out, int channels,
                              int time, int phases) {
    const long row = blockIdx.x;
    const int t = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= time) return;
    const int c = (int)(row % channels);
    const long i = row * time + t;
    // MODE here: 0 bias, 1 bias + SnakeBeta, 2 bias + residual (epilogue_value's 1, 2, 3).
    const float r = MODE == 2 ? to_f(residual[i]) : 0.f;
    const long yi = (row * phases + t % phases) * y_stride + t / phases;
    out[i] = from_f<T>(epilogue_value<T, MODE + 1>(to_f(y[yi]), c, bias, frequency,
                                                   inv_magnitude, r));
}

#define BIAS_EPILOGUE_OP(T, MODE, NAME)                                                          \
    extern "C" __global__ void __launch_bounds__(EPILOGUE_THREADS)                              \
        NAME(const T* y, long y_stride, const T* bias, const float* frequency,                  \
             const float* inv_magnitude, const T* residual, T* out, int channels, int time,     \
             int phases) {                                                                       \
        bias_epilogue<T, MODE>(y, y_stride, bias, frequency, inv_magnitude, residual, out,      \
                               channels, time, phases);                                         \
    }

BIAS_EPILOGUE_OP(__nv_bfloat16, 0, bias_add_bf16)
BIAS_EPILOGUE_OP(float, 0, bias_add_f32)
BIAS_EPILOGUE_OP(__nv_bfloat16, 1, bias_snake_bf16)
BIAS_EPILOGUE_OP(float, 1, bias_snake_f32)
BIAS_EPILOGUE_OP(__nv_bfloat16, 2, bias_residual_bf16)
BIAS_EPILOGUE_OP(float, 2, bias_residual_f32)
