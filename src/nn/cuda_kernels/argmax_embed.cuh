// The device function of `argmax_embed.cu` (its header comment has the contract), shared with
// the row-batched pick kernel `pick_rows.cu`. One block picks one row.
#pragma once
#include "common.cuh"

namespace omnitts {

#define ARGMAX_THREADS 1024

template <typename T>
__device__ void argmax_embed(const float* __restrict__ logits, int vocab,
                             const T* __restrict__ table, int hidden, unsigned* __restrict__ id,
                             T* __restrict__ x) {
    __shared__ float best_v[ARGMAX_THREADS / 32];
    __shared__ int best_i[ARGMAX_THREADS / 32];
    __shared__ int chosen;
    // Per thread: the best (value, smallest index) of its strided share.
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float v = logits[i];
        if (v > bv || (v == bv && i < bi)) {
            bv = v;
            bi = i;
        }
    }
    // Warp, then block: larger value wins, equal values take the smaller index.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        for (int w = 1; w < warps; ++w) {
            if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) {
                bv = best_v[w];
                bi = best_i[w];
            }
        }
        if (bi >= vocab) bi = vocab - 1;  // only NaN logits: stay in range
        chosen = bi;
        *id = (unsigned)bi;
    }
    __syncthreads();
    const long row = (long)chosen * hidden;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) x[c] = table[row + c];
}

}  // namespace omnitts
