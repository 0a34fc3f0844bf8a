//! The stage-0 seam ([`Stage0Model`]): the autoregressive half of a model, which turns a
//! request into codec frames, one batched step over all running requests at a time.
//!
//! The engine's stage-0 thread drives it: `begin` (checks, tokenizes, embeds; no transformer
//! work) → [`Stage0Prefill::step`] a chunk of prompt positions at a time between frames (so a
//! long prompt delays the running streams by at most a chunk) → [`Stage0Prefill::into_session`]
//! → [`Stage0Model::next_frames`] over every running session, each row's result equal to what
//! it gets alone. Sessions borrow the model, so one copy of the weights serves every stream.
//! The engine is monomorphised over the implementation: no dynamic dispatch per frame.

use std::path::Path;

use candle_core::{DType, Device};

use super::{ArStep, ModelError, SamplingParams, VoiceClonePrompt, VoiceRequest};
use crate::nn::{QuantizationSpec, WeightForm};

/// How stage 0 loads its weights.
#[derive(Debug, Clone, Copy)]
pub struct Stage0Options {
    /// Compute dtype of the transformers (f32 on the CPU, bf16 on CUDA by default).
    pub dtype: DType,
    /// Stored form of the linear weights (`engine_args.quantization`); a model that has no
    /// quantized form refuses anything but dense.
    pub quantization: QuantizationSpec,
}

/// The autoregressive stage of a model family.
pub trait Stage0Model: Sized + 'static {
    /// The stage's name in messages and errors (`qwen3_tts`, `fish_qwen3_omni`).
    const NAME: &'static str;

    /// A request whose prompt is still running through the model.
    type Prefill<'m>: Stage0Prefill<Session = Self::Session<'m>>
    where
        Self: 'm;
    /// One utterance's generation state (KV cache, sampler, RNG), borrowing the model.
    type Session<'m>: Stage0Session
    where
        Self: 'm;
    /// Text that is still arriving, tokenized as it comes ([`Stage0Model::open_text`]).
    type OpenText<'m>: IncrementalText
    where
        Self: 'm;

    /// Loads the checkpoint directory `dir` on `device`. Errors: unreadable or inconsistent
    /// files, naming the file and field or tensor.
    fn load(dir: &Path, device: &Device, opts: &Stage0Options) -> Result<Self, ModelError>;

    /// Captures the single-stream CUDA graphs (before the engine reports ready). An error
    /// leaves the model eager; its text says why (a model without graphs says so).
    fn enable_cuda_graphs(&mut self) -> Result<(), ModelError>;

    /// Captures the batched-frame CUDA graphs for up to `max_rows` rows; returns the batch
    /// sizes captured. An error leaves batched frames eager.
    fn enable_batch_graphs(&mut self, max_rows: usize) -> Result<Vec<usize>, ModelError>;

    /// How the linear weights are stored, per form.
    fn weight_forms(&self) -> Vec<WeightForm>;

    /// Codes per frame.
    fn num_codebooks(&self) -> usize;

    /// Text tokens of `text` (the runaway guard's budget is relative to them); the character
    /// count where the tokenizer fails.
    fn text_tokens(&self, text: &str) -> usize;

    /// Checks `voice` and `sampling`, builds the prompt and its embeddings. Errors:
    /// [`ModelError::InvalidRequest`] naming the field; others for model failures.
    fn begin<'m>(
        &'m self,
        voice: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<Self::Prefill<'m>, ModelError>;

    /// A tokenizer for text that is still arriving. Errors: [`ModelError::InvalidRequest`]
    /// (field `model`) for a model that cannot take it.
    fn open_text(&self) -> Result<Self::OpenText<'_>, ModelError>;

    /// As [`Stage0Model::begin`] for text still arriving: `ids` are the text's ids committed so
    /// far (from [`Stage0Model::open_text`]); the rest comes through
    /// [`Stage0Session::extend_text`].
    fn begin_open<'m>(
        &'m self,
        voice: &VoiceRequest,
        sampling: &SamplingParams,
        ids: &[u32],
    ) -> Result<Self::Prefill<'m>, ModelError>;

    /// One engine step's prefill work: `steps[i]` is a prefill and the positions it may run;
    /// `results[i]` is what [`Stage0Prefill::step`] returns for it alone. A model may run several
    /// whole prompts in one batched pass (each equal to its prompt alone up to float rounding); a
    /// failure of such a pass fails every prefill in it. The default steps them one by one, in
    /// order.
    fn prefill_steps<'m>(
        &'m self,
        steps: &mut [(&mut Self::Prefill<'m>, usize)],
    ) -> Vec<Result<bool, ModelError>> {
        steps.iter_mut().map(|(p, n)| p.step(*n)).collect()
    }

    /// One frame for every row, in one batched forward: `results[i]` is what row `i` gets
    /// alone (the same codes for the same settings and seed). A failure of the batched forward
    /// fails every row in it.
    fn next_frames<'m>(
        &'m self,
        rows: &mut [&mut Self::Session<'m>],
    ) -> Vec<Result<ArStep, ModelError>>;

    /// Encodes a reference recording (mono, at the description's reference rate) into a voice
    /// to clone; `ref_text` is its transcript; `speaker_only` asks for the speaker embedding
    /// alone. Errors: [`ModelError::InvalidRequest`] naming `model` (it does not clone),
    /// `ref_audio` or `ref_text`.
    fn encode_reference(
        &self,
        audio: &[f32],
        ref_text: Option<&str>,
        speaker_only: bool,
    ) -> Result<VoiceClonePrompt, ModelError>;
}

