//! What a request asks for, whatever the model: the text and voice ([`VoiceRequest`]), an encoded
//! reference voice ([`VoiceClonePrompt`]).

/// Where the text goes: all in the prefill (`NonStreaming`) or one token per frame (`Streaming`,
/// the reference's `non_streaming_mode=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptMode {
    Streaming,
    NonStreaming,
}

/// The name [`std::str::FromStr`] takes, and the `prompt-mode` property's nick: `streaming`,
/// `non-streaming`.
impl std::fmt::Display for PromptMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PromptMode::Streaming => "streaming",
            PromptMode::NonStreaming => "non-streaming",
        })
    }
}

impl std::str::FromStr for PromptMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "streaming" => Ok(PromptMode::Streaming),
            "non-streaming" | "nonstreaming" => Ok(PromptMode::NonStreaming),
            other => Err(format!(
                "unknown prompt mode {other:?} (streaming | non-streaming)"
            )),
        }
    }
}

/// What to say and how. `None` fields take the model's default. Which fields a checkpoint
/// accepts is in its [`super::ModelDescription`]; the model refuses the others.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoiceRequest {
    pub text: String,
    /// Preset speaker (case-insensitive; Qwen3-TTS CustomVoice). `None`/empty: none.
    pub speaker: Option<String>,
    /// Language (case-insensitive name, or its ISO 639-1 code: `en`, `zh`, …); `None` = `auto`.
    pub language: Option<String>,
    /// Instruct / voice description (Qwen3-TTS CustomVoice 1.7B, VoiceDesign); dropped by
    /// checkpoints that ignore it, refused by those that have none.
    pub instruct: Option<String>,
    /// Where the text goes (Qwen3-TTS's dual-track prompt); `None` = the model's default.
    pub prompt_mode: Option<PromptMode>,
    /// The voice to clone, encoded by the model from a reference recording
    /// (`Engine::voice_clone_prompt`); refused by checkpoints that do not clone.
    pub voice_clone: Option<VoiceClonePrompt>,
}

/// An encoded reference voice: a speaker embedding (Qwen3-TTS Base's x-vector; empty for models
/// without one) and, in ICL mode, the reference codes and their transcript (Qwen3-TTS Base ICL,
/// Fish S2 Pro).
///
/// Built from audio by the engine's stage 0 (`Engine::voice_clone_prompt`), or directly (e.g. from stored
/// codes). In ICL mode the reference codes are also the codec decoder's left context: decode
/// `ref_codes ++ generated` (or prime a stream with `ref_codes`) and drop exactly
/// `ref_codes.len() × samples_per_frame` samples from the front.
#[derive(Debug, Clone, Default)]
pub struct VoiceClonePrompt {
    /// Reference codes `[frames][codebooks]`, each in `[0, codebook size)`; required in ICL
    /// mode, must be `None` otherwise.
    pub ref_codes: Option<Vec<Vec<u32>>>,
    /// Speaker x-vector `[talker hidden size]` (f32; Qwen3-TTS Base); empty for a model that
    /// clones from the codes alone.
    pub x_vector: Vec<f32>,
    /// Transcript of the reference audio; required (non-empty) in ICL mode, ignored otherwise.
    pub ref_text: Option<String>,
    /// ICL mode (reference text + codes in the prompt); `false` = x-vector only.
    pub icl: bool,
}

impl VoiceClonePrompt {
    /// Number of reference frames whose audio the decoder must drop (0 unless ICL).
    pub fn ref_frames(&self) -> usize {
        if self.icl {
            self.ref_codes.as_ref().map_or(0, Vec::len)
        } else {
            0
        }
    }
}

// Bitwise float comparison so that `VoiceRequest` stays `Eq`.
impl PartialEq for VoiceClonePrompt {
    fn eq(&self, o: &Self) -> bool {
        self.ref_codes == o.ref_codes
            && self.ref_text == o.ref_text
            && self.icl == o.icl
            && self.x_vector.len() == o.x_vector.len()
            && self
                .x_vector
                .iter()
                .zip(&o.x_vector)
                .all(|(a, b)| a.to_bits() == b.to_bits())
    }
}

impl Eq for VoiceClonePrompt {}
