// SnakeBeta activation of the Code2Wav decoder in one pass (reference: `SnakeBeta` in
// src/nn/snake_beta.rs): out = x + inv_magnitude[c] * sin(x * frequency[c])^2, computed in f32 with
// the tensor path's roundings (no fused multiply-adds) and rounded once to T.
//
// Replaces five elementwise passes (mul, sin, sqr, mul, add) over a [batch, channels, time]
// activation: at the decoder's 24 kHz end each pass moves ~9 MB per second of audio per row.
//
// Inputs: x [rows = batch * channels, time] contiguous (T = bf16 or f32); frequency and
// inv_magnitude [channels] f32. Output out [rows, time] contiguous.
// Launch: grid (rows, ceil(time / SNAKE_THREADS)), block SNAKE_THREADS threads.
#include "common.cuh"

using namespace omnitts;

#define SNAKE_THREADS 256

template <typename T>
__device__ void snake_beta(const T* __restrict__ x, const float* __restrict__ frequency,
                           const float* __restrict__ inv_magnitude, T* __restrict__ out,
                           int channels, int time) {
    const long row = blockIdx.x;
    const int t = blockIdx.y * blockDim.x + threadIdx.x;
    if (t >= time) return;
    const int c = (int)(row % channels);
    const long i = row * time + t;
    const float v = to_f(x[i]);
    const float s = sinf(__fmul_rn(v, frequency[c]));
    out[i] = from_f<T>(__fadd_rn(v, __fmul_rn(__fmul_rn(s, s), inv_magnitude[c])));
}

#define SNAKE_BETA_OP(T, NAME)                                                                   \
    extern "C" __global__ void __launch_bounds__(SNAKE_THREADS)                                 \
        NAME(const T* x, const float* frequency, const float* inv_magnitude, T* out, int channels, \
             int time) {                                                                         \
        snake_beta<T>(x, frequency, inv_magnitude, out, channels, time);                         \
    }

SNAKE_BETA_OP(__nv_bfloat16, snake_beta_bf16)
SNAKE_BETA_OP(float, snake_beta_f32)
