// q/k head norms + RoPE + KV-cache write and the attention of a decode step in one launch: the
// two kernels `qk_norm_rope.cu` and `decode_attention.cu` chained inside each attention block,
// so a decoder layer on the one-row matmul path takes 5 launches instead of 6 (docs/cuda.md,
// "q/k norm + attention in one launch, and one launch per stack"). Bit-identical to the two kernels.
//
// Each block (query head h, row i, batch b) normalises and rotates its query row into q_rot,
// normalises, rotates and writes the keys and values of rows 0..=i of its kv head into the cache
// (blocks sharing a kv head write identical values), then attends over keys 0..=base + i.
//
// Inputs: q [batch, t, nh * hd], k / v [batch, t, nkv * hd] (rows at a fixed stride, e.g. views
// of one q/k/v output); q_w / k_w [hd] (both null: no head norm); f32 cos / sin
// [positions, hd / 2]; the position
// (pos_dev, else pos_host). Outputs: q_rot [batch, nh, t, hd] (scratch), k_cache / v_cache
// [batch, nkv, cap, hd] slots base..base + t, out [batch, t, nh * hd].
// Launch: grid (nh, t, batch), block 32, 64, 128 or ROPE_ATTN_THREADS (256) threads, at least
// hd / 2 (the same output at each), dynamic shared memory as decode_attention takes.
#include "rope_attention.cuh"

using namespace omnitts;

#define ROPE_ATTN_THREADS ATTN_THREADS

#define ROPE_ATTENTION_OP(T, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(ROPE_ATTN_THREADS)                            \
        NAME(const T* q, const T* k, const T* v, int q_stride, int k_stride, int v_stride,      \
             const T* q_w, const T* k_w, const float* cos, const float* sin,                    \
             const unsigned* pos_dev, unsigned pos_host, T* q_rot, T* k_cache, T* v_cache,      \
             T* out, int t, int nh, int nkv, int hd, int cap, int max_keys, float eps,          \
             float scale) {                                                                     \
        extern __shared__ float smem[];                                                         \
        rope_attention<T>(q, k, v, q_stride, k_stride, v_stride, q_w, k_w, cos, sin, pos_dev,   \
                          pos_host, q_rot, k_cache, v_cache, out, t, nh, nkv, hd, cap,          \
                          max_keys, eps, scale, smem, blockIdx.x, blockIdx.y, blockIdx.z);      \
    }

ROPE_ATTENTION_OP(__nv_bfloat16, rope_attention_bf16)
ROPE_ATTENTION_OP(float, rope_attention_f32)
