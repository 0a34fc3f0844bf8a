// The code predictor's sampled pick and the next input in one launch: temperature, top-k, top-p and
// the inverse-CDF draw of `DeviceSampler::sample` (src/models/qwen3_tts/device_sampler.rs, the
// reference for every step here), then that row of an embedding table copied out.
//
// Replaces, per code-predictor step of a whole-frame sampling graph: ~40 launches (a sort, two
// softmaxes, f64 prefix sums as blocked matmuls, masks, counts) and the embedding's index_select.
//
// Inputs: logits [vocab] f32 (vocab <= SAMPLE_MAX_VOCAB); params [3 + steps] f64 =
// [temperature, index of the k-th largest logit in the ascending sort (0: top-k off), top-p cut
// 1 - top_p (-1: off), one uniform in [0, 1) per step]; step; table [vocab, hidden] T contiguous
// (null when hidden = 0: no copy). Outputs: id [1] u32; x [hidden] T.
// Launch: grid 1, block SAMPLE_THREADS.
#include "sample_embed.cuh"

using namespace omnitts;

#define SAMPLE_EMBED_OP(T, NAME)                                                                \
    extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)                               \
        NAME(const float* logits, int vocab, const double* params, int step, const T* table,    \
             int hidden, unsigned* id, T* x) {                                                  \
        sample_embed<T>(logits, vocab, params, step, table, hidden, id, x);                     \
    }

SAMPLE_EMBED_OP(__nv_bfloat16, sample_embed_bf16)
SAMPLE_EMBED_OP(float, sample_embed_f32)
