//! Qwen3-TTS's stage 0 through the model seam: [`ArModel`] (talker + code predictor) as a
//! [`Stage0Model`], its [`PendingSession`] as the resumable prefill and [`ArSession`] as a row.

use std::path::Path;

use candle_core::Device;

use super::checkpoint::Checkpoint;
use super::prompt::{ASSISTANT_HEAD, ASSISTANT_TAIL};
use super::text_stream::IncrementalTokenizer;
use super::{ArModel, ArSession, PendingSession};
use crate::models::tts::{
    ArStep, IncrementalText, ModelError, SamplingParams, Stage0Model, Stage0Options, Stage0Prefill,
    Stage0Session, VoiceClonePrompt, VoiceRequest,
};
use crate::nn::WeightForm;

impl Stage0Model for ArModel {
    const NAME: &'static str = "qwen3_tts";
    type Prefill<'m> = PendingSession<'m>;
    type Session<'m> = ArSession<'m>;
    type OpenText<'m> = OpenText<'m>;

    fn load(dir: &Path, device: &Device, opts: &Stage0Options) -> Result<Self, ModelError> {
        let ckpt = Checkpoint::open(dir)?;
        ArModel::load_with(&ckpt, device, opts.dtype, opts.quantization)
    }

    fn enable_cuda_graphs(&mut self) -> Result<(), ModelError> {
        ArModel::enable_cuda_graphs(self)
    }

    fn enable_batch_graphs(&mut self, max_rows: usize) -> Result<Vec<usize>, ModelError> {
        ArModel::enable_batch_graphs(self, max_rows)
    }

    fn weight_forms(&self) -> Vec<WeightForm> {
        ArModel::weight_forms(self)
    }

    fn num_codebooks(&self) -> usize {
        self.num_code_groups()
    }

    fn text_tokens(&self, text: &str) -> usize {
        self.tokenizer()
            .encode(text)
            .map(|ids| ids.len())
            .unwrap_or_else(|_| text.chars().count())
    }

    fn begin<'m>(
        &'m self,
        voice: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<PendingSession<'m>, ModelError> {
        ArModel::begin(self, voice, sampling)
    }

    fn open_text(&self) -> Result<OpenText<'_>, ModelError> {
        Ok(OpenText {
            tok: IncrementalTokenizer::new(self.tokenizer(), ASSISTANT_HEAD),
        })
    }

    fn begin_open<'m>(
        &'m self,
        voice: &VoiceRequest,
        sampling: &SamplingParams,
        ids: &[u32],
    ) -> Result<PendingSession<'m>, ModelError> {
        ArModel::begin_open(self, voice, sampling, ids)
    }

    fn prefill_steps<'m>(
        &'m self,
        steps: &mut [(&mut PendingSession<'m>, usize)],
    ) -> Vec<Result<bool, ModelError>> {
        ArModel::prefill_steps(self, steps)
    }

    fn next_frames<'m>(
        &'m self,
        rows: &mut [&mut ArSession<'m>],
    ) -> Vec<Result<ArStep, ModelError>> {
        ArModel::next_frames(self, rows)
    }

    fn encode_reference(
        &self,
        audio: &[f32],
        ref_text: Option<&str>,
        speaker_only: bool,
    ) -> Result<VoiceClonePrompt, ModelError> {
        self.create_voice_clone_prompt(audio, ref_text, speaker_only)
    }
}

impl<'m> Stage0Prefill for PendingSession<'m> {
    type Session = ArSession<'m>;

    fn remaining(&self) -> usize {
        PendingSession::remaining(self)
    }

    fn step(&mut self, positions: usize) -> Result<bool, ModelError> {
        self.prefill_step(positions)
    }

    fn into_session(self) -> Result<ArSession<'m>, ModelError> {
        PendingSession::into_session(self)
    }
}

impl Stage0Session for ArSession<'_> {
    fn waits_for_text(&self) -> bool {
        ArSession::waits_for_text(self)
    }

    fn text_open(&self) -> bool {
        ArSession::text_open(self)
    }

    fn extend_text(&mut self, ids: &[u32], ended: bool) -> Result<(), ModelError> {
        ArSession::extend_text(self, ids, ended)
    }

    fn check_text_budget(&self, text: &str, max_new_tokens: usize) -> Result<(), ModelError> {
        self.prompt_ids()
            .check_position_budget(self.model.config(), text, max_new_tokens)
    }
}

/// Open text as the talker takes it: the assistant text's ids, committed once later text
/// cannot change them (`text_stream.rs`), inside the prompt's assistant head and tail.
pub struct OpenText<'m> {
    tok: IncrementalTokenizer<'m>,
}

impl IncrementalText for OpenText<'_> {
    fn push_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.tok
            .push_bytes(bytes)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn finish(&mut self) -> Result<(), String> {
        self.tok
            .finish(ASSISTANT_TAIL)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn is_finished(&self) -> bool {
        self.tok.is_finished()
    }

    fn ids(&self) -> &[u32] {
        self.tok.ids()
    }

    fn text(&self) -> Option<&str> {
        if !self.tok.is_finished() {
            return None;
        }
        let t = self.tok.text();
        t.get(ASSISTANT_HEAD.len()..t.len().saturating_sub(ASSISTANT_TAIL.len()))
    }
}
