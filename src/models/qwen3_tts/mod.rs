//! Qwen3-TTS (12 Hz family) in candle, loading the published checkpoints unchanged.
//!
//! Stage 0 ([`ArModel`]): text tokenizer, dual-track prompt, talker and code predictor, producing
//! codec frames of `num_code_groups` codes; each utterance runs as an [`ArSession`] over the shared
//! model. Stage 1 (`code2wav`): the codec decoder.
//!
//! | file | holds |
//! |---|---|
//! | `checkpoint.rs`, `config.rs` | the checkpoint directory and its configs |
//! | `request.rs`, `prompt.rs`, `tokenizer.rs` | sampling defaults from `generation_config.json`; the dual-track prompt plan |
//! | `ar_model.rs` | the stage-0 network: loading, prompt embeddings, the talker's decode input |
//! | `talker.rs`, `code_predictor.rs` | the two decoders, mirroring the checkpoint's weight names |
//! | `prefill.rs`, `session.rs`, `sampling.rs` | one utterance's generation state: its resumable prefill ([`PendingSession`]), its frames ([`ArSession`]); logits processing and sampling |
//! | `batch.rs` | one frame for many sessions in one batched forward ([`ArModel::next_frames`]) |
//! | `graphs/` | the CUDA graphs of stage 0 and the lease of the talker's |
//! | `voice_clone.rs`, `speaker_encoder.rs`, `codec_encoder.rs`, `mel.rs` | Base voice-clone prompts |
//! | `device_sampler.rs` | code choice on the device (inside the code predictor's frame graph) |
//! | `code2wav/` | stage 1 |
//! | `rules.rs`, `stage0.rs`, `stage1.rs` | the model seam: request rules and description, [`ArModel`] and `Code2Wav` as the stage traits |
//!
//! Reference: QwenLM/Qwen3-TTS `qwen_tts/core/models/modeling_qwen3_tts.py`,
//! `qwen_tts/inference/qwen3_tts_model.py` and
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`; the spec is
//! docs/qwen3-tts.md.

mod ar_model;
mod batch;
mod checkpoint;
pub mod code2wav;
pub mod code_predictor;
pub mod codec_encoder;
pub mod config;
pub mod device_sampler;
mod graphs;
pub mod mel;
mod prefill;
pub mod prompt;
mod request;
mod rules;
pub mod sampling;
mod session;
pub mod speaker_encoder;
mod stage0;
mod stage1;
pub mod talker;
#[cfg(test)]
mod testing;
pub mod text_stream;
pub mod tokenizer;
mod voice_clone;

pub use crate::models::tts::{
    ArStep, FinishReason, ModelError, PromptMode, SamplingParams, VoiceClonePrompt, VoiceRequest,
};
pub use ar_model::{ArModel, WeightForm};
pub use checkpoint::Checkpoint;
pub use config::{GenerationConfig, ModelVariant, Qwen3TtsConfig};
pub use graphs::{CpGraphs, TALKER_GRAPH_POSITIONS, TalkerGraphs};
pub use prefill::PendingSession;
pub use prompt::{CodecPart, Prompt, PromptRow, ResolvedRequest};
pub use rules::{Qwen3Rules, REF_AUDIO_RATE, served_description};
pub use session::{ArSession, StepTiming};
pub use stage0::OpenText;
pub use voice_clone::{
    MAX_REF_AUDIO_SAMPLES, MIN_REF_AUDIO_SAMPLES, SILENT_REF_PEAK, check_reference_audio,
};
