// The device function of `rope_attention.cu` (its header comment has the contract), shared with
// the whole-stack kernel `decode_stack.cu`. `smem`: the dynamic shared memory (as
// decode_attention takes); `h`, `i`, `b`: the block's query head, row and batch.
#pragma once
#include "decode_attention.cuh"
#include "qk_norm_rope.cuh"

namespace omnitts {

template <typename T>
__device__ void rope_attention(const T* __restrict__ q, const T* __restrict__ k,
                               const T* __restrict__ v, int q_stride, int k_stride, int v_stride,
                               const T* __restrict__ q_w, const T* __restrict__ k_w,
                               const float* __restrict__ cos, const float* __restrict__ sin,
                               const unsigned* pos_dev, unsigned pos_host, T* q_rot, T* k_cache,
                               T* v_cache, T* out, int t, int nh, int nkv, int hd, int cap,
                               int max_keys, float eps, float scale, float* smem, int h, int i,
                               int b) {
    const int kvh = h / (nh / nkv);
    // The query row, then the new keys / values this row attends to (rows 0..=i of its kv head).
    // Blocks sharing a kv head write the same values to the same slots, and each reads only slots
    // it wrote itself or that were written before the launch.
    qk_norm_rope_kv<T>(q, k, v, q_stride, k_stride, v_stride, q_w, k_w, cos, sin, pos_dev,
                       pos_host, q_rot, k_cache, v_cache, t, nh, nkv, hd, cap, eps, h, i, b);
    for (int r = 0; r <= i; ++r) {
        for (int kv = 0; kv < 2; ++kv) {
            __syncthreads();  // the norm's shared scratch is free again
            qk_norm_rope_kv<T>(q, k, v, q_stride, k_stride, v_stride, q_w, k_w, cos, sin, pos_dev,
                               pos_host, q_rot, k_cache, v_cache, t, nh, nkv, hd, cap, eps,
                               nh + kv * nkv + kvh, r, b);
        }
    }
    __syncthreads();  // the query and cache writes above are visible to the whole block
    decode_attention<T>(q_rot, k_cache, v_cache, out, pos_dev, pos_host, t, nh, nkv, hd, cap,
                        max_keys, scale, smem, h, i, b);
}

}  // namespace omnitts
