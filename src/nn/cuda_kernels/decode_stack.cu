// A whole Qwen3 decoder stack's decode step in one launch: for every layer, the six kernels of the
// one-row matmul path (`DecoderLayer::forward_gemv` in src/nn/transformer.rs) run as five phases
// of one persistent kernel, separated by grid-wide barriers instead of kernel launches:
//
//   1. qkv  = norm(s) Wqkv^T                  (gemv_norm)
//   2. q/k head norms + RoPE, k/v cache writes, then
//      a    = attention over the cache          (rope_attention), one block per query head
//   3. h    = s + a Wo^T                        (gemv_residual)
//   4. act  = silu(norm(h) G^T) * (norm(h) U^T) (gemv_norm_silu)
//   5. s'   = h + act Wdown^T                   (gemv_residual)
//
// with s the residual stream (the input `x` for layer 0, then `out`). Each phase calls the same
// device function as the per-layer kernels, with the same work split (`wpr` from the launcher),
// so the output is bit-identical to the per-layer path: only the launches go (docs/cuda.md,
// "q/k norm + attention in one launch, and one launch per stack").
//
// Inputs: x [rows, hidden] (rows = batch * t, t <= GEMV_MAX_ROWS), the per-layer weight and
// cache addresses in `StackLayers` (layouts as the per-layer kernels take them), f32 RoPE tables
// cos/sin [positions, hd / 2], the position (pos_dev or dims.pos_host). Scratch (T, written before
// read): qkv [rows, (nh + 2 nkv) hd] | q [batch, nh, t, hd] | a [rows, nh hd] | h [rows, hidden] |
// act [rows, inter], each part starting at a multiple of 8 elements. Output: out [rows, hidden].
// `barrier`: two u32 zeroed once by the owner; they return to a valid state after every launch,
// and no two launches may use them at the same time.
//
// Launch: grid <= the blocks the GPU holds at once (SMs x occupancy, so every block runs and the
// barrier cannot deadlock), block STACK_THREADS, dynamic shared memory as decode_attention takes.
#include "gemv.cuh"
#include "rope_attention.cuh"

using namespace omnitts;

#define STACK_THREADS 256
#define STACK_MAX_LAYERS 40

