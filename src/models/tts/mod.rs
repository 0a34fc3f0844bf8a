//! The model seam: what every text-to-speech family shares, so that the engine and the elements
//! name none of them.
//!
//! | file | holds |
//! |---|---|
//! | `error.rs` | [`ModelError`] |
//! | `request.rs`, `sampling.rs` | what a request asks for ([`VoiceRequest`], [`VoiceClonePrompt`]); [`SamplingParams`] and its one validation |
//! | `step.rs` | what a stage-0 row gives per step ([`ArStep`], [`FinishReason`]) |
//! | `stage0.rs`, `stage1.rs` | the stage traits: [`Stage0Model`] (prompt → resumable prefill → batched `next_frames`), [`Stage1Model`] (exact streams, batched `decode_chunks`) |
//! | `text.rs` | text rules every model shares (nothing to speak, language names and codes) |
//! | `description.rs` | [`ModelDescription`]: rate, frame size, codebooks, what the checkpoint accepts |
//! | `reference.rs` | [`ReferenceRules`]: what a reference recording must be, and its check |
//! | `rules.rs` | [`VoiceRules`]: a checkpoint's request checks and defaults, without weights |

mod description;
mod error;
mod reference;
mod request;
mod rules;
mod sampling;
mod stage0;
mod stage1;
mod step;
pub mod text;

pub use description::{InstructUse, ModelDescription};
pub use error::{ModelError, QUOTED_VALUE_CHARS};
pub use reference::{ReferenceRules, ReferenceUse, SILENT_REF_PEAK};
pub use request::{PromptMode, VoiceClonePrompt, VoiceRequest};
pub use rules::{TOO_LONG_FOR_ONE_UTTERANCE, VoiceRules};
pub use sampling::{MAX_NEW_TOKENS_RANGE, SamplingParams};
pub use stage0::{
    IncrementalText, NoOpenText, Stage0Model, Stage0Options, Stage0Prefill, Stage0Session,
};
pub use stage1::{Stage1Model, Stage1Options, Stage1Stream, chunk_count_mismatch};
pub use step::{ArStep, FinishReason};
