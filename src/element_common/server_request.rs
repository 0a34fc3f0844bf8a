//! Settings + text → the speech request for the server (the remote counterpart of
//! [`super::request`]): each synthesis property with a field in vLLM-Omni's request is mapped to
//! it, the others are refused while `server` is set, and what can be checked here (the text, a
//! voice the server listed, the seed's range, the voice-clone properties) is checked here.

use crate::models::qwen3_tts::{ModelVariant, served_description};
use crate::models::tts::text::{LANGUAGE_CODES, unspeakable};
use crate::remote::{SpeechRequest, StreamProtocol, TaskType};

use super::bundled_voice;
use super::input_error::{InputError, input_error};
use super::settings::{PromptModeSetting, SynthesisSettings};
use super::voice_clone::{CloneSpec, clone_spec};

/// What the element knows of the server it speaks through; fixed from start to stop.
#[derive(Debug, Clone)]
pub(crate) struct ServerTarget {
    /// The server's base URL (for messages).
    pub url: String,
    /// `server-model`, sent as the request's `model`.
    pub request_model: Option<String>,
    /// The served model: `server-model`, else the first the server lists (for messages).
    pub served_model: Option<String>,
    /// The voices the server lists (`GET /v1/audio/voices`, uploaded ones included), if it does.
    pub voices: Option<Vec<String>>,
    /// The voices uploaded to the server (`uploaded_voices` of its listing): Base voices by name.
    pub uploaded_voices: Vec<String>,
    /// The checkpoint variant: `server-task-type`, else what the served model's name or its
    /// `root` tells.
    pub variant: Option<ModelVariant>,
    /// The stream form asked for.
    pub protocol: StreamProtocol,
}

/// The checkpoint variant a served model's name ends in (`…-CustomVoice`, `…-VoiceDesign`,
/// `…-Base`, after `/`, `-`, `_` or `.`), as vLLM-Omni infers a checkpoint's variant from its path
/// when the config does not say (tts_adapters/qwen3_tts.py `_get_model_variant`, commit
/// 078de2d14c2fcc670c1e0dd492e1b84a69c69d15).
pub(crate) fn variant_of_name(name: &str) -> Option<ModelVariant> {
    let last = name
        .trim_end_matches(['/', '\\'])
        .rsplit(['/', '\\'])
        .next()?
        .to_ascii_lowercase();
    let tokens: Vec<&str> = last.split(['-', '_', '.']).collect();
    let n = tokens.len();
    let tail = |k: usize| (n >= k).then(|| tokens[n - k..].concat());
    if tail(1).as_deref() == Some("base") {
        return Some(ModelVariant::Base);
    }
    [tail(1), tail(2)]
        .into_iter()
        .flatten()
        .find_map(|t| match t.as_str() {
            "customvoice" => Some(ModelVariant::CustomVoice),
            "voicedesign" => Some(ModelVariant::VoiceDesign),
            _ => None,
        })
}

/// The variant the server runs: `server-task-type` when set, else what the served name tells,
/// else what its checkpoint (`root` in `GET /v1/models`) tells.
pub(crate) fn server_variant(
    task_type: Option<ModelVariant>,
    served_model: Option<&str>,
    root: Option<&str>,
) -> Option<ModelVariant> {
    task_type
        .or_else(|| served_model.and_then(variant_of_name))
        .or_else(|| root.and_then(variant_of_name))
}

/// vLLM-Omni's limits on a Qwen3-TTS speech request (serving_speech.py
/// `_TTS_MAX_INSTRUCTIONS_LENGTH`, `_TTS_MAX_NEW_TOKENS_MAX`, `_REF_AUDIO_MIN_DURATION`,
/// `_REF_AUDIO_MAX_DURATION`): a request past them is answered 400, so they are checked before.
pub(crate) mod limits {
    /// Most characters of `instructions`.
    pub const MAX_INSTRUCTIONS_CHARS: usize = 500;
    /// Largest `max_new_tokens`.
    pub const MAX_NEW_TOKENS: u32 = 4096;
    /// Shortest reference recording, seconds.
    pub const MIN_REF_AUDIO_S: f64 = 1.0;
    /// Longest reference recording, seconds.
    pub const MAX_REF_AUDIO_S: f64 = 30.0;
}

