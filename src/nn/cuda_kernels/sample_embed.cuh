// The device functions of `sample_embed.cu` (its header comment has the contract), shared with
// the row-batched pick kernel `pick_rows.cu`. One block picks one row.
#pragma once
#include "common.cuh"

namespace omnitts {

#define SAMPLE_THREADS 1024
#define SAMPLE_MAX_VOCAB 4096

// Exclusive prefix sum of one value per thread over the block, and the block total (every
// thread gets both). `warp_sums`: 32 doubles of shared memory.
__device__ __forceinline__ double block_exclusive_scan(double v, double* warp_sums,
                                                       double* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    double incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
    }
    __syncthreads();
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    double before = 0.0, all = 0.0;
    for (int w = 0; w < warps; ++w) {
        if (w < warp) before += warp_sums[w];
        all += warp_sums[w];
    }
    *total = all;
    return before + incl - v;
}

// Inverse-CDF count over `vocab` probabilities p (in the order given by `at`), ITEMS consecutive
// per thread: how many inclusive cumulative sums are <= threshold(total). Every thread gets it.
template <typename At, typename Threshold>
__device__ int count_cum_le(int vocab, At at, Threshold threshold, double* warp_sums,
                            float* scratch) {
    const int items = (vocab + blockDim.x - 1) / blockDim.x;
    const int first = threadIdx.x * items;
    double mine = 0.0;
    for (int e = 0; e < items; ++e)
        if (first + e < vocab) mine += (double)at(first + e);
    double total;
    double run = block_exclusive_scan(mine, warp_sums, &total);
    const double thr = threshold(total);
    int count = 0;
    for (int e = 0; e < items; ++e) {
        if (first + e < vocab) {
            run += (double)at(first + e);
            if (run <= thr) ++count;
        }
    }
    return (int)block_sum((float)count, scratch);  // exact: counts <= 4096
}

template <typename T>
__device__ void sample_embed(const float* __restrict__ logits, int vocab,
                             const double* __restrict__ params, int step,
                             const T* __restrict__ table, int hidden, unsigned* __restrict__ id,
                             T* __restrict__ x) {
    __shared__ float scaled[SAMPLE_MAX_VOCAB];  // logits / temperature, index order
    __shared__ float sorted[SAMPLE_MAX_VOCAB];  // ascending, padded with +inf to a power of two
    __shared__ double warp_sums[32];
    __shared__ float scratch[32];
    __shared__ int last_nonzero;
    const int tid = threadIdx.x, nt = blockDim.x;
    const float temperature = (float)params[0];
    const int kidx = min(max((int)params[1], 0), vocab - 1);
    const double cut = params[2];
    const double u = params[3 + step];

    int padded = 1;
    while (padded < vocab) padded <<= 1;
    for (int i = tid; i < padded; i += nt) {
        const float l = i < vocab ? logits[i] / temperature : INFINITY;
        if (i < vocab) scaled[i] = l;
        sorted[i] = l;
    }
    if (tid == 0) last_nonzero = 0;
    __syncthreads();
    // Bitonic sort, ascending.
    for (int k = 2; k <= padded; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < padded; i += nt) {
                const int o = i ^ j;
                if (o > i) {
                    const float a = sorted[i], b = sorted[o];
                    if ((a > b) == ((i & k) == 0)) {
                        sorted[i] = b;
                        sorted[o] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    // top-k: keep values >= the k-th largest.
    const float thr_k = sorted[kidx];
    const float top = sorted[vocab - 1];
    // top-p over the kept values in ascending order: drop the prefix whose cumulative
    // probability is <= cut, never the last; the first kept value is the threshold.
    float part = 0.f;
    for (int j = tid; j < vocab; j += nt)
        if (sorted[j] >= thr_k) part += expf(sorted[j] - top);
    const float sum_k = block_sum(part, scratch);
    auto p_sorted = [&](int j) {
        return sorted[j] >= thr_k ? expf(sorted[j] - top) / sum_k : 0.f;
    };
    int dropped = count_cum_le(vocab, p_sorted, [&](double) { return cut; }, warp_sums, scratch);
    if (dropped > vocab - 1) dropped = vocab - 1;
    const float thr_p = sorted[dropped] >= thr_k ? sorted[dropped] : -INFINITY;
    const float thr = fmaxf(thr_k, thr_p);
    // Inverse CDF in index order over the kept logits.
    part = 0.f;
    for (int i = tid; i < vocab; i += nt)
        if (scaled[i] >= thr) part += expf(scaled[i] - top);
    const float sum = block_sum(part, scratch);
    auto p_index = [&](int i) { return scaled[i] >= thr ? expf(scaled[i] - top) / sum : 0.f; };
    for (int i = tid; i < vocab; i += nt)
        if (p_index(i) > 0.f) atomicMax(&last_nonzero, i);
    __syncthreads();
    int below = count_cum_le(vocab, p_index, [&](double total) { return u * total; }, warp_sums,
                             scratch);
    const int chosen = below < last_nonzero ? below : last_nonzero;
    if (tid == 0) *id = (unsigned)chosen;
    const long row = (long)chosen * hidden;
    for (int c = tid; c < hidden; c += nt) x[c] = table[row + c];
}

}  // namespace omnitts
