// The device function of `qk_norm_rope.cu` (its header comment has the contract), shared with
// the whole-stack kernel `decode_stack.cu`. `head`, `i`, `b`: the block's head, row and batch
// (blockIdx.x/y/z of a plain launch); blockDim.x >= hd / 2 (the extra threads idle).
#pragma once
#include "common.cuh"

namespace omnitts {

template <typename T>
__device__ void qk_norm_rope_kv(const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, int q_stride, int k_stride, int v_stride,
                                const T* __restrict__ q_w, const T* __restrict__ k_w,
                                const float* __restrict__ cos, const float* __restrict__ sin,
                                const unsigned* pos_dev, unsigned pos_host, T* __restrict__ q_out,
                                T* __restrict__ k_cache, T* __restrict__ v_cache, int t, int nh,
                                int nkv, int hd, int cap, float eps, int head, int i,
                                int b) {
    __shared__ float scratch[32];
    const int half = hd / 2, j = threadIdx.x;
    const bool lane = j < half;  // threads past hd / 2 (a wider block) only join the sum
    const long row = (long)b * t + i;
    const unsigned p = base_position(pos_dev, pos_host) + (unsigned)i;
    const bool in_cache = p < (unsigned)cap;

    if (head >= nh + nkv) {  // value head: plain copy into the cache slot
        const int h = head - nh - nkv;
        if (!in_cache || !lane) return;
        const T* src = v + row * v_stride + (long)h * hd;
        T* dst = v_cache + (((long)b * nkv + h) * cap + p) * hd;
        dst[j] = src[j];
        dst[j + half] = src[j + half];
        return;
    }
    const bool is_q = head < nh;
    const int h = is_q ? head : head - nh;
    const T* src = is_q ? q + row * q_stride + (long)h * hd : k + row * k_stride + (long)h * hd;
    // No norm weights (null): a stack without q/k norms, RoPE only.
    const T* w = is_q ? q_w : k_w;
    const float x1 = lane ? to_f(src[j]) : 0.f, x2 = lane ? to_f(src[j + half]) : 0.f;
    float n1 = x1, n2 = x2;
    if (w != nullptr) {
        const float ss = block_sum(x1 * x1 + x2 * x2, scratch);
        const float scale = rsqrtf(ss / (float)hd + eps);
        if (lane) {
            n1 = round_to<T>(x1 * scale * to_f(w[j]));
            n2 = round_to<T>(x2 * scale * to_f(w[j + half]));
        }
    }
    if (!lane) return;
    const float c = round_to<T>(cos[(long)p * half + j]);
    const float s = round_to<T>(sin[(long)p * half + j]);
    const float o1 = n1 * c - n2 * s;
    const float o2 = n2 * c + n1 * s;
    T* dst;
    if (is_q) {
        dst = q_out + (((long)b * nh + h) * t + i) * hd;
    } else {
        if (!in_cache) return;
        dst = k_cache + (((long)b * nkv + h) * cap + p) * hd;
    }
    dst[j] = from_f<T>(o1);
    dst[j + half] = from_f<T>(o2);
}

}  // namespace omnitts
