//! The element's voice cloning (Base checkpoints): which reference an utterance uses (from the
//! `ref-audio`, `ref-text` and `x-vector-only` properties) and how that becomes the engine's
//! voice-clone prompt — each recording decoded once ([`super::ref_audio`]), each (recording,
//! transcript, mode) encoded once by the engine's cache
//! ([`Engine::voice_clone_prompt`](crate::engine::Engine::voice_clone_prompt)).

use std::sync::Arc;

use crate::engine::{Engine, EngineError};
use crate::models::qwen3_tts::{
    MAX_REF_AUDIO_SAMPLES, ModelError, ModelVariant, VoiceClonePrompt, check_reference_audio,
};

use super::input_error::{InputError, input_error};
use super::ref_audio::decode_ref_audio;

/// The reference voice of one utterance, as the properties gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CloneSpec {
    /// `ref-audio`: a file path or URI.
    pub location: String,
    /// `ref-text` (ICL mode); `None` in x-vector-only mode.
    pub ref_text: Option<String>,
    /// `x-vector-only`.
    pub x_vector_only: bool,
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.map(str::trim).filter(|s| !s.is_empty())
}

/// Checks the voice-clone properties against the checkpoint `variant` (of the `model` property)
/// and returns the utterance's reference (`None` for CustomVoice/VoiceDesign). Base needs
/// `ref-audio`; other variants refuse `ref-audio`, `ref-text` and `x-vector-only`. In
/// x-vector-only mode `ref-text` is ignored (as in qwen-tts `generate_voice_clone`); a missing
/// `ref-text` in ICL mode is reported by the engine, which checks it with the audio.
pub(crate) fn clone_spec(
    variant: ModelVariant,
    model: &str,
    ref_audio: Option<&str>,
    ref_text: Option<&str>,
    x_vector_only: bool,
) -> Result<Option<CloneSpec>, InputError> {
    let (location, text) = (non_empty(ref_audio), non_empty(ref_text));
    if variant != ModelVariant::Base {
        let not_base = format!(
            "only used for voice cloning, which needs a Base checkpoint; model '{model}' is \
             {variant:?}: leave it unset"
        );
        return match (location, text, x_vector_only) {
            (Some(l), _, _) => Err(input_error("ref-audio", l, not_base)),
            (None, Some(t), _) => Err(input_error("ref-text", t, not_base)),
            (None, None, true) => Err(input_error("x-vector-only", "true", not_base)),
            (None, None, false) => Ok(None),
        };
    }
    let Some(location) = location else {
        return Err(match text {
            Some(t) => input_error(
                "ref-text",
                t,
                format!(
                    "needs ref-audio, the recording it transcribes (model '{model}' is a Base \
                     checkpoint)"
                ),
            ),
            None => input_error(
                "ref-audio",
                ref_audio.unwrap_or(""),
                format!(
                    "model '{model}' is a Base checkpoint, which speaks in the voice of a \
                     reference recording: set ref-audio (and ref-text, or x-vector-only=true)"
                ),
            ),
        });
    };
    Ok(Some(CloneSpec {
        location: location.to_string(),
        ref_text: if x_vector_only {
            None
        } else {
            text.map(str::to_string)
        },
        x_vector_only,
    }))
}

/// Turns [`CloneSpec`]s into prompts, keeping the last decoded recording so that it is decoded
/// again only when `ref-audio` names another one.
#[derive(Default)]
pub(crate) struct VoiceCloner {
    decoded: Option<(String, Arc<[f32]>)>,
}

impl VoiceCloner {
    /// The 24 kHz mono samples of `location` (decoded again only for another location).
    fn samples(&mut self, location: &str) -> Result<Arc<[f32]>, InputError> {
        if let Some((l, s)) = &self.decoded
            && l == location
        {
            return Ok(s.clone());
        }
        let samples: Arc<[f32]> = decode_ref_audio(location, MAX_REF_AUDIO_SAMPLES)
            .map_err(|e| input_error("ref-audio", location, e.to_string()))?
            .into();
        self.decoded = Some((location.to_string(), samples.clone()));
        Ok(samples)
    }

    /// The samples of `location` checked as a reference (for a speech server, which gets the
    /// recording itself). Errors name `ref-audio`: unreadable or not audio, too short / too long
    /// (0.5 s / 60 s), silent.
    pub fn checked_samples(&mut self, location: &str) -> Result<Arc<[f32]>, InputError> {
        let samples = self.samples(location)?;
        check_reference_audio(&samples).map_err(|e| match e {
            ModelError::InvalidRequest { value, msg, .. } => {
                input_error("ref-audio", location, format!("{msg}; it has {value}"))
            }
            other => input_error("ref-audio", location, other.to_string()),
        })?;
        Ok(samples)
    }

    /// The prompt for `spec`: decodes the recording if needed and asks `engine` (which encodes it
    /// once and caches it). Errors name the property and its value: unreadable or not audio,
    /// too short / too long (0.5 s / 60 s), silent (`ref-audio`); missing transcript (`ref-text`).
    pub fn prompt(
        &mut self,
        engine: &Engine,
        spec: &CloneSpec,
    ) -> Result<VoiceClonePrompt, InputError> {
        let samples = self.samples(&spec.location)?;
        let prompt = engine
            .voice_clone_prompt(&samples, spec.ref_text.as_deref(), spec.x_vector_only)
            .map_err(|e| match e {
                EngineError::InvalidRequest { field, msg, .. } if field == "ref_text" => {
                    input_error("ref-text", spec.ref_text.as_deref().unwrap_or(""), msg)
                }
                EngineError::InvalidRequest { field, value, msg } if field == "ref_audio" => {
                    input_error(
                        "ref-audio",
                        &spec.location,
                        format!("{msg}; it has {value}"),
                    )
                }
                other => input_error("ref-audio", &spec.location, other.to_string()),
            })?;
        Ok(VoiceClonePrompt::clone(&prompt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_rules() {
        let base = |a, t, x| clone_spec(ModelVariant::Base, "m", a, t, x);
        let spec = base(Some(" r.wav "), Some("hi"), false).unwrap().unwrap();
        assert_eq!(spec.location, "r.wav");
        assert_eq!(spec.ref_text.as_deref(), Some("hi"));
        // x-vector-only ignores ref-text.
        let spec = base(Some("r.wav"), Some("hi"), true).unwrap().unwrap();
        assert_eq!((spec.ref_text, spec.x_vector_only), (None, true));
        // ICL without a transcript is left to the engine's check.
        assert!(base(Some("r.wav"), None, false).unwrap().is_some());
        assert_eq!(base(None, None, false).unwrap_err().property, "ref-audio");
        assert_eq!(
            base(Some("  "), None, true).unwrap_err().property,
            "ref-audio"
        );
        assert_eq!(
            base(None, Some("hi"), false).unwrap_err().property,
            "ref-text"
        );
        let cv = |a, t, x| clone_spec(ModelVariant::CustomVoice, "m", a, t, x);
        assert_eq!(cv(None, None, false).unwrap(), None);
        assert_eq!(
            cv(Some("r.wav"), None, false).unwrap_err().property,
            "ref-audio"
        );
        assert_eq!(
            cv(None, Some("hi"), false).unwrap_err().property,
            "ref-text"
        );
        let e = cv(None, None, true).unwrap_err();
        assert_eq!((e.property, e.value.as_str()), ("x-vector-only", "true"));
    }
}
