// The talker's next input in one launch: the sum of one embedding row per codebook (the frame's
// 16 codes, each in its own table), in f32 in codebook order, rounded to T, plus the text row
// (rounded once more, as the unfused `sum.to_dtype(T) + text`).
//
// Replaces, per frame: 16 code uploads and index_selects, cat, two casts, the sum and the add
// (~37 eager launches and copies -> 1 upload + 1 launch).
//
// Inputs: codes [n] u32 (device); tables.ptr[i] = table i [rows_i, hidden] T contiguous (the host
// checked every code against its table); text [hidden] T. Output: out [hidden] T.
// Launch: grid ceil(hidden / EMBED_THREADS), block EMBED_THREADS.
//
// `embed_sum_rows_*`: the same for several rows at once (the batched frame graphs), codes
// [rows, n] u32, text [rows, hidden], out [rows, hidden]; grid (ceil(hidden / EMBED_THREADS),
// rows). Each row sums exactly as the one-row kernel does.
#include "common.cuh"

using namespace omnitts;

#define EMBED_THREADS 256
#define EMBED_MAX_TABLES 32

struct Tables {
    unsigned long long ptr[EMBED_MAX_TABLES];
};

template <typename T>
__device__ void embed_sum(const unsigned* __restrict__ codes, int n, Tables tables,
                          const T* __restrict__ text, int hidden, T* __restrict__ out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= hidden) return;
    float acc = 0.f;
    for (int i = 0; i < n; ++i) {
        const T* table = reinterpret_cast<const T*>(tables.ptr[i]);
        acc += to_f(table[(long)codes[i] * hidden + c]);
    }
    out[c] = from_f<T>(round_to<T>(acc) + to_f(text[c]));
}

#define EMBED_SUM_OP(T, NAME)                                                                   \
    extern "C" __global__ void __launch_bounds__(EMBED_THREADS)                                \
        NAME(const unsigned* codes, int n, Tables tables, const T* text, int hidden, T* out) {  \
        embed_sum<T>(codes, n, tables, text, hidden, out);                                      \
    }

EMBED_SUM_OP(__nv_bfloat16, embed_sum_bf16)
EMBED_SUM_OP(float, embed_sum_f32)

#define EMBED_SUM_ROWS_OP(T, NAME)                                                              \
    extern "C" __global__ void __launch_bounds__(EMBED_THREADS)                                \
        NAME(const unsigned* codes, int n, Tables tables, const T* text, int hidden, T* out) {  \
        const long r = blockIdx.y;                                                             \
        embed_sum<T>(codes + r * n, n, tables, text + r * hidden, hidden, out + r * hidden);    \
    }

EMBED_SUM_ROWS_OP(__nv_bfloat16, embed_sum_rows_bf16)
EMBED_SUM_ROWS_OP(float, embed_sum_rows_f32)
