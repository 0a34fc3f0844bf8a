// Fused q/k head norms + RoPE + KV-cache write for a decode step of a Qwen3 attention layer.
//
// Replaces, per layer: q RMSNorm, q transpose copy, q RoPE, k RMSNorm, k transpose copy, k RoPE,
// and the two KV-cache writes (slice_set / scatter_set): 7-9 launches -> 1.
//
// Inputs (row r = batch * t + i of the projections; heads are contiguous runs of `hd` elements):
//   q, k, v      rows at q + r * q_stride (elements), heads h * hd .. h * hd + hd
//   q_w, k_w     [hd] RMSNorm weights (in T)
//   cos, sin     f32 RoPE tables [positions, hd / 2]; row p is position p
//   pos_dev      device u32 base position (nullptr: use pos_host); query i is at base + i
// Outputs:
//   q_out        [batch, nh, t, hd]      normed and rotated queries
//   k_cache      [batch, nkv, cap, hd]   slot base + i <- normed and rotated key
//   v_cache      [batch, nkv, cap, hd]   slot base + i <- value
// Numerics as the unfused candle path: the norm accumulates in f32 and rounds once to T after the
// weight multiply (candle's rms_norm); the tables are rounded to T first (the reference casts
// them to the activation dtype); the rotation runs in f32 and rounds once.
// Launch: grid (nh + 2 * nkv, t, batch), block hd / 2 threads (NeoX pairs j, j + hd / 2).
#include "common.cuh"

using namespace omnitts;

template <typename T>
__device__ void qk_norm_rope_kv(const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, int q_stride, int k_stride, int v_stride,
                                const T* __restrict__ q_w, const T* __restrict__ k_w,
                                const float* __restrict__ cos, const float* __restrict__ sin,
                                const unsigned* pos_dev, unsigned pos_host, T* __restrict__ q_out,
                                T* __restrict__ k_cache, T* __restrict__ v_cache, int t, int nh,
                                int nkv, int hd, int cap, float eps) {
    __shared__ float scratch[32];
    const int head = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
    const int half = hd / 2, j = threadIdx.x;
    const long row = (long)b * t + i;
    const unsigned p = base_position(pos_dev, pos_host) + (unsigned)i;
    const bool in_cache = p < (unsigned)cap;

    if (head >= nh + nkv) {  // value head: plain copy into the cache slot
        const int h = head - nh - nkv;
        if (!in_cache) return;
        const T* src = v + row * v_stride + (long)h * hd;
        T* dst = v_cache + (((long)b * nkv + h) * cap + p) * hd;
        dst[j] = src[j];
        dst[j + half] = src[j + half];
        return;
    }
    const bool is_q = head < nh;
    const int h = is_q ? head : head - nh;
    const T* src = is_q ? q + row * q_stride + (long)h * hd : k + row * k_stride + (long)h * hd;
    const T* w = is_q ? q_w : k_w;
    const float x1 = to_f(src[j]), x2 = to_f(src[j + half]);
    const float ss = block_sum(x1 * x1 + x2 * x2, scratch);
    const float scale = rsqrtf(ss / (float)hd + eps);
    const float n1 = round_to<T>(x1 * scale * to_f(w[j]));
    const float n2 = round_to<T>(x2 * scale * to_f(w[j + half]));
    const float c = round_to<T>(cos[(long)p * half + j]);
    const float s = round_to<T>(sin[(long)p * half + j]);
    const float o1 = n1 * c - n2 * s;
    const float o2 = n2 * c + n1 * s;
    T* dst;
    if (is_q) {
        dst = q_out + (((long)b * nh + h) * t + i) * hd;
    } else {
        if (!in_cache) return;
        dst = k_cache + (((long)b * nkv + h) * cap + p) * hd;
    }
    dst[j] = from_f<T>(o1);
    dst[j + half] = from_f<T>(o2);
}

#define QK_NORM_ROPE_OP(T, NAME)                                                               \
    extern "C" __global__ void NAME(const T* q, const T* k, const T* v, int q_stride,           \
                                    int k_stride, int v_stride, const T* q_w, const T* k_w,     \
                                    const float* cos, const float* sin, const unsigned* pos_dev, \
                                    unsigned pos_host, T* q_out, T* k_cache, T* v_cache, int t,  \
                                    int nh, int nkv, int hd, int cap, float eps) {              \
        qk_norm_rope_kv<T>(q, k, v, q_stride, k_stride, v_stride, q_w, k_w, cos, sin, pos_dev,  \
                           pos_host, q_out, k_cache, v_cache, t, nh, nkv, hd, cap, eps);        \
    }

QK_NORM_ROPE_OP(__nv_bfloat16, qk_norm_rope_kv_bf16)
QK_NORM_ROPE_OP(float, qk_norm_rope_kv_f32)
