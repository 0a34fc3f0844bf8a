//! The stage-1 seam ([`Stage1Model`]): the codec decoder, which turns codec frames into audio.
//!
//! Exact streaming: a [`Stage1Model::stream`] keeps the decoder's state between chunks, so any
//! chunking gives the samples of decoding the utterance whole, exactly `frames ×
//! samples_per_frame` of them. [`Stage1Model::decode_chunks`] decodes the next chunk of several
//! streams in shared passes, each stream's audio what it gets alone.

use std::path::Path;

use candle_core::{DType, Device};

use super::ModelError;

/// How stage 1 loads its weights.
#[derive(Debug, Clone, Copy)]
pub struct Stage1Options {
    /// Compute dtype the stage config asks for; a codec that decodes in f32 only (Fish S2
    /// Pro's) keeps f32.
    pub dtype: DType,
}

/// The codec decoder of a model family.
pub trait Stage1Model: Sized + 'static {
    /// The stage's name in messages and errors (`code2wav`, `fish_codec`).
    const NAME: &'static str;

    /// Whether an ICL clone's reference codes are the decoder's left context for the whole
    /// utterance (primed, their audio dropped: Qwen3-TTS Base), or the generated codes are
    /// decoded alone (Fish S2 Pro, as its reference does).
    const REFERENCE_CONTEXT: bool;

    /// One utterance's exact streaming state, borrowing the decoder.
    type Stream<'c>: Stage1Stream
    where
        Self: 'c;

    /// Loads the decoder of the checkpoint directory `dir` on `device`.
    fn load(dir: &Path, device: &Device, opts: &Stage1Options) -> Result<Self, ModelError>;

    /// Output sample rate, Hz.
    fn sample_rate(&self) -> u32;

    /// Output samples per frame.
    fn samples_per_frame(&self) -> usize;

    /// Codes per frame.
    fn num_codebooks(&self) -> usize;

    /// Most frames one batched pass of [`Stage1Model::decode_chunks`] takes.
    fn max_batch_frames(&self) -> usize;

    /// Sets [`Stage1Model::max_batch_frames`] (`max_num_batched_tokens`, ≥ 1).
    fn set_max_batch_frames(&mut self, frames: usize);

    /// Captures the decoder's CUDA graphs, if it has any (Code2Wav: a fresh stream's one-frame
    /// first chunk); `true` when something was captured. An error leaves the decoder eager.
    fn enable_cuda_graphs(&mut self) -> Result<bool, ModelError> {
        Ok(false)
    }

    /// A fresh exact stream.
    fn stream(&self) -> Self::Stream<'_>;

    /// The next chunk of several streams: `chunks[i]` (frames `[n_i][codebooks]`) on
    /// `streams[i]`. Per stream in order: what `streams[i].decode_chunk(chunks[i])` alone gives
    /// (`n_i × samples_per_frame` samples), or its error.
    fn decode_chunks<'c>(
        &'c self,
        streams: &mut [&mut Self::Stream<'c>],
        chunks: &[&[Vec<u32>]],
    ) -> Vec<Result<Vec<f32>, ModelError>>;

    /// Stateless windowed decode: `context ++ frames` from scratch, the last `frames.len() ×
    /// samples_per_frame` samples.
    fn decode_window(
        &self,
        context: &[Vec<u32>],
        frames: &[Vec<u32>],
    ) -> Result<Vec<f32>, ModelError>;
}

/// What [`Stage1Model::decode_chunks`] returns when `chunks` (the count) does not match `streams`:
/// the same error for every stream, naming the field; `None` when they match.
pub fn chunk_count_mismatch<T>(
    streams: usize,
    chunks: usize,
) -> Option<Vec<Result<T, ModelError>>> {
    (chunks != streams).then(|| {
        (0..streams)
            .map(|_| {
                Err(ModelError::InvalidRequest {
                    field: "chunks.len()".into(),
                    value: chunks.to_string(),
                    msg: format!("one chunk per stream ({streams} streams)"),
                })
            })
            .collect()
    })
}

/// One utterance's exact streaming decoder state.
pub trait Stage1Stream {
    /// Decodes the next frames `[n][codebooks]`: exactly `n × samples_per_frame` samples.
    fn decode_chunk(&mut self, frames: &[Vec<u32>]) -> Result<Vec<f32>, ModelError>;
}
