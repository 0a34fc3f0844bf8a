//! Voice changes mid-stream: the `omnitts/voice` custom downstream event, and the `speaker-map`
//! property that turns the transcribers' `rstranscribe/speaker-change` events into voices.
//!
//! Both carry a [`VoiceChange`]: some of the voice properties (`speaker`, `instruct`, `language`,
//! and for Base checkpoints `ref-audio`, `ref-text`, `x-vector-only`). It applies to the cues that
//! arrive after it, over the element's properties; a field set to "" goes back to the property.
//! `omnitts/voice` changes only the fields it names. A speaker change replaces the whole change
//! with the speaker's `speaker-map` entry (an unmapped or absent label: the properties' voice).

use std::collections::HashMap;

use crate::element_common::input_error::{InputError, input_error};
use crate::element_common::settings::SynthesisSettings;
use crate::models::tts::{InstructUse, ModelDescription, ReferenceUse};

/// Name of the custom downstream event that changes the voice of the cues after it.
pub const VOICE_EVENT: &str = "omnitts/voice";
/// Name of the transcribers' speaker-change event (field `speaker`, a string label, or none).
pub const SPEAKER_CHANGE_EVENT: &str = "rstranscribe/speaker-change";

/// The fields a [`VoiceChange`] structure may have.
const FIELDS: &str = "speaker, instruct, language, ref-audio, ref-text, x-vector-only";

/// The [`FIELDS`] a checkpoint described by `d` takes: `speaker` with preset speakers,
/// `instruct` unless it refuses one, `language` with languages, `ref-audio` and `ref-text` when
/// it clones, `x-vector-only` when it has a speaker-embedding mode.
fn fields_for(d: &ModelDescription) -> String {
    let clones = d.reference.use_ != ReferenceUse::Unsupported;
    [
        ("speaker", !d.speakers.is_empty()),
        ("instruct", d.instruct != InstructUse::Unsupported),
        ("language", !d.languages.is_empty()),
        ("ref-audio", clones),
        ("ref-text", clones),
        (
            "x-vector-only",
            clones && d.reference.speaker_embedding_only,
        ),
    ]
    .iter()
    .filter(|(_, takes)| *takes)
    .map(|(f, _)| *f)
    .collect::<Vec<_>>()
    .join(", ")
}

/// The string (or NULL) value of an event's `field`; another type is an error naming both.
fn string_field(field: &str, value: &gst::glib::Value) -> Result<Option<String>, String> {
    value
        .get::<Option<String>>()
        .map_err(|_| format!("field '{field}' must be a string, not {value:?}"))
}

/// The label of an [`SPEAKER_CHANGE_EVENT`] `s`: its `speaker` field (absent or NULL: none).
/// One of another type is an error naming the field and the value, as in a [`VOICE_EVENT`].
pub fn speaker_label(s: &gst::StructureRef) -> Result<Option<String>, String> {
    s.value("speaker")
        .map_or(Ok(None), |value| string_field("speaker", value))
}

/// Voice properties to use instead of the element's; `None`: the property's value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoiceChange {
    pub speaker: Option<String>,
    pub instruct: Option<String>,
    pub language: Option<String>,
    pub ref_audio: Option<String>,
    pub ref_text: Option<String>,
    pub x_vector_only: Option<bool>,
}

impl VoiceChange {
    /// The change a structure (an event's, or a `speaker-map` entry's) describes. Errors name
    /// the field: one not in [`FIELDS`], or of the wrong type.
    pub fn from_structure(s: &gst::StructureRef) -> Result<VoiceChange, String> {
        let mut v = VoiceChange::default();
        for (field, value) in s.iter() {
            let field = field.as_str();
            if field == "x-vector-only" {
                v.x_vector_only = Some(value.get::<bool>().map_err(|_| {
                    format!("field 'x-vector-only' must be a boolean, not {value:?}")
                })?);
                continue;
            }
            let slot = match field {
                "speaker" => &mut v.speaker,
                "instruct" => &mut v.instruct,
                "language" => &mut v.language,
                "ref-audio" => &mut v.ref_audio,
                "ref-text" => &mut v.ref_text,
                other => return Err(format!("unknown field '{other}'; the fields are {FIELDS}")),
            };
            *slot = Some(string_field(field, value)?.unwrap_or_default());
        }
        Ok(v)
    }