/// Checks a reference recording of `samples` (24 kHz) from `location` against the server's
/// bounds; the error names `ref-audio`, the recording and its length.
pub(crate) fn check_server_reference(location: &str, samples: usize) -> Result<(), InputError> {
    let secs = samples as f64 / crate::remote::SAMPLE_RATE as f64;
    if (limits::MIN_REF_AUDIO_S..=limits::MAX_REF_AUDIO_S).contains(&secs) {
        return Ok(());
    }
    Err(input_error(
        "ref-audio",
        location,
        format!(
            "is {secs:.2} s long; the speech server takes references of {:.0} to {:.0} s \
             (vLLM-Omni refuses others), so trim or pick another recording",
            limits::MIN_REF_AUDIO_S,
            limits::MAX_REF_AUDIO_S
        ),
    ))
}

/// Why a synthesis property cannot apply with `server` set: vLLM-Omni's speech request has no
/// field for it (the server's own stage config and checkpoint decide).
fn no_field(property: &'static str, value: &str) -> InputError {
    input_error(
        property,
        value,
        "has no field in vLLM-Omni's speech request, so it cannot apply with server set (the \
         server's stage config decides); leave it unset",
    )
}

/// The first of `properties` (name, value when set) that is set, refused.
fn refuse_set(properties: Vec<(&'static str, Option<String>)>) -> Result<(), InputError> {
    match properties.into_iter().find_map(|(p, v)| v.map(|v| (p, v))) {
        Some((property, value)) => Err(no_field(property, &value)),
        None => Ok(()),
    }
}

/// A string property's value when set (not blank).
fn set(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .filter(|v| !v.trim().is_empty())
        .map(str::to_string)
}

/// Refuses, at start, the properties that choose the local engine and have no request field
/// when `server` is set: `model` (other than the default), `stage-config`, `ar-device`,
/// `decoder-device`, `shared-engine=false`, `quantization`. They can change only in NULL or
/// READY.
pub(crate) fn check_no_local_engine(s: &SynthesisSettings) -> Result<(), InputError> {
    if s.model != bundled_voice::default_model() {
        return Err(input_error(
            "model",
            &s.model,
            "the server's model speaks when server is set; leave model unset (server-model names \
             a model the server serves)",
        ));
    }
    refuse_set(vec![
        ("stage-config", set(&s.stage_config)),
        ("ar-device", set(&s.ar_device)),
        ("decoder-device", set(&s.decoder_device)),
        (
            "shared-engine",
            (!s.shared_engine).then(|| "false".to_string()),
        ),
        (
            "quantization",
            s.quantization
                .quantization()
                .map(|q| q.name().replace('_', "-")),
        ),
    ])
}

/// Refuses, for each utterance, the synthesis properties that have no request field when
/// `server` is set: `do-sample`, `repetition-penalty`, `chunk-frames` (the server's stage config
/// decides them). `temperature`, `top-k` and `top-p` travel in `extra_params`.
pub(crate) fn check_no_field(s: &SynthesisSettings) -> Result<(), InputError> {
    refuse_set(vec![
        ("do-sample", s.do_sample.map(|v| v.to_string())),
        (
            "repetition-penalty",
            s.repetition_penalty.map(|v| v.to_string()),
        ),
        (
            "chunk-frames",
            (s.chunk_frames != 0).then(|| s.chunk_frames.to_string()),
        ),
    ])
}

/// A language name as vLLM-Omni lists them (`English`, `Chinese`, …; Python's `str.title()`).
fn title_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut prev_letter = false;
    for c in name.chars() {
        if c.is_alphabetic() {
            if prev_letter {
                out.extend(c.to_lowercase());
            } else {
                out.extend(c.to_uppercase());
            }
            prev_letter = true;
        } else {
            out.push(c);
            prev_letter = false;
        }
    }
    out
}