/// A prompt still running through stage 0, a chunk of positions at a time.
pub trait Stage0Prefill {
    /// The session the prefill becomes.
    type Session;

    /// Prompt positions still to run.
    fn remaining(&self) -> usize;

    /// Runs the next `positions` positions (fewer at the end); `true` once the whole prompt
    /// has run.
    fn step(&mut self, positions: usize) -> Result<bool, ModelError>;

    /// The session, once the prompt has run. Errors: [`ModelError::PrefillIncomplete`].
    fn into_session(self) -> Result<Self::Session, ModelError>;
}

/// One utterance in stage 0's batch.
pub trait Stage0Session {
    /// Whether the next frame needs a text id that has not arrived (open text only).
    fn waits_for_text(&self) -> bool {
        false
    }

    /// Whether the text is still open (its end not yet given).
    fn text_open(&self) -> bool {
        false
    }

    /// Gives an open-text session the text's ids committed so far (`ids` is all of them, from
    /// the start); `ended` when the text is complete.
    fn extend_text(&mut self, ids: &[u32], ended: bool) -> Result<(), ModelError>;

    /// Checks that the whole `text` and `max_new_tokens` frames fit the model's positions
    /// (open text, once it ended). Errors: [`ModelError::InvalidRequest`] (`text` or
    /// `max_new_tokens`).
    fn check_text_budget(&self, text: &str, max_new_tokens: usize) -> Result<(), ModelError>;

    /// Whether a prompt must run through the model before this session's next frame (a later
    /// generation batch of the same utterance, whose prompt holds the earlier ones: Fish S2 Pro's
    /// dialogues). Until it has run ([`Stage0Session::prefill_pending`]) the engine leaves the
    /// session out of the batched steps, so that the other streams go on meanwhile.
    fn has_pending_prompt(&self) -> bool {
        false
    }

    /// Runs up to `positions` positions (at least one) of the pending prompt, as
    /// [`Stage0Prefill::step`] does for a new request's; returns how many ran (0 when none was
    /// pending). A session that is stepped with its prompt still pending runs the rest of it
    /// first, so callers that never call this get the same frames. Errors: model failures.
    fn prefill_pending(&mut self, positions: usize) -> Result<usize, ModelError> {
        let _ = positions;
        Ok(0)
    }
}

/// Text tokenized while it arrives: only ids later text cannot change are committed.
pub trait IncrementalText {
    /// Takes the next bytes of UTF-8 text. Errors: the message (not UTF-8, naming the offset).
    fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), String>;
    /// The text has ended: commits the rest.
    fn finish(&mut self) -> Result<(), String>;
    /// Whether [`IncrementalText::finish`] was called.
    fn is_finished(&self) -> bool;
    /// The committed ids.
    fn ids(&self) -> &[u32];
    /// The whole text, once finished.
    fn text(&self) -> Option<&str>;
}

/// The open text of a model that takes none: no value exists.
#[derive(Debug)]
pub enum NoOpenText {}

impl IncrementalText for NoOpenText {
    fn push_bytes(&mut self, _: &[u8]) -> Result<(), String> {
        match *self {}
    }
    fn finish(&mut self) -> Result<(), String> {
        match *self {}
    }
    fn is_finished(&self) -> bool {
        match *self {}
    }
    fn ids(&self) -> &[u32] {
        match *self {}
    }
    fn text(&self) -> Option<&str> {
        match *self {}
    }
}
