// Fused q/k head norms + RoPE + KV-cache write for a decode step of a Qwen3 attention layer.
//
// Replaces, per layer: q RMSNorm, q transpose copy, q RoPE, k RMSNorm, k transpose copy, k RoPE,
// and the two KV-cache writes (slice_set / scatter_set): 7-9 launches -> 1.
//
// Inputs (row r = batch * t + i of the projections; heads are contiguous runs of `hd` elements):
//   q, k, v      rows at q + r * q_stride (elements), heads h * hd .. h * hd + hd
//   q_w, k_w     [hd] RMSNorm weights (in T), or both null: no norm, RoPE only
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
#include "qk_norm_rope.cuh"

using namespace omnitts;

#define QK_NORM_ROPE_OP(T, NAME)                                                               \
    extern "C" __global__ void NAME(const T* q, const T* k, const T* v, int q_stride,           \
                                    int k_stride, int v_stride, const T* q_w, const T* k_w,     \
                                    const float* cos, const float* sin, const unsigned* pos_dev, \
                                    unsigned pos_host, T* q_out, T* k_cache, T* v_cache, int t,  \
                                    int nh, int nkv, int hd, int cap, float eps) {              \
        qk_norm_rope_kv<T>(q, k, v, q_stride, k_stride, v_stride, q_w, k_w, cos, sin, pos_dev,  \
                           pos_host, q_out, k_cache, v_cache, t, nh, nkv, hd, cap, eps,        \
                           blockIdx.x, blockIdx.y, blockIdx.z);                                 \
    }

QK_NORM_ROPE_OP(__nv_bfloat16, qk_norm_rope_kv_bf16)
QK_NORM_ROPE_OP(float, qk_norm_rope_kv_f32)
