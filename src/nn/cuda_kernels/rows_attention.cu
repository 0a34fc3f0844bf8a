// The talker's decode attention for several streams at once, each at its own position over its
// own KV cache: `rope_attention.cu` per row, with the row's cache buffers and position read from
// device tables, so one launch (and one CUDA graph) serves any mix of streams and lengths and a
// stream joins or leaves by changing a table entry, never by moving a cache.
//
// Each block (query head h, row r) runs `rope_attention` for row r alone (t = 1): q/k head norms
// and RoPE at positions[r], the key/value written into slot positions[r] of the row's caches,
// then attention over keys 0..=positions[r] (never past caps[r] or max_keys).
//
// Inputs: q [rows, nh * hd], k / v [rows, nkv * hd] (rows at a fixed stride, e.g. views of one
// q/k/v output); q_w / k_w [hd] (both null: no head norm); f32 cos / sin [positions, hd / 2];
// positions [rows] u32;
// caches [2, rows] u64: the device addresses of row r's key and value buffers
// [nkv, caps[r], hd] (one stream's `[1, nkv, cap, hd]` KV cache of this layer); caps [rows] u32.
// Outputs: q_rot [rows, nh, hd] (scratch), the caches' slot positions[r], out [rows, nh * hd].
// Launch: grid (nh, 1, rows), block 32, 64, 128 or ATTN_THREADS (256) threads, at least hd / 2,
// dynamic shared memory as decode_attention takes for max_keys.
#include "rope_attention.cuh"

using namespace omnitts;

#define ROWS_ATTENTION_OP(T, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_THREADS)                                 \
        NAME(const T* q, const T* k, const T* v, int q_stride, int k_stride, int v_stride,      \
             const T* q_w, const T* k_w, const float* cos, const float* sin,                    \
             const unsigned* positions, const unsigned long long* caches,                       \
             const unsigned* caps, T* q_rot, T* out, int nh, int nkv, int hd, int max_keys,     \
             float eps, float scale) {                                                          \
        extern __shared__ float smem[];                                                         \
        const int r = blockIdx.z, rows = gridDim.z;                                             \
        T* k_cache = reinterpret_cast<T*>(caches[r]);                                           \
        T* v_cache = reinterpret_cast<T*>(caches[rows + r]);                                    \
        rope_attention<T>(q + (long)r * q_stride, k + (long)r * k_stride, v + (long)r * v_stride, \
                          q_stride, k_stride, v_stride, q_w, k_w, cos, sin, positions + r, 0u,  \
                          q_rot + (long)r * nh * hd, k_cache, v_cache, out + (long)r * nh * hd, \
                          1, nh, nkv, hd, (int)caps[r], max_keys, eps, scale, smem, blockIdx.x, \
                          0, 0);                                                                \
    }

ROWS_ATTENTION_OP(__nv_bfloat16, rows_attention_bf16)
ROWS_ATTENTION_OP(float, rows_attention_f32)
