//! Voice settings the checkpoint will not use the way the user expects, warned once per start
//! (a bus warning naming the property): `instruct` on a checkpoint that drops it (its
//! description says why), and a checkpoint that makes its voice from `instruct` without one.
//! (A checkpoint with no instruct at all refuses it: `request.rs`.)

use std::collections::HashSet;
use std::sync::Mutex;

use crate::models::tts::InstructUse;

use super::input_error::quoted;
use super::request::ModelInfo;
use super::settings::SynthesisSettings;

/// What is warned about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum VoiceWarning {
    /// `instruct` is set, and the checkpoint drops it.
    InstructIgnored,
    /// A VoiceDesign checkpoint without `instruct`.
    InstructMissing,
}

/// The warnings that apply to text queued with the settings `s` on the checkpoint `info`.
pub(crate) fn voice_warnings(
    s: &SynthesisSettings,
    info: &ModelInfo,
) -> Vec<(VoiceWarning, String)> {
    let instruct = s
        .instruct
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty());
    let mut out = Vec::new();
    match instruct {
        Some(i) if let InstructUse::Ignored(why) = &info.description.instruct => {
            out.push((
                VoiceWarning::InstructIgnored,
                format!(
                    "instruct '{}': ignored by model '{}': {why}",
                    quoted(i),
                    info.model
                ),
            ));
        }
        None if info.description.instruct == InstructUse::Required => out.push((
            VoiceWarning::InstructMissing,
            format!(
                "instruct is unset: model '{}' is a {} checkpoint, which makes its voice from \
                 the description in instruct; without one the voice is whatever the model \
                 picks: set instruct (e.g. \"A calm, low female voice\")",
                info.model, info.description.name
            ),
        )),
        _ => {}
    }
    out
}

/// The voice warnings already posted since start.
#[derive(Debug, Default)]
pub(crate) struct WarnOnce {
    posted: Mutex<HashSet<VoiceWarning>>,
}

impl WarnOnce {
    /// The warnings for `s` on `info` that were not posted before (now marked as posted).
    pub fn new_warnings(&self, s: &SynthesisSettings, info: &ModelInfo) -> Vec<String> {
        let mut posted = self.posted.lock().unwrap_or_else(|p| p.into_inner());
        voice_warnings(s, info)
            .into_iter()
            .filter(|(w, _)| posted.insert(*w))
            .map(|(_, text)| text)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element_common::request::tests::info;
    use crate::models::qwen3_tts::ModelVariant;

    #[test]
    fn instruct_warnings_name_the_property_once() {
        let once = WarnOnce::default();
        let mut s = SynthesisSettings::default();
        let mut cv = info(ModelVariant::CustomVoice);
        let dropped = cv.description.instruct.clone();
        cv.description.instruct = InstructUse::Ignored(
            "this CustomVoice checkpoint drops it, as the reference does for the 0.6B size; \
             style instructions need a 1.7B CustomVoice or a VoiceDesign checkpoint"
                .into(),
        );
        assert!(
            once.new_warnings(&s, &cv).is_empty(),
            "no instruct, nothing to say"
        );
        s.instruct = Some("  ".into());
        assert!(once.new_warnings(&s, &cv).is_empty(), "blank is unset");
        s.instruct = Some("Whisper.".into());
        let w = once.new_warnings(&s, &cv);
        assert_eq!(w.len(), 1);
        assert!(w[0].starts_with("instruct 'Whisper.': ignored"), "{}", w[0]);
        assert!(w[0].contains("1.7B"), "{}", w[0]);
        assert!(once.new_warnings(&s, &cv).is_empty(), "warned once");
        cv.description.instruct = InstructUse::Used;
        assert_eq!(
            dropped,
            InstructUse::Used,
            "info() describes a 1.7B CustomVoice"
        );
        assert!(
            voice_warnings(&s, &cv).is_empty(),
            "1.7B CustomVoice uses it"
        );
        let base = info(ModelVariant::Base);
        assert!(voice_warnings(&s, &base)[0].1.contains("ref-audio"));

        let vd = info(ModelVariant::VoiceDesign);
        assert!(
            voice_warnings(&s, &vd).is_empty(),
            "VoiceDesign with a description"
        );
        s.instruct = None;
        let w = once.new_warnings(&s, &vd);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("instruct is unset: model 'm' is a Qwen3-TTS VoiceDesign"),
            "{}",
            w[0]
        );
        assert!(once.new_warnings(&s, &vd).is_empty(), "warned once");
    }
}
