// The device function of `decode_attention.cu` (its header comment has the contract), shared
// with the whole-stack kernel `decode_stack.cu`. `smem`: the dynamic shared memory; `h`, `i`,
// `b`: the block's query head, row and batch (blockIdx.x/y/z of a plain launch).
//
// The block may have 32, 64, 128 or 256 threads (any divisor of ATTN_THREADS that is a multiple of
// 32): its sums follow the layout of ATTN_THREADS "virtual" threads whatever the block's size, each
// real thread doing the work of virtual threads tid, tid + blockDim.x, ..., so the output is bit
// for bit the same at every block size. A grid too large for one wave of 256-thread blocks with
// a short context (64 rows of the code predictor: 1,024 blocks, at most 17 keys) takes 64
// threads: a quarter of the instructions and of the barriers' waiting, and the whole grid in one
// wave (decode_attention.rs `block_threads`; docs/cuda.md, "Attention blocks sized to the grid").
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

    const int tid = threadIdx.x, threads = blockDim.x;
    const int kvh = h / (nh / nkv);
    const unsigned p = base_position(pos_dev, pos_host) + (unsigned)i;
    int n = (int)min(p + 1u, (unsigned)min(max_keys, cap));

    const T* qrow = q + (((long)b * nh + h) * t + i) * hd;
    for (int d = tid; d < hd; d += threads) sq[d] = to_f(qrow[d]);
    __syncthreads();

    const T* K = k_cache + ((long)b * nkv + kvh) * (long)cap * hd;
    const T* V = v_cache + ((long)b * nkv + kvh) * (long)cap * hd;

    // Scores: one key per thread per pass, 8 elements per load (a key's score does not depend on
    // which thread computes it).
    float local_max = -INFINITY;
    for (int j = tid; j < n; j += threads) {
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
    const float m = block_max(local_max, scratch);  // a maximum: the same in any order

    // Softmax weights and their sum as ATTN_THREADS threads make it: virtual thread vt adds keys
    // vt, vt + ATTN_THREADS, ... in order; a block of ATTN_THREADS threads then sums those with
    // block_sum, and a smaller one rebuilds block_sum's order from them (a warp sum per 32 virtual
    // threads, then a warp sum of those), every warp of the block computing it alike.
    float* vsum = partial;  // [ATTN_THREADS], free until the values below
    float own = 0.f;        // with ATTN_THREADS threads, this thread's (its only) virtual sum
    for (int vt = tid; vt < ATTN_THREADS; vt += threads) {
        float local_sum = 0.f;
        for (int j = vt; j < n; j += ATTN_THREADS) {
            const float e = expf(scores[j] - m);
            scores[j] = e;
            local_sum += e;
        }
        vsum[vt] = local_sum;
        own = local_sum;
    }
    float total;
    if (threads == ATTN_THREADS) {
        total = block_sum(own, scratch);  // also orders the score writes
    } else {
        __syncthreads();
        const int lane = tid & 31;
        float mine = 0.f;
#pragma unroll
        for (int w = 0; w < ATTN_THREADS / 32; ++w) {
            const float v = warp_sum(vsum[w * 32 + lane]);
            if (lane == w) mine = v;
        }
        total = warp_sum(mine);
        __syncthreads();  // every warp has read vsum before the values overwrite it
    }
    const float inv = total > 0.f ? 1.f / total : 0.f;

    // Values: `lanes` virtual threads cover one row (8 elements each); `groups` rows at a time.
    const int lanes = hd / 8;
    const int groups = ATTN_THREADS / lanes;
    for (int vt = tid; vt < ATTN_THREADS; vt += threads) {
        const int g = vt / lanes, c = (vt % lanes) * 8;
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
        for (int e = 0; e < 8; ++e) partial[vt * 8 + e] = acc[e];
    }
    __syncthreads();
    T* orow = out + ((long)b * t + i) * (long)nh * hd + (long)h * hd;
    for (int d = tid; d < hd; d += threads) {
        const int lane8 = d / 8, e = d % 8;
        float sum = 0.f;
        for (int gg = 0; gg < groups; ++gg) sum += partial[(gg * lanes + lane8) * 8 + e];
        orow[d] = from_f<T>(sum * inv);
    }
}

}  // namespace omnitts