// One layer's device addresses (T elements).
struct LayerPtrs {
    const void* input_norm;  // [hidden]
    const void* qkv;         // [(nh + 2 nkv) hd, hidden]
    const void* q_norm;      // [hd]
    const void* k_norm;      // [hd]
    const void* o;           // [hidden, nh hd]
    const void* post_norm;   // [hidden]
    const void* gate_up;     // [2 inter, hidden]
    const void* down;        // [hidden, inter]
    void* k_cache;           // [batch, nkv, cap, hd]
    void* v_cache;           // [batch, nkv, cap, hd]
};
struct StackLayers {
    LayerPtrs layer[STACK_MAX_LAYERS];
};
struct StackDims {
    int layers, batch, t, hidden, nh, nkv, hd, inter, cap, max_keys;
    int wpr_qkv, wpr_o, wpr_gate_up, wpr_down;  // warps per output row of each matmul
    unsigned pos_host;
    float eps, qk_eps, scale;
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Grid-wide barrier: bar[0] counts arrivals, bar[1] is the generation. The last block to arrive
// resets the count and opens the next generation; the others wait for it. Every block's writes
// before the barrier are visible to every block after it.
__device__ __forceinline__ void grid_sync(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned gen = load_acquire(bar + 1);  // cannot move on before this block arrives
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (load_acquire(bar + 1) == gen) __nanosleep(20);
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ long align8(long n) { return (n + 7) & ~7L; }

template <typename T>
__device__ void decode_stack(const StackLayers& L, const StackDims& d, const T* __restrict__ x,
                             T* __restrict__ out, T* __restrict__ scratch, const float* cos,
                             const float* sin, const unsigned* pos_dev, unsigned* bar) {
    extern __shared__ float smem[];
    const int rows = d.batch * d.t;
    const int q_w = d.nh * d.hd, kv_w = d.nkv * d.hd, qkv_n = q_w + 2 * kv_w;
    T* qkv = scratch;
    T* q = qkv + align8((long)rows * qkv_n);
    T* a = q + align8((long)rows * q_w);
    T* h = a + align8((long)rows * q_w);
    T* act = h + align8((long)rows * d.hidden);
    const int tiles_qkv = (qkv_n * d.wpr_qkv + GEMV_WARPS - 1) / GEMV_WARPS;
    const int tiles_o = (d.hidden * d.wpr_o + GEMV_WARPS - 1) / GEMV_WARPS;
    const int tiles_gu = (d.inter * d.wpr_gate_up + GEMV_WARPS - 1) / GEMV_WARPS;
    const int tiles_down = (d.hidden * d.wpr_down + GEMV_WARPS - 1) / GEMV_WARPS;

    for (int l = 0; l < d.layers; ++l) {
        const LayerPtrs& w = L.layer[l];
        const T* s = l == 0 ? x : out;
        T* kc = reinterpret_cast<T*>(w.k_cache);
        T* vc = reinterpret_cast<T*>(w.v_cache);
        for (int b = blockIdx.x; b < tiles_qkv; b += gridDim.x)
            gemv<T, true, EPI_PLAIN>(s, (const T*)w.input_norm, d.eps, (const T*)w.qkv, s, qkv,
                                     rows, d.hidden, qkv_n, d.wpr_qkv, b);
        grid_sync(bar);
        for (int b = blockIdx.x; b < d.nh * rows; b += gridDim.x) {
            const int head = b % d.nh, row = b / d.nh;
            rope_attention<T>(qkv, qkv + q_w, qkv + q_w + kv_w, qkv_n, qkv_n, qkv_n,
                              (const T*)w.q_norm, (const T*)w.k_norm, cos, sin, pos_dev,
                              d.pos_host, q, kc, vc, a, d.t, d.nh, d.nkv, d.hd, d.cap, d.max_keys,
                              d.qk_eps, d.scale, smem, head, row % d.t, row / d.t);
        }
        grid_sync(bar);
        for (int b = blockIdx.x; b < tiles_o; b += gridDim.x)
            gemv<T, false, EPI_RESIDUAL>(a, a, 0.f, (const T*)w.o, s, h, rows, q_w, d.hidden,
                                         d.wpr_o, b);
        grid_sync(bar);
        for (int b = blockIdx.x; b < tiles_gu; b += gridDim.x)
            gemv<T, true, EPI_SILU>(h, (const T*)w.post_norm, d.eps, (const T*)w.gate_up, h, act,
                                    rows, d.hidden, d.inter, d.wpr_gate_up, b);
        grid_sync(bar);
        for (int b = blockIdx.x; b < tiles_down; b += gridDim.x)
            gemv<T, false, EPI_RESIDUAL>(act, act, 0.f, (const T*)w.down, h, out, rows, d.inter,
                                         d.hidden, d.wpr_down, b);
        if (l + 1 < d.layers) grid_sync(bar);
    }
}

// Diagnostic: `count` grid barriers and nothing else (the launcher times it: the cost of one
// barrier at a grid size).
extern "C" __global__ void __launch_bounds__(STACK_THREADS, 2)
    grid_barrier_bench(unsigned* barrier, int count) {
    for (int i = 0; i < count; ++i) grid_sync(barrier);
}

#define DECODE_STACK_OP(T, NAME)                                                               \
    extern "C" __global__ void __launch_bounds__(STACK_THREADS, 2)                             \
        NAME(const StackLayers layers, const StackDims dims, const T* x, T* out, T* scratch,    \
             const float* cos, const float* sin, const unsigned* pos_dev, unsigned* barrier) {  \
        decode_stack<T>(layers, dims, x, out, scratch, cos, sin, pos_dev, barrier);             \
    }

DECODE_STACK_OP(__nv_bfloat16, decode_stack_bf16)
DECODE_STACK_OP(float, decode_stack_f32)
