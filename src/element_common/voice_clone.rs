//! The element's voice cloning (Base checkpoints): which reference an utterance uses (from the
//! `ref-audio`, `ref-text` and `x-vector-only` properties) and how that becomes the engine's
//! voice-clone prompt — each recording decoded once ([`super::ref_audio`]), each (recording,
//! transcript, mode) encoded once by the engine's cache
//! ([`Engine::voice_clone_prompt`](crate::engine::Engine::voice_clone_prompt)).

use std::sync::Arc;

use crate::engine::{Engine, EngineError};
use crate::models::tts::text::unspeakable;
use crate::models::tts::{
    ModelDescription, ModelError, ReferenceRules, ReferenceUse, VoiceClonePrompt,
};

use super::input_error::{InputError, input_error};
use super::ref_audio::decode_ref_audio_at;

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

/// Checks the voice-clone properties against the checkpoint `d` (of the `model` property) and
/// returns the utterance's reference (`None` without one). A checkpoint that requires a
/// reference (Qwen3-TTS Base) needs `ref-audio`; one that does not clone refuses `ref-audio`,
/// `ref-text` and `x-vector-only`; `x-vector-only` needs a checkpoint with a speaker-embedding
/// mode (in it `ref-text` is ignored, as in qwen-tts `generate_voice_clone`); `ref-text` needs
/// `ref-audio`; a `ref-text` with nothing to speak (only punctuation, symbols or markup) is
/// refused. A missing `ref-text` otherwise is reported by the engine, which checks it with the
/// audio.
pub(crate) fn clone_spec(
    d: &ModelDescription,
    model: &str,
    ref_audio: Option<&str>,
    ref_text: Option<&str>,
    x_vector_only: bool,
) -> Result<Option<CloneSpec>, InputError> {
    let (location, text) = (non_empty(ref_audio), non_empty(ref_text));
    let name = &d.name;
    if d.reference.use_ == ReferenceUse::Unsupported {
        let no_clone = format!(
            "only used for voice cloning, which model '{model}' ({name}) does not do (Qwen3-TTS \
             clones with a Base checkpoint): leave it unset"
        );
        return match (location, text, x_vector_only) {
            (Some(l), _, _) => Err(input_error("ref-audio", l, no_clone)),
            (None, Some(t), _) => Err(input_error("ref-text", t, no_clone)),
            (None, None, true) => Err(input_error("x-vector-only", "true", no_clone)),
            (None, None, false) => Ok(None),
        };
    }
    if x_vector_only && !d.reference.speaker_embedding_only {
        return Err(input_error(
            "x-vector-only",
            "true",
            format!(
                "model '{model}' ({name}) clones from the reference's codes and transcript \
                 only: leave x-vector-only unset and give ref-text"
            ),
        ));
    }
    let Some(location) = location else {
        return match (text, d.reference.use_) {
            (Some(t), _) => Err(input_error(
                "ref-text",
                t,
                format!(
                    "needs ref-audio, the recording it transcribes (model '{model}' is a \
                     {name} checkpoint)"
                ),
            )),
            (None, ReferenceUse::Required) => Err(input_error(
                "ref-audio",
                ref_audio.unwrap_or(""),
                format!(
                    "model '{model}' is a {name} checkpoint, which speaks in the voice of a \
                     reference recording: set ref-audio (and ref-text, or x-vector-only=true)"
                ),
            )),
            (None, _) => Ok(None),
        };
    };
    if let Some(t) = ref_text.filter(|t| !t.is_empty() && !x_vector_only)
        && let Some(why) = unspeakable(t)
    {
        return Err(input_error(
            "ref-text",
            t,
            format!("the transcript of ref-audio has {why}: give the words the recording says"),
        ));
    }
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
pub(crate) struct VoiceCloner {
    /// The checkpoint's reference rate and limits.
    rules: ReferenceRules,
    decoded: Option<(String, Arc<[f32]>)>,
}

impl VoiceCloner {
    /// A cloner for a checkpoint whose references follow `rules`.
    pub fn new(rules: ReferenceRules) -> Self {
        VoiceCloner {
            rules,
            decoded: None,
        }
    }

    /// The mono samples of `location` at the checkpoint's reference rate (decoded again only
    /// for another location).
    fn samples(&mut self, location: &str) -> Result<Arc<[f32]>, InputError> {
        if let Some((l, s)) = &self.decoded
            && l == location
        {
            return Ok(s.clone());
        }
        let (max, rate) = (self.rules.max_samples, self.rules.sample_rate);
        let samples: Arc<[f32]> = decode_ref_audio_at(location, max, rate)
            .map_err(|e| input_error("ref-audio", location, e.to_string()))?
            .into();
        self.decoded = Some((location.to_string(), samples.clone()));
        Ok(samples)
    }

    /// The samples of `location` checked as a reference (for a speech server, which gets the
    /// recording itself). Errors name `ref-audio`: unreadable or not audio, too short / too long
    /// (the checkpoint's limits: 0.5 s / 60 s for Qwen3-TTS Base), silent.
    pub fn checked_samples(&mut self, location: &str) -> Result<Arc<[f32]>, InputError> {
        let samples = self.samples(location)?;
        self.rules.check(&samples).map_err(|e| match e {
            ModelError::InvalidRequest { value, msg, .. } => {
                input_error("ref-audio", location, format!("{msg}; it has {value}"))
            }
            other => input_error("ref-audio", location, other.to_string()),
        })?;
        Ok(samples)
    }

    /// The prompt for `spec`: decodes the recording if needed and asks `engine` (which encodes it
    /// once and caches it). Errors name the property and its value: unreadable or not audio,
    /// too short / too long (the checkpoint's limits), silent (`ref-audio`); missing transcript
    /// (`ref-text`).
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
    use crate::models::qwen3_tts::{ModelVariant, served_description};

    #[test]
    fn spec_rules() {
        let d = |v| served_description(v, vec![], vec![], false);
        let base_d = d(ModelVariant::Base);
        let base = |a, t, x| clone_spec(&base_d, "m", a, t, x);
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
        // A transcript with no words is refused, naming ref-text; x-vector-only ignores it.
        for t in ["...", "<|speaker:0|> !?", "\u{200B}", "   "] {
            let e = base(Some("r.wav"), Some(t), false).unwrap_err();
            assert_eq!((e.property, e.value.as_str()), ("ref-text", t));
            assert!(e.why.contains("nothing"), "{}", e.why);
            assert!(base(Some("r.wav"), Some(t), true).unwrap().is_some());
        }
        let cv_d = d(ModelVariant::CustomVoice);
        let cv = |a, t, x| clone_spec(&cv_d, "m", a, t, x);
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