    /// The fields `later` names, over these.
    pub fn merge(&mut self, later: &VoiceChange) {
        fn over<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
            if b.is_some() {
                a.clone_from(b);
            }
        }
        over(&mut self.speaker, &later.speaker);
        over(&mut self.instruct, &later.instruct);
        over(&mut self.language, &later.language);
        over(&mut self.ref_audio, &later.ref_audio);
        over(&mut self.ref_text, &later.ref_text);
        over(&mut self.x_vector_only, &later.x_vector_only);
    }

    /// The element's settings `s` with this change; "" keeps the property's value.
    pub fn apply(&self, s: &SynthesisSettings) -> SynthesisSettings {
        fn set(to: &mut Option<String>, v: &Option<String>) {
            if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
                *to = Some(v.to_string());
            }
        }
        let mut s = s.clone();
        set(&mut s.speaker, &self.speaker);
        set(&mut s.instruct, &self.instruct);
        set(&mut s.ref_audio, &self.ref_audio);
        set(&mut s.ref_text, &self.ref_text);
        if let Some(l) = self.language.as_deref().filter(|l| !l.is_empty()) {
            s.language = l.to_string();
        }
        if let Some(x) = self.x_vector_only {
            s.x_vector_only = x;
        }
        s
    }
}

impl std::fmt::Display for VoiceChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        let fields = [
            ("speaker", &self.speaker),
            ("instruct", &self.instruct),
            ("language", &self.language),
            ("ref-audio", &self.ref_audio),
            ("ref-text", &self.ref_text),
        ];
        for (name, v) in fields {
            if let Some(v) = v {
                parts.push(format!("{name}={v:?}"));
            }
        }
        if let Some(x) = self.x_vector_only {
            parts.push(format!("x-vector-only={x}"));
        }
        f.write_str(&parts.join(", "))
    }
}

/// The `speaker-map` property, read for a checkpoint: speaker label → voice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpeakerMap(HashMap<String, VoiceChange>);

impl SpeakerMap {
    /// Reads `map` (any structure name; each field a speaker label): a string value names the
    /// voice in the way the checkpoint `d` has voices — a preset `speaker` (it has presets), a
    /// voice description, `instruct` (its voice comes from one), or a reference recording,
    /// `ref-audio`, cloned from its speaker embedding alone (`x-vector-only`; a checkpoint that
    /// requires a reference and has that mode); a structure value gives the [`VoiceChange`]
    /// fields. Errors name the property and the label, also for a string on a checkpoint that
    /// has none of these (use a structure there).
    pub fn parse(
        map: Option<&gst::StructureRef>,
        d: &ModelDescription,
    ) -> Result<SpeakerMap, InputError> {
        let mut out = HashMap::new();
        let Some(map) = map else {
            return Ok(SpeakerMap(out));
        };
        for (label, value) in map.iter() {
            let label = label.as_str();
            // Named by its label: the whole map, serialized, is escaped past reading.
            let bad = |why: String| input_error("speaker-map", label, why);
            let change = if let Ok(s) = value.get::<String>() {
                let mut v = VoiceChange::default();
                if !d.speakers.is_empty() {
                    v.speaker = Some(s);
                } else if d.instruct == InstructUse::Required {
                    v.instruct = Some(s);
                } else if d.reference.use_ == ReferenceUse::Required
                    && d.reference.speaker_embedding_only
                {
                    v.ref_audio = Some(s);
                    v.x_vector_only = Some(true);
                } else {
                    return Err(bad(format!(
                        "model {} has no voice a string could name for this label; give a \
                         structure ({})",
                        d.name,
                        fields_for(d)
                    )));
                }
                v
            } else if let Ok(s) = value.get::<gst::Structure>() {
                VoiceChange::from_structure(&s).map_err(bad)?
            } else {
                return Err(bad(format!(
                    "the label's voice must be a string or a structure ({FIELDS}), \
                     not {value:?}"
                )));
            };
            out.insert(label.to_string(), change);
        }
        Ok(SpeakerMap(out))
    }

    /// The voice of speaker `label`.
    pub fn get(&self, label: &str) -> Option<&VoiceChange> {
        self.0.get(label)
    }

