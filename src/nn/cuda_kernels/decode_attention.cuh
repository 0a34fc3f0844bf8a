// The device function of `decode_attention.cu` (its header comment has the contract), shared
// with the whole-stack kernel `decode_stack.cu`. `smem`: the dynamic shared memory; `h`, `i`,
// `b`: the block's query head, row and batch (blockIdx.x/y/z of a plain launch).
#pragma once
#include "common.cuh"

namespace omnitts {

#define ATTN_THREADS 256

template <typename T>
__device__ void decode_attention(const T* __restrict__ q, const T* __restrict__ k_cache,
                                 const T* __restrict__ v_cache, T* __restrict__ out,
                                 const unsigned* pos_dev, unsigned pos_host, int t, int nh,
                                 int nkv, int hd, int cap, int max_keys, float scale,
                                 float* smem, int h, int i, int b) {
    __syncthreads();  // a block running several heads: the last head's reads of `smem` are done
    float* scores = smem;                    // [max_keys]
    float* sq = scores + max_keys;           // [hd]
    float* partial = sq + hd;                // [ATTN_THREADS * 8]
    float* scratch = partial + ATTN_THREADS * 8;  // [32]

    const int tid = threadIdx.x;
    const int kvh = h / (nh / nkv);
    const unsigned p = base_position(pos_dev, pos_host) + (unsigned)i;
    int n = (int)min(p + 1u, (unsigned)min(max_keys, cap));

    const T* qrow = q + (((long)b * nh + h) * t + i) * hd;
    for (int d = tid; d < hd; d += ATTN_THREADS) sq[d] = to_f(qrow[d]);
    __syncthreads();

    const T* K = k_cache + ((long)b * nkv + kvh) * (long)cap * hd;
    const T* V = v_cache + ((long)b * nkv + kvh) * (long)cap * hd;

    // Scores: one key per thread per pass, 8 elements per load.
    float local_max = -INFINITY;
    for (int j = tid; j < n; j += ATTN_THREADS) {
        const T* krow = K + (long)j * hd;
        float acc = 0.f;
        for (int d = 0; d < hd; d += 8) {
            float kv[8];
            load8(krow + d, kv);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc += sq[d + e] * kv[e];
        }
        const float s = acc * scale;
        scores[j] = s;
        local_max = fmaxf(local_max, s);
    }
    const float m = block_max(local_max, scratch);
    float local_sum = 0.f;
    for (int j = tid; j < n; j += ATTN_THREADS) {
        const float e = expf(scores[j] - m);
        scores[j] = e;
        local_sum += e;
    }
    const float total = block_sum(local_sum, scratch);  // also orders the score writes
    const float inv = total > 0.f ? 1.f / total : 0.f;

    // Values: `lanes` threads cover one row (8 elements each); `groups` rows at a time.
    const int lanes = hd / 8;
    const int groups = ATTN_THREADS / lanes;
    const int g = tid / lanes, c = (tid % lanes) * 8;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    if (g < groups) {
        for (int j = g; j < n; j += groups) {
            float vv[8];
            load8(V + (long)j * hd + c, vv);
            const float w = scores[j];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] += w * vv[e];
        }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) partial[tid * 8 + e] = acc[e];
    __syncthreads();
    T* orow = out + ((long)b * t + i) * (long)nh * hd + (long)h * hd;
    for (int d = tid; d < hd; d += ATTN_THREADS) {
        const int lane = d / 8, e = d % 8;
        float sum = 0.f;
        for (int gg = 0; gg < groups; ++gg) sum += partial[(gg * lanes + lane) * 8 + e];
        orow[d] = from_f<T>(sum * inv);
    }
}

}  // namespace omnitts
