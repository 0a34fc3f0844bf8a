//! A checkpoint's request rules without its weights ([`VoiceRules`]): what the engine checks at
//! submit time, on the caller's thread, before a request reaches a stage.

use std::fmt;

use super::{ModelDescription, ModelError, SamplingParams, VoiceRequest};

/// The caller-side half of a model: its description, its sampling defaults, and every check of
/// a request that needs no weights. Shared by the engine and its callers (`Send + Sync`).
pub trait VoiceRules: Send + Sync + fmt::Debug {
    /// What the checkpoint is and accepts.
    fn description(&self) -> &ModelDescription;

    /// The checkpoint's sampling defaults (before the stage config's overrides).
    fn default_sampling(&self) -> SamplingParams;

    /// Checks `voice` as the model will when it starts the request. Errors:
    /// [`ModelError::InvalidRequest`] naming the field (`text`, `speaker`, `language`,
    /// `instruct`, `voice_clone`, …) without a `voice.` prefix.
    fn check(&self, voice: &VoiceRequest) -> Result<(), ModelError>;

    /// Checks `voice` for text that is still arriving (`voice.text` is a speakable stand-in).
    /// Errors as [`VoiceRules::check`]; a model without open text refuses every request
    /// (`field` `model`).
    fn check_open(&self, voice: &VoiceRequest) -> Result<(), ModelError>;

    /// Checks what `sampling` asks of the checkpoint beyond its own ranges (those are
    /// [`SamplingParams::validate`]'s): a frame cap (`max_new_tokens`) that no request could
    /// reach, the AR stage's positions holding fewer. Errors: [`ModelError::InvalidRequest`]
    /// naming the field without a `sampling.` prefix. The default accepts any.
    fn check_sampling(&self, sampling: &SamplingParams) -> Result<(), ModelError> {
        let _ = sampling;
        Ok(())
    }

    /// Checks that `voice` (already accepted by [`VoiceRules::check`]) is not too long for one
    /// utterance: that its prompt fits the AR stage's positions beside `max_new_tokens` frames,
    /// as the stage checks when it starts the request. Tokenizes the text when it may not fit
    /// (on the caller's thread: time linear in the text). Errors: [`ModelError::InvalidRequest`]
    /// on `text` whose message starts [`TOO_LONG_FOR_ONE_UTTERANCE`], or on `max_new_tokens`
    /// when the frames alone leave no room for text. The default accepts any.
    fn check_length(&self, voice: &VoiceRequest, max_new_tokens: usize) -> Result<(), ModelError> {
        let _ = (voice, max_new_tokens);
        Ok(())
    }
}

/// How every refusal of a text too long for one utterance (its prompt past the AR stage's
/// positions) starts its message.
pub const TOO_LONG_FOR_ONE_UTTERANCE: &str = "too long for one utterance";
