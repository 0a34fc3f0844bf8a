// The one-row matmul device function of `gemv.cu` (its header comment has the contract), shared
// with the whole-stack kernel `decode_stack.cu`. `bid`: the output tile (blockIdx.x of a plain
// launch).
#pragma once
#include "common.cuh"

namespace omnitts {

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_MAX_ROWS 4

enum Epilogue { EPI_PLAIN = 0, EPI_RESIDUAL = 1, EPI_SILU = 2, EPI_LOGITS = 3, EPI_BIAS = 4 };

template <typename T, bool NORM, int EPI>
__device__ void gemv(const T* __restrict__ x, const T* __restrict__ w_norm, float eps,
                     const T* __restrict__ W, const T* __restrict__ res, void* __restrict__ out_,
                     int rows, int k, int n, int wpr, int bid) {
    T* out = reinterpret_cast<T*>(out_);
    __shared__ float scratch[32];
    __shared__ float scale[GEMV_MAX_ROWS];
    __shared__ float partial[GEMV_WARPS][GEMV_MAX_ROWS][2];
    __syncthreads();  // a block running several output tiles: the last tile's reads are done

    // RMS statistics of each input row (every block recomputes them: k values, from L2).
    if (NORM) {
        for (int m = 0; m < rows; ++m) {
            float ss = 0.f;
            for (int c = threadIdx.x; c < k; c += blockDim.x) {
                const float f = to_f(x[(long)m * k + c]);
                ss += f * f;
            }
            const float total = block_sum(ss, scratch);
            if (threadIdx.x == 0) scale[m] = rsqrtf(total / (float)k + eps);
        }
        __syncthreads();
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_block = GEMV_WARPS / wpr;
    const int j = bid * per_block + warp / wpr;  // output element of this warp
    const int part = warp % wpr;                         // its share of k
    const bool live = j < n;

    float acc[GEMV_MAX_ROWS][2];
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) acc[m][0] = acc[m][1] = 0.f;

    if (live) {
        const T* wa = W + (long)j * k;
        const T* wb = EPI == EPI_SILU ? W + (long)(j + n) * k : wa;  // the up row (silu only)
#pragma unroll 4
        for (int c = (part * 32 + lane) * 8; c < k; c += wpr * 256) {
            float wv[8], ub[8];
            load8(wa + c, wv);
            if (EPI == EPI_SILU) load8(wb + c, ub);
            float nw[8];
            if (NORM) load8(w_norm + c, nw);
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                if (m < rows) {
                    float xv[8];
                    load8(x + (long)m * k + c, xv);
                    if (NORM) {
                        const float s = scale[m];
#pragma unroll
                        for (int i = 0; i < 8; ++i) xv[i] = round_to<T>(xv[i] * s * nw[i]);
                    }
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        acc[m][0] = fmaf(xv[i], wv[i], acc[m][0]);
                        if (EPI == EPI_SILU) acc[m][1] = fmaf(xv[i], ub[i], acc[m][1]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
        acc[m][0] = warp_sum(acc[m][0]);
        if (EPI == EPI_SILU) acc[m][1] = warp_sum(acc[m][1]);
    }
    if (wpr > 1) {
        if (lane == 0) {
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                partial[warp][m][0] = acc[m][0];
                partial[warp][m][1] = acc[m][1];
            }
        }
        __syncthreads();
        if (part != 0) return;
        for (int p = 1; p < wpr; ++p) {
#pragma unroll
            for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
                acc[m][0] += partial[warp + p][m][0];
                acc[m][1] += partial[warp + p][m][1];
            }
        }
    }
    if (!live || lane != 0) return;
#pragma unroll
    for (int m = 0; m < GEMV_MAX_ROWS; ++m) {
        if (m >= rows) break;
        const long o = (long)m * n + j;
        if (EPI == EPI_PLAIN) {
            out[o] = from_f<T>(acc[m][0]);
        } else if (EPI == EPI_LOGITS) {
            reinterpret_cast<float*>(out_)[o] = round_to<T>(acc[m][0]);
        } else if (EPI == EPI_RESIDUAL) {
            out[o] = from_f<T>(to_f(res[o]) + round_to<T>(acc[m][0]));
        } else if (EPI == EPI_BIAS) {
            out[o] = from_f<T>(round_to<T>(acc[m][0]) + to_f(res[j]));
        } else {
            const float g = round_to<T>(acc[m][0]);
            const float u = round_to<T>(acc[m][1]);
            out[o] = from_f<T>(g / (1.f + expf(-g)) * u);
        }
    }
}

}  // namespace omnitts