    /// Every (label, voice), sorted by label.
    pub fn entries(&self) -> Vec<(&str, &VoiceChange)> {
        let mut e: Vec<_> = self.0.iter().map(|(k, v)| (k.as_str(), v)).collect();
        e.sort_by_key(|(k, _)| *k);
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::qwen3_tts::{ModelVariant, served_description};
    use std::str::FromStr;

    #[test]
    fn events_merge_and_apply_over_the_properties() {
        gst::init().unwrap();
        let s = gst::Structure::from_str("omnitts/voice, speaker=ryan, instruct=calm").unwrap();
        let mut v = VoiceChange::from_structure(&s).unwrap();
        let later = VoiceChange::from_structure(
            &gst::Structure::builder("omnitts/voice")
                .field("instruct", "")
                .field("language", "english")
                .build(),
        )
        .unwrap();
        v.merge(&later);
        let props = SynthesisSettings {
            instruct: Some("slow".into()),
            ..SynthesisSettings::default()
        };
        let applied = v.apply(&props);
        assert_eq!(applied.speaker.as_deref(), Some("ryan"));
        assert_eq!(
            applied.instruct.as_deref(),
            Some("slow"),
            "\"\": the property"
        );
        assert_eq!(applied.language, "english");
        assert_eq!(
            v.to_string(),
            "speaker=\"ryan\", instruct=\"\", language=\"english\""
        );

        let e = VoiceChange::from_structure(&gst::Structure::from_str("v, spaeker=x").unwrap())
            .unwrap_err();
        assert!(e.contains("unknown field 'spaeker'"), "{e}");
        let e =
            VoiceChange::from_structure(&gst::Structure::from_str("v, speaker=(int)3").unwrap())
                .unwrap_err();
        assert!(e.contains("'speaker' must be a string"), "{e}");
    }

    #[test]
    fn speaker_map_strings_follow_the_variant_and_structures_give_fields() {
        gst::init().unwrap();
        let map = gst::Structure::from_str(
            "map, spk_0=ryan, spk_1=[voice, speaker=aiden, instruct=whisper]",
        )
        .unwrap();
        let d = |v| served_description(v, vec!["ryan".into(), "aiden".into()], vec![], true);
        let (cv, base) = (d(ModelVariant::CustomVoice), d(ModelVariant::Base));
        let base = base_d(&base);
        let m = SpeakerMap::parse(Some(&map), &cv).unwrap();
        assert_eq!(m.get("spk_0").unwrap().speaker.as_deref(), Some("ryan"));
        let v1 = m.get("spk_1").unwrap();
        assert_eq!(
            (v1.speaker.as_deref(), v1.instruct.as_deref()),
            (Some("aiden"), Some("whisper"))
        );
        assert!(m.get("spk_2").is_none());
        let base = SpeakerMap::parse(Some(&map), &base).unwrap();
        let v0 = base.get("spk_0").unwrap();
        assert_eq!(
            (v0.ref_audio.as_deref(), v0.x_vector_only),
            (Some("ryan"), Some(true))
        );
        let bad = gst::Structure::from_str("map, spk_0=(int)1").unwrap();
        let e = SpeakerMap::parse(Some(&bad), &cv).unwrap_err();
        assert_eq!(e.property, "speaker-map");
        assert_eq!(e.value, "spk_0", "{e}");
        assert!(
            e.to_string()
                .starts_with("speaker-map 'spk_0': the label's voice"),
            "{e}"
        );
        // A checkpoint with no voice a string names (one that clones optionally, without
        // presets, instruct or languages): the error lists the fields it takes.
        let mut own_voice = base_d(&cv);
        own_voice.instruct = InstructUse::Unsupported;
        own_voice.languages = vec![];
        own_voice.reference.use_ = ReferenceUse::Optional;
        own_voice.reference.speaker_embedding_only = false;
        let e = SpeakerMap::parse(Some(&map), &own_voice).unwrap_err();
        assert!(
            e.why.contains("give a structure (ref-audio, ref-text)"),
            "{}",
            e.why
        );
    }

    /// `d` without preset speakers.
    fn base_d(d: &ModelDescription) -> ModelDescription {
        ModelDescription {
            speakers: vec![],
            default_speaker: None,
            ..d.clone()
        }
    }
}
