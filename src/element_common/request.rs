//! Settings + text → engine request: the speaker, language, instruct and prompt mode checked
//! against the loaded checkpoint, the sampling properties merged over the engine's defaults,
//! the chunk sizes, and (Base) the reference voice.

use std::path::PathBuf;
use std::sync::Mutex;

use crate::engine::{Engine, EngineError, EngineRequest};
use crate::models::tts::text::{resolve_language, unspeakable};
use crate::models::tts::{InstructUse, ModelDescription, SamplingParams, VoiceRequest};

use super::input_error::{InputError, input_error};
use super::settings::SynthesisSettings;
use super::voice_clone::{CloneSpec, VoiceCloner, clone_spec};

/// What loading told about the checkpoint; fixed until the element stops.
#[derive(Debug, Clone)]
pub(crate) struct ModelInfo {
    /// The `model` property as given (for messages).
    pub model: String,
    /// The checkpoint directory it resolved to.
    pub dir: PathBuf,
    /// What the checkpoint is and accepts (rate, frame size, speakers, languages, instruct,
    /// cloning).
    pub description: ModelDescription,
    /// The engine's defaults: generation_config.json overridden by the stage config.
    pub base_sampling: SamplingParams,
    /// Audio samples per codec frame (1920 at 24 kHz for Qwen3-TTS, 2048 at 44.1 kHz for Fish).
    pub samples_per_frame: usize,
    /// Codec frames in an utterance's first audio chunk.
    pub first_chunk_frames: usize,
    /// Chunk size of requests when the `chunk-frames` property is 0 (`None`: the stage config's).
    pub default_chunk_frames: Option<usize>,
}

/// Matches `value` case-insensitively against `list`, returning the list's spelling.
fn find_ci<'a>(list: &'a [String], value: &str) -> Option<&'a String> {
    list.iter().find(|s| s.eq_ignore_ascii_case(value.trim()))
}

/// Builds the engine request for `text` from the property values `s`, and the reference voice it
/// is to be spoken in (Base checkpoints; the caller turns it into the request's voice-clone
/// prompt with a [`VoiceCloner`](super::voice_clone::VoiceCloner)). Errors name the property and
/// its value: text with nothing to speak (nothing at all, or no letter or digit), an unknown
/// speaker or language (names and ISO 639-1 codes are accepted), voice-clone properties that do
/// not fit the checkpoint.
pub(crate) fn build_request(
    s: &SynthesisSettings,
    info: &ModelInfo,
    text: &str,
) -> Result<(EngineRequest, Option<CloneSpec>), InputError> {
    if let Some(why) = unspeakable(text) {
        return Err(input_error("text", text, why));
    }
    let d = &info.description;
    let speaker = match s
        .speaker
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        Some(v) => match find_ci(&d.speakers, v) {
            Some(name) => Some(name.clone()),
            None if d.speakers.is_empty() => {
                return Err(input_error(
                    "speaker",
                    v,
                    format!(
                        "model '{}' ({}) has no preset speakers; leave speaker unset",
                        info.model, d.name
                    ),
                ));
            }
            None => {
                return Err(input_error(
                    "speaker",
                    v,
                    format!("unknown speaker; available: {}", d.speakers.join(", ")),
                ));
            }
        },
        // A checkpoint that needs a speaker (CustomVoice) names its default.
        None => d.default_speaker.clone(),
    };
    let lang = s.language.trim();
    let language = if lang.is_empty() || lang.eq_ignore_ascii_case("auto") {
        None
    } else if d.languages.is_empty() {
        return Err(input_error(
            "language",
            lang,
            format!(
                "model '{}' ({}) takes no language setting (it reads the text as written): \
                 leave language unset or auto",
                info.model, d.name
            ),
        ));
    } else {
        // A name or its ISO 639-1 code (`en`, `ZH`, ...), case-insensitive.
        let name = resolve_language(&d.languages, lang)
            .map_err(|why| input_error("language", lang, why))?;
        (name != "auto").then_some(name)
    };
    let instruct = s
        .instruct
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    if let (Some(i), InstructUse::Unsupported) = (&instruct, &d.instruct) {
        return Err(input_error(
            "instruct",
            i,
            format!(
                "model '{}' ({}) has no instruct (style or voice description): leave \
                 instruct unset",
                info.model, d.name
            ),
        ));
    }
    let prompt_mode = s.prompt_mode.prompt_mode();
    if let (Some(m), false) = (prompt_mode, d.prompt_modes) {
        return Err(input_error(
            "prompt-mode",
            &m.to_string(),
            format!(
                "model '{}' ({}) has one prompt form (the prompt mode is Qwen3-TTS's): leave \
                 prompt-mode auto",
                info.model, d.name
            ),
        ));
    }
    let clone = clone_spec(
        d,
        &info.model,
        s.ref_audio.as_deref(),
        s.ref_text.as_deref(),
        s.x_vector_only,
    )?;
    let request = EngineRequest {
        voice: VoiceRequest {
            text: text.to_string(),
            speaker,
            language,
            instruct,
            prompt_mode,
            voice_clone: None,
        },
        sampling: sampling(s, &info.base_sampling),
        initial_chunk_frames: s.initial_chunk(),
        chunk_frames: s.chunk().or(info.default_chunk_frames),
    };
    Ok((request, clone))
}

