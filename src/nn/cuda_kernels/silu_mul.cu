// SwiGLU activation in one pass: out = silu(gate) * up, computed in f32 and rounded once to T.
//
// Replaces, per MLP: silu and the multiply (2 launches -> 1); with gate_proj and up_proj run as
// one matmul (weights concatenated), gate and up are the two halves of each row.
//
// Inputs: gate rows at gate + r * gate_stride, up rows at up + r * up_stride (elements), each
// `cols` wide. Output: out [rows, cols] contiguous.
// Launch: grid (ceil(cols / SILU_THREADS), rows), block SILU_THREADS threads.
#include "common.cuh"

using namespace omnitts;

#define SILU_THREADS 256

template <typename T>
__device__ void silu_mul(const T* __restrict__ gate, const T* __restrict__ up,
                         T* __restrict__ out, int gate_stride, int up_stride, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const long r = blockIdx.y;
    if (c >= cols) return;
    const float g = to_f(gate[r * gate_stride + c]);
    const float u = to_f(up[r * up_stride + c]);
    out[r * cols + c] = from_f<T>(g / (1.f + expf(-g)) * u);
}

#define SILU_MUL_OP(T, NAME)                                                                    \
    extern "C" __global__ void __launch_bounds__(SILU_THREADS)                                 \
        NAME(const T* gate, const T* up, T* out, int gate_stride, int up_stride, int cols) {    \
        silu_mul<T>(gate, up, out, gate_stride, up_stride, cols);                               \
    }

SILU_MUL_OP(__nv_bfloat16, silu_mul_bf16)
SILU_MUL_OP(float, silu_mul_f32)
