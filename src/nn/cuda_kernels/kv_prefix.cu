// Copies a prefill's keys and values from the prefill graphs' scratch KV cache into a stream's own
// KV cache, every layer in one launch (models/qwen3_tts/graphs/prefill.rs).
//
// Each buffer is one layer's keys or values, [kv_heads, capacity, head_dim] contiguous (batch 1);
// a position's row is `row_words` 32-bit words (head_dim elements of 2 or 4 bytes). For buffer b,
// head h and position p < count: dst[b][h][p][:] = src[b][h][p][:].
//
// Inputs: src, dst: device tables of `buffers` buffer addresses (int64); kv_heads; the buffers'
// capacities in positions (src_cap, dst_cap); count (positions to copy, <= both capacities);
// row_words.
// Launch: grid (buffers, kv_heads, count), block min(row_words, KV_PREFIX_THREADS) threads.
#define KV_PREFIX_THREADS 128

extern "C" __global__ void __launch_bounds__(KV_PREFIX_THREADS)
    kv_prefix_copy(const long long* __restrict__ src, const long long* __restrict__ dst,
                   int kv_heads, int src_cap, int dst_cap, int row_words) {
    const int b = blockIdx.x;
    const int h = blockIdx.y;
    const int p = blockIdx.z;
    const unsigned* s =
        reinterpret_cast<const unsigned*>(src[b]) + ((long)h * src_cap + p) * row_words;
    unsigned* d = reinterpret_cast<unsigned*>(dst[b]) + ((long)h * dst_cap + p) * row_words;
    for (int i = threadIdx.x; i < row_words; i += blockDim.x) d[i] = s[i];
}