/// The speech request for `text` from the property values `s`, and the reference voice (the
/// caller puts it in the request as a data URL). Errors name the property and its value: text
/// with nothing to speak, a property without a request field, a speaker the server does not list,
/// a seed past int64, voice-clone properties that do not fit.
pub(crate) fn build_speech_request(
    s: &SynthesisSettings,
    t: &ServerTarget,
    text: &str,
) -> Result<(SpeechRequest, Option<CloneSpec>), InputError> {
    if let Some(why) = unspeakable(text) {
        return Err(input_error("text", text, why));
    }
    check_no_field(s)?;
    let mut r = SpeechRequest::new(text, t.protocol);
    r.model = t.request_model.clone();
    let model = t.served_model.as_deref().unwrap_or(&t.url);
    if let Some(v) = s
        .speaker
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        if let Some(voices) = &t.voices {
            match voices.iter().find(|n| n.eq_ignore_ascii_case(v)) {
                Some(name) => r.voice = Some(name.clone()),
                None if voices.is_empty() => {
                    return Err(input_error(
                        "speaker",
                        v,
                        format!("the server lists no voices for '{model}'; leave speaker unset"),
                    ));
                }
                None => {
                    return Err(input_error(
                        "speaker",
                        v,
                        format!(
                            "the server has no such voice; it lists: {}",
                            voices.join(", ")
                        ),
                    ));
                }
            }
        } else {
            r.voice = Some(v.to_string());
        }
    }
    let lang = s.language.trim();
    if !lang.is_empty() && !lang.eq_ignore_ascii_case("auto") {
        let lower = lang.to_lowercase();
        let name = LANGUAGE_CODES
            .iter()
            .find(|(code, _)| *code == lower)
            .map_or(lower.as_str(), |(_, name)| name);
        r.language = Some(title_case(name));
    }
    r.instructions = s
        .instruct
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    if let Some(i) = &r.instructions
        && i.chars().count() > limits::MAX_INSTRUCTIONS_CHARS
    {
        return Err(input_error(
            "instruct",
            i,
            format!(
                "has {} characters; the speech server takes at most {}",
                i.chars().count(),
                limits::MAX_INSTRUCTIONS_CHARS
            ),
        ));
    }
    let mut extra = serde_json::Map::new();
    if let Some(t) = s.temperature {
        extra.insert("temperature".into(), serde_json::json!(t));
    }
    if let Some(p) = s.top_p {
        extra.insert("top_p".into(), serde_json::json!(p));
    }
    if let Some(k) = s.top_k {
        extra.insert("top_k".into(), serde_json::json!(k));
    }
    r.extra_params = (!extra.is_empty()).then_some(extra);
    r.non_streaming_mode = match s.prompt_mode {
        PromptModeSetting::Auto => None,
        PromptModeSetting::Streaming => Some(false),
        PromptModeSetting::NonStreaming => Some(true),
    };
    if let Some(m) = s.max_new_tokens
        && m > limits::MAX_NEW_TOKENS
    {
        return Err(input_error(
            "max-new-tokens",
            &m.to_string(),
            format!(
                "the speech server takes at most {} (vLLM-Omni's limit)",
                limits::MAX_NEW_TOKENS
            ),
        ));
    }
    r.max_new_tokens = s.max_new_tokens;
    if let Some(seed) = s.seed {
        r.seed = Some(i64::try_from(seed).map_err(|_| {
            input_error(
                "seed",
                &seed.to_string(),
                format!("the server takes seeds up to {} (int64)", i64::MAX),
            )
        })?);
    }
    r.initial_codec_chunk_frames = (s.initial_chunk_frames > 0).then_some(s.initial_chunk_frames);
    let has_clone = s.ref_audio.as_deref().is_some_and(|a| !a.trim().is_empty())
        || s.ref_text.as_deref().is_some_and(|a| !a.trim().is_empty())
        || s.x_vector_only;
    // An unknown variant: the voice-clone properties make it a Base request (as the server
    // infers it from ref_audio).
    let is_uploaded = r
        .voice
        .as_deref()
        .is_some_and(|v| t.uploaded_voices.iter().any(|u| u.eq_ignore_ascii_case(v)));
    let variant = t.variant.unwrap_or(if has_clone || is_uploaded {
        ModelVariant::Base
    } else {
        ModelVariant::CustomVoice
    });
    // A Base server speaks a voice uploaded to it (POST /v1/audio/voices) by name, without a
    // reference; the name was checked against its voice list above.
    let uploaded_voice = variant == ModelVariant::Base
        && r.voice.is_some()
        && s.ref_audio.as_deref().is_none_or(|a| a.trim().is_empty());
    if uploaded_voice && s.ref_text.as_deref().is_some_and(|a| !a.trim().is_empty()) {
        return Err(input_error(
            "ref-text",
            s.ref_text.as_deref().unwrap_or(""),
            "needs ref-audio; a voice uploaded to the server (speaker) has its own transcript",
        ));
    }
    let clone = if uploaded_voice {
        None
    } else {
        clone_spec(
            &served_description(variant, Vec::new(), Vec::new(), false),
            model,
            s.ref_audio.as_deref(),
            s.ref_text.as_deref(),
            s.x_vector_only,
        )?
    };
    if variant == ModelVariant::VoiceDesign && r.instructions.is_none() {
        return Err(input_error(
            "instruct",
            s.instruct.as_deref().unwrap_or(""),
            format!(
                "model '{model}' is a VoiceDesign checkpoint, which speaks in the voice instruct \
                 describes; the server refuses a request without one: set instruct"
            ),
        ));
    }
    if let Some(spec) = &clone {
        if !spec.x_vector_only && spec.ref_text.is_none() {
            return Err(input_error(
                "ref-text",
                "",
                "in-context cloning needs the transcript of ref-audio; set ref-text, or \
                 x-vector-only=true",
            ));
        }
        r.ref_text = spec.ref_text.clone();
        r.x_vector_only_mode = Some(spec.x_vector_only);
    }
    r.task_type = match (t.variant, &clone) {
        (_, Some(_)) | (Some(ModelVariant::Base), _) => Some(TaskType::Base),
        (None, None) if is_uploaded => Some(TaskType::Base),
        (Some(ModelVariant::VoiceDesign), None) => Some(TaskType::VoiceDesign),
        (Some(ModelVariant::CustomVoice), None) => Some(TaskType::CustomVoice),
        (None, None) => None,
    };
    Ok((r, clone))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> ServerTarget {
        ServerTarget {
            url: "http://h:1".into(),
            request_model: None,
            served_model: Some("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice".into()),
            voices: Some(vec!["vivian".into(), "ryan".into()]),
            uploaded_voices: Vec::new(),
            variant: Some(ModelVariant::CustomVoice),
            protocol: StreamProtocol::Pcm,
        }
    }

    fn json(r: &SpeechRequest) -> serde_json::Value {
        serde_json::from_slice(&r.to_json()).unwrap()
    }

    #[test]
    fn variants_from_names() {
        for (name, v) in [
            (
                "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
                Some(ModelVariant::CustomVoice),
            ),
            (
                "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
                Some(ModelVariant::VoiceDesign),
            ),
            (
                "/models/qwen3_tts_voice_design/",
                Some(ModelVariant::VoiceDesign),
            ),
            ("Qwen/Qwen3-TTS-12Hz-0.6B-Base", Some(ModelVariant::Base)),
            ("my-tts", None),
            ("database", None),
        ] {
            assert_eq!(variant_of_name(name), v, "{name}");
        }
    }

    #[test]
    fn every_request_field_is_mapped() {
        let mut s = SynthesisSettings::default();
        let (r, clone) = build_speech_request(&s, &target(), "Hello.").unwrap();
        assert!(clone.is_none());
        assert_eq!(
            json(&r),
            serde_json::json!({"input": "Hello.", "task_type": "CustomVoice", "stream": true,
                "stream_format": "audio", "response_format": "pcm", "sample_rate": 24000})
        );
        s.speaker = Some("Ryan".into());
        s.language = "de".into();
        s.instruct = Some(" cheerful ".into());
        s.prompt_mode = PromptModeSetting::Streaming;
        s.max_new_tokens = Some(300);
        s.seed = Some(5);
        s.initial_chunk_frames = 2;
        let mut t = target();
        t.request_model = Some("tts".into());
        t.protocol = StreamProtocol::Sse;
        let (r, _) = build_speech_request(&s, &t, "Hallo.").unwrap();
        let v = json(&r);
        assert_eq!(v["voice"], "ryan");
        assert_eq!(v["language"], "German");
        assert_eq!(v["instructions"], "cheerful");
        assert_eq!(v["non_streaming_mode"], false);
        assert_eq!(v["max_new_tokens"], 300);
        assert_eq!(v["seed"], 5);
        assert_eq!(v["initial_codec_chunk_frames"], 2);
        assert_eq!(v["model"], "tts");
        assert_eq!(v["stream_format"], "sse");
        s.language = "sichuan_dialect".into();
        let (r, _) = build_speech_request(&s, &t, "x").unwrap();
        assert_eq!(json(&r)["language"], "Sichuan_Dialect");
    }

    #[test]
    fn what_cannot_be_sent_is_refused() {
        let t = target();
        type Case = (&'static str, Box<dyn Fn(&mut SynthesisSettings)>);
        let at_start: Vec<Case> = vec![
            ("model", Box::new(|s| s.model = "/m".into())),
            (
                "stage-config",
                Box::new(|s| s.stage_config = Some("a.yaml".into())),
            ),
            ("ar-device", Box::new(|s| s.ar_device = Some("cpu".into()))),
            (
                "decoder-device",
                Box::new(|s| s.decoder_device = Some("cpu".into())),
            ),
            ("shared-engine", Box::new(|s| s.shared_engine = false)),
            (
                "quantization",
                Box::new(|s| s.quantization = super::super::settings::QuantizationSetting::Q8_0),
            ),
        ];
        assert!(check_no_local_engine(&SynthesisSettings::default()).is_ok());
        for (property, set) in at_start {
            let mut s = SynthesisSettings::default();
            set(&mut s);
            let e = check_no_local_engine(&s).unwrap_err();
            assert_eq!(e.property, property, "{e}");
            assert!(e.why.contains("server"), "{e}");
        }
        let cases: Vec<Case> = vec![
            ("do-sample", Box::new(|s| s.do_sample = Some(false))),
            (
                "max-new-tokens",
                Box::new(|s| s.max_new_tokens = Some(4097)),
            ),
            ("instruct", Box::new(|s| s.instruct = Some("é".repeat(501)))),
            (
                "repetition-penalty",
                Box::new(|s| s.repetition_penalty = Some(1.1)),
            ),
            ("chunk-frames", Box::new(|s| s.chunk_frames = 4)),
            ("seed", Box::new(|s| s.seed = Some(u64::MAX))),
            ("speaker", Box::new(|s| s.speaker = Some("zoe".into()))),
            (
                "ref-audio",
                Box::new(|s| s.ref_audio = Some("r.wav".into())),
            ),
        ];
        for (property, set) in cases {
            let mut s = SynthesisSettings::default();
            set(&mut s);
            let e = build_speech_request(&s, &t, "Hello.").unwrap_err();
            assert_eq!(e.property, property, "{e}");
        }
        let e = build_speech_request(&SynthesisSettings::default(), &t, "!!!").unwrap_err();
        assert_eq!(e.property, "text");
        let s = SynthesisSettings {
            speaker: Some("zoe".into()),
            ..SynthesisSettings::default()
        };
        let e = build_speech_request(&s, &t, "Hi").unwrap_err();
        assert!(e.why.contains("vivian, ryan"), "{e}");
    }

    #[test]
    fn sampling_goes_in_extra_params_within_the_server_limits() {
        let s = SynthesisSettings {
            temperature: Some(0.5),
            top_p: Some(0.8),
            top_k: Some(30),
            max_new_tokens: Some(limits::MAX_NEW_TOKENS),
            instruct: Some("é".repeat(500)),
            ..SynthesisSettings::default()
        };
        let (r, _) = build_speech_request(&s, &target(), "Hi").unwrap();
        let v = json(&r);
        assert_eq!(
            v["extra_params"],
            serde_json::json!({"temperature": 0.5, "top_p": 0.8, "top_k": 30})
        );
        assert_eq!(v["max_new_tokens"], 4096);
        let e = build_speech_request(
            &SynthesisSettings {
                max_new_tokens: Some(5000),
                ..SynthesisSettings::default()
            },
            &target(),
            "Hi",
        )
        .unwrap_err();
        assert!(e.why.contains("4096"), "{e}");
        assert!(
            json(
                &build_speech_request(&SynthesisSettings::default(), &target(), "Hi")
                    .unwrap()
                    .0
            )
            .get("extra_params")
            .is_none()
        );
    }

    #[test]
    fn the_variant_comes_from_the_property_the_name_or_the_root() {
        let vd = Some(ModelVariant::VoiceDesign);
        assert_eq!(
            server_variant(
                None,
                Some("my-tts"),
                Some("/m/Qwen3-TTS-12Hz-1.7B-VoiceDesign")
            ),
            vd
        );
        assert_eq!(
            server_variant(None, Some("x-Base"), Some("/m/y-VoiceDesign")),
            Some(ModelVariant::Base)
        );
        assert_eq!(server_variant(vd, Some("x-Base"), None), vd);
        assert_eq!(server_variant(None, Some("my-tts"), Some("/m/ckpt")), None);
        // VoiceDesign needs instruct.
        let mut t = target();
        t.variant = vd;
        t.voices = Some(Vec::new());
        let e = build_speech_request(&SynthesisSettings::default(), &t, "Hi").unwrap_err();
        assert_eq!(e.property, "instruct");
        let s = SynthesisSettings {
            instruct: Some("A calm voice.".into()),
            ..SynthesisSettings::default()
        };
        let (r, _) = build_speech_request(&s, &t, "Hi").unwrap();
        assert_eq!(json(&r)["task_type"], "VoiceDesign");
    }

    #[test]
    fn an_uploaded_voice_is_a_base_request_without_a_reference() {
        let mut t = target();
        t.variant = None;
        t.voices = Some(vec!["narrator".into()]);
        t.uploaded_voices = vec!["Narrator".into()];
        let s = SynthesisSettings {
            speaker: Some("NARRATOR".into()),
            ..SynthesisSettings::default()
        };
        for variant in [None, Some(ModelVariant::Base)] {
            t.variant = variant;
            let (r, clone) = build_speech_request(&s, &t, "Hi").unwrap();
            assert!(clone.is_none());
            let v = json(&r);
            assert_eq!(v["voice"], "narrator");
            assert_eq!(v["task_type"], "Base");
            assert!(v.get("ref_audio").is_none() && v.get("x_vector_only_mode").is_none());
        }
    }

    #[test]
    fn server_reference_bounds() {
        assert!(check_server_reference("r.wav", 24_000).is_ok());
        assert!(check_server_reference("r.wav", 30 * 24_000).is_ok());
        for (n, len) in [(16_800, "0.70 s"), (40 * 24_000, "40.00 s")] {
            let e = check_server_reference("r.wav", n).unwrap_err();
            assert_eq!(e.property, "ref-audio");
            assert!(e.why.contains(len) && e.why.contains("1 to 30 s"), "{e}");
        }
    }

    #[test]
    fn a_reference_makes_a_base_request() {
        let mut t = target();
        t.variant = None;
        let mut s = SynthesisSettings {
            ref_audio: Some("ref.wav".into()),
            ..SynthesisSettings::default()
        };
        let e = build_speech_request(&s, &t, "Hi").unwrap_err();
        assert_eq!(e.property, "ref-text");
        s.ref_text = Some("the words".into());
        let (r, clone) = build_speech_request(&s, &t, "Hi").unwrap();
        assert_eq!(clone.unwrap().location, "ref.wav");
        let v = json(&r);
        assert_eq!(v["task_type"], "Base");
        assert_eq!(v["ref_text"], "the words");
        assert_eq!(v["x_vector_only_mode"], false);
        s.x_vector_only = true;
        let (r, _) = build_speech_request(&s, &t, "Hi").unwrap();
        let v = json(&r);
        assert_eq!(v["x_vector_only_mode"], true);
        assert!(v.get("ref_text").is_none());
        t.variant = Some(ModelVariant::Base);
        s.ref_audio = None;
        s.ref_text = None;
        s.x_vector_only = false;
        assert_eq!(
            build_speech_request(&s, &t, "Hi").unwrap_err().property,
            "ref-audio"
        );
    }
}
