// Greedy choice and the next input in one launch: the first index of the maximum of a row of f32
// logits (torch's and the host's argmax: the smallest index among equal maxima; NaN never wins,
// an all-NaN row gives the last index), written as u32, and that row of an embedding table copied
// out as the next step's input.
//
// Replaces, per code-predictor step of a whole-frame graph: max, eq, where, min, minimum, cast
// (the device sampler's greedy path) and the embedding's index_select (7 launches -> 1).
//
// Inputs: logits [vocab] f32; table [vocab, hidden] T contiguous (may be null when hidden = 0: no
// copy). Outputs: id [1] u32; x [hidden] T. Launch: grid 1, block ARGMAX_THREADS.
#include "argmax_embed.cuh"

using namespace omnitts;

#define ARGMAX_EMBED_OP(T, NAME)                                                                \
    extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)                               \
        NAME(const float* logits, int vocab, const T* table, int hidden, unsigned* id, T* x) {  \
        argmax_embed<T>(logits, vocab, table, hidden, id, x);                                   \
    }

ARGMAX_EMBED_OP(__nv_bfloat16, argmax_embed_bf16)
ARGMAX_EMBED_OP(float, argmax_embed_f32)
