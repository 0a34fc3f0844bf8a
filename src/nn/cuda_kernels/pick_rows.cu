// The code predictor's pick for several rows at once (one block a row): each row's code chosen
// greedily or sampled with its own parameters, written into that row's column of a codes matrix,
// and its embedding row copied out as the row's next input. The batched frame graphs'
// counterpart of `argmax_embed.cu` and `sample_embed.cu`, whose device functions it runs, so a row
// picks exactly what the one-row kernels pick for it.
//
// Inputs: logits [rows, vocab] f32 (vocab <= SAMPLE_MAX_VOCAB); params [rows, params_stride] f64,
// each row as `sample_embed.cu` reads it ([temperature, top-k index, top-p cut, one uniform per
// step]), a temperature <= 0 marking a greedy row (the argmax of `argmax_embed.cu`); step; table
// [vocab, hidden] T contiguous (null when hidden = 0: no copy). Outputs: ids[r * ids_stride]
// u32 (the caller offsets `ids` to the step's column); x [rows, hidden] T.
// Launch: grid rows, block SAMPLE_THREADS (= ARGMAX_THREADS).
#include "argmax_embed.cuh"
#include "sample_embed.cuh"

using namespace omnitts;

#define PICK_ROWS_OP(T, NAME)                                                                  \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                               \
        NAME(const float* logits, int vocab, const double* params, int params_stride, int step, \
             const T* table, int hidden, unsigned* ids, int ids_stride, T* x) {                 \
        const int r = blockIdx.x;                                                              \
        const double* p = params + (long)r * params_stride;                                    \
        const float* l = logits + (long)r * vocab;                                             \
        T* xr = hidden > 0 ? x + (long)r * hidden : x;                                         \
        if (p[0] <= 0.0)                                                                       \
            argmax_embed<T>(l, vocab, table, hidden, ids + (long)r * ids_stride, xr);          \
        else                                                                                   \
            sample_embed<T>(l, vocab, p, step, table, hidden, ids + (long)r * ids_stride, xr); \
    }

PICK_ROWS_OP(__nv_bfloat16, pick_rows_bf16)
PICK_ROWS_OP(float, pick_rows_f32)