/// The complete request for `text`, checked as far as it can be before the engine runs it: the
/// settings against the checkpoint ([`build_request`]), the reference voice (Base: decoded by
/// `cloner` once per recording and encoded by the engine once per recording, transcript and
/// mode, so a new reference takes that long here), and the engine's own checks of the request
/// ([`validated`]), a text too long for one utterance among them. What is left for the engine to
/// refuse later: a full engine at submit time (`EngineError::Busy`) and failures of the engine
/// itself.
pub(crate) fn checked_request(
    s: &SynthesisSettings,
    info: &ModelInfo,
    engine: &Engine,
    cloner: &Mutex<VoiceCloner>,
    text: &str,
) -> Result<EngineRequest, InputError> {
    let (mut request, clone) = build_request(s, info, text)?;
    if let Some(spec) = clone {
        let mut cloner = cloner.lock().unwrap_or_else(|p| p.into_inner());
        request.voice.voice_clone = Some(cloner.prompt(engine, &spec)?);
    }
    validated(engine, &request)?;
    Ok(request)
}

/// The engine's own checks of `request` ([`Engine::validate`]: the model's rules, the sampling
/// values and chunk sizes, and that the text is not too long for one utterance, for which a
/// long text is tokenized here); errors name the property behind the request's field.
pub(crate) fn validated(engine: &Engine, request: &EngineRequest) -> Result<(), InputError> {
    engine.validate(request).map_err(|e| match e {
        EngineError::InvalidRequest { field, value, msg } => {
            input_error(property_of(&field), &value, msg)
        }
        other => input_error("text", &request.voice.text, other.to_string()),
    })
}

/// The property behind a field of an engine request (`voice.speaker`, `sampling.top_p`, …).
fn property_of(field: &str) -> &'static str {
    let field = field.strip_prefix("voice.").unwrap_or(field);
    if field == "voice_clone.ref_text" {
        return "ref-text";
    }
    if field.starts_with("voice_clone") {
        return "ref-audio";
    }
    match field.strip_prefix("sampling.").unwrap_or(field) {
        "speaker" => "speaker",
        "language" => "language",
        "instruct" => "instruct",
        "temperature" => "temperature",
        "top_k" => "top-k",
        "top_p" => "top-p",
        "repetition_penalty" => "repetition-penalty",
        "max_new_tokens" => "max-new-tokens",
        "seed" => "seed",
        "chunk_frames" => "chunk-frames",
        "initial_chunk_frames" => "initial-chunk-frames",
        // The code predictor's sampling comes from the stage config.
        f if f.starts_with("subtalker") => "stage-config",
        _ => "text",
    }
}

