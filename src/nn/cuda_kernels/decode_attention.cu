// Decode attention over a KV cache: softmax(q k^T * scale) v for a few query rows, with the
// causal limit read from the (device or host) position, scores and softmax in f32.
//
// Replaces, per layer: QK^T matmul, scale, cast to f32, mask add, softmax, cast back, V copy,
// PV matmul, output transpose copy: ~9 launches -> 1. Keys past the position are never read, so
// a CUDA-graph bucket costs nothing beyond the live positions.
//
// Inputs:
//   q        [batch, nh, t, hd]     (query i at position base + i)
//   k_cache  [batch, nkv, cap, hd], v_cache likewise; query head h uses kv head h / (nh / nkv)
//   pos_dev  device u32 base position (nullptr: pos_host)
//   max_keys keys a row may see at most (the dynamic shared memory holds this many scores)
// Output: out [batch, t, nh * hd] (the layout o_proj takes), rounded once to T.
// Query i sees keys 0 ..= base + i (capped at max_keys and cap).
// Launch: grid (nh, t, batch), block 32, 64, 128 or ATTN_THREADS (256) threads (the same output at
//   each), dynamic shared memory (max_keys + hd + ATTN_THREADS * 8 + 32) * 4 bytes. Needs
//   hd % 8 == 0, hd <= 8 * ATTN_THREADS, ATTN_THREADS % (hd / 8) == 0, and 16-byte aligned rows.
#include "decode_attention.cuh"

using namespace omnitts;

#define DECODE_ATTENTION_OP(T, NAME)                                                           \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                 \
        NAME(const T* q, const T* k_cache, const T* v_cache, T* out, const unsigned* pos_dev,   \
             unsigned pos_host, int t, int nh, int nkv, int hd, int cap, int max_keys,          \
             float scale) {                                                                     \
        extern __shared__ float smem[];                                                         \
        decode_attention<T>(q, k_cache, v_cache, out, pos_dev, pos_host, t, nh, nkv, hd, cap,   \
                            max_keys, scale, smem, blockIdx.x, blockIdx.y, blockIdx.z);         \
    }

DECODE_ATTENTION_OP(__nv_bfloat16, decode_attention_bf16)
DECODE_ATTENTION_OP(float, decode_attention_f32)