/// The sampling properties that are set, over `base` (the engine's defaults); greedy when
/// `do-sample` is false or the temperature 0.
fn sampling(s: &SynthesisSettings, base: &SamplingParams) -> SamplingParams {
    let mut sampling = base.clone();
    if let Some(v) = s.temperature {
        sampling.temperature = v;
    }
    if let Some(v) = s.top_k {
        sampling.top_k = v as usize;
    }
    if let Some(v) = s.top_p {
        sampling.top_p = v;
    }
    if let Some(v) = s.repetition_penalty {
        sampling.repetition_penalty = v;
    }
    if let Some(v) = s.max_new_tokens {
        sampling.max_new_tokens = v as usize;
    }
    if let Some(v) = s.seed {
        sampling.seed = v;
    }
    if let Some(v) = s.do_sample {
        sampling.do_sample = v;
    }
    if !sampling.do_sample || sampling.temperature <= 0.0 {
        sampling = sampling.greedy();
    }
    sampling
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::models::qwen3_tts::{GenerationConfig, ModelVariant, served_description};

    /// A Qwen3-TTS checkpoint of `variant` named `m`: CustomVoice speakers aiden and joe,
    /// languages auto, english and german, sampling on.
    pub(crate) fn info(variant: ModelVariant) -> ModelInfo {
        ModelInfo {
            model: "m".into(),
            dir: PathBuf::from("/m"),
            description: served_description(
                variant,
                if variant == ModelVariant::CustomVoice {
                    vec!["aiden".into(), "joe".into()]
                } else {
                    Vec::new()
                },
                vec!["auto".into(), "english".into(), "german".into()],
                variant != ModelVariant::Base,
            ),
            base_sampling: SamplingParams {
                do_sample: true,
                subtalker_do_sample: true,
                temperature: 0.9,
                ..SamplingParams::from_generation_config(&GenerationConfig::default())
            },
            samples_per_frame: 1920,
            first_chunk_frames: 1,
            default_chunk_frames: Some(1),
        }
    }

    #[test]
    fn voice_is_checked_against_the_checkpoint() {
        let cv = info(ModelVariant::CustomVoice);
        let mut s = SynthesisSettings::default();
        let (r, clone) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!(r.voice.speaker.as_deref(), Some("aiden"), "first speaker");
        assert_eq!((r.voice.language, clone), (None, None));
        s.speaker = Some(" JOE ".into());
        s.language = "German".into();
        s.instruct = Some("  ".into());
        let (r, _) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!(r.voice.speaker.as_deref(), Some("joe"));
        assert_eq!(r.voice.language.as_deref(), Some("german"));
        assert_eq!(r.voice.instruct, None, "blank instruct is unset");

        s.speaker = Some("zoe".into());
        let e = build_request(&s, &cv, "Hi.").unwrap_err();
        assert_eq!(e.property, "speaker");
        assert!(e.why.contains("aiden, joe"), "{e}");
        s.speaker = None;
        s.language = "klingon".into();
        let e = build_request(&s, &cv, "Hi.").unwrap_err();
        assert_eq!(e.property, "language");
        assert!(e.why.contains("auto, english (en), german (de)"), "{e}");
        // ISO 639-1 codes name the languages, in any case.
        s.language = "DE".into();
        let (r, _) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!(r.voice.language.as_deref(), Some("german"));
        s.language = "auto".into();
        assert_eq!(
            build_request(&s, &cv, " \u{200B}\t").unwrap_err().property,
            "text"
        );

        let vd = info(ModelVariant::VoiceDesign);
        s.speaker = Some("joe".into());
        let e = build_request(&s, &vd, "Hi.").unwrap_err();
        assert!(e.why.contains("no preset speakers"), "{e}");
        s.speaker = None;
        assert_eq!(build_request(&s, &vd, "Hi.").unwrap().0.voice.speaker, None);
    }

    #[test]
    fn engine_fields_map_to_properties() {
        for (field, property) in [
            ("voice.text", "text"),
            ("voice.language", "language"),
            ("voice.voice_clone", "ref-audio"),
            ("voice.voice_clone.ref_codes", "ref-audio"),
            ("voice.voice_clone.ref_text", "ref-text"),
            ("sampling.top_p", "top-p"),
            ("sampling.max_new_tokens", "max-new-tokens"),
            ("sampling.subtalker_top_p", "stage-config"),
            ("chunk_frames", "chunk-frames"),
        ] {
            assert_eq!(property_of(field), property, "{field}");
        }
    }

    #[test]
    fn sampling_and_chunks_merge_over_the_defaults() {
        let cv = info(ModelVariant::CustomVoice);
        let mut s = SynthesisSettings::default();
        let (r, _) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!(r.sampling, cv.base_sampling);
        assert_eq!((r.initial_chunk_frames, r.chunk_frames), (None, Some(1)));
        s.seed = Some(9);
        s.max_new_tokens = Some(30);
        s.do_sample = Some(false);
        s.initial_chunk_frames = 2;
        s.chunk_frames = 5;
        let (r, _) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!((r.sampling.seed, r.sampling.max_new_tokens), (9, 30));
        assert_eq!(
            r.sampling,
            r.sampling.clone().greedy(),
            "do-sample=false is greedy"
        );
        assert_eq!((r.initial_chunk_frames, r.chunk_frames), (Some(2), Some(5)));
        s.do_sample = Some(true);
        s.temperature = Some(0.0);
        let (r, _) = build_request(&s, &cv, "Hi.").unwrap();
        assert_eq!(
            r.sampling,
            r.sampling.clone().greedy(),
            "temperature 0 is greedy"
        );
    }
}
