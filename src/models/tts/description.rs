//! What a loaded checkpoint is and accepts, so that the engine and the elements need not know
//! its family: output rate and frame size, codebooks, preset speakers, languages, how it uses an
//! instruct, whether and how it clones a reference recording.

use super::ReferenceRules;

/// How a checkpoint treats a request's `instruct` (a style or voice description).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstructUse {
    /// The prompt holds it (Qwen3-TTS 1.7B CustomVoice).
    Used,
    /// The prompt holds it and the voice comes from it: a request without one gets whatever
    /// voice the model picks (Qwen3-TTS VoiceDesign).
    Required,
    /// Accepted and dropped, as the model's reference does; the text says why (Qwen3-TTS Base
    /// and 0.6B CustomVoice).
    Ignored(String),
    /// The model has no instruct: a request with one is refused (Fish S2 Pro).
    Unsupported,
}

/// A loaded checkpoint, described for its callers.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDescription {
    /// config.json's `model_type` (`qwen3_tts`, `fish_qwen3_omni`): the registry key.
    pub model_type: String,
    /// The checkpoint in words, for messages: `Qwen3-TTS CustomVoice`, `Fish Audio S2 Pro`.
    pub name: String,
    /// Output sample rate, Hz (24000 for Qwen3-TTS, 44100 for Fish S2 Pro).
    pub sample_rate: u32,
    /// Output samples per codec frame (1920 for Qwen3-TTS, 2048 for Fish S2 Pro).
    pub samples_per_frame: usize,
    /// Codes per frame (16 for Qwen3-TTS, 10 for Fish S2 Pro).
    pub num_codebooks: usize,
    /// Preset speakers, lower case (empty: none).
    pub speakers: Vec<String>,
    /// The speaker a request without one gets (Qwen3-TTS CustomVoice: the first preset).
    pub default_speaker: Option<String>,
    /// Languages a request may name (`auto` included), lower case; empty: the model takes no
    /// language setting (it reads the text as it is).
    pub languages: Vec<String>,
    /// How it treats `instruct`.
    pub instruct: InstructUse,
    /// Whether and how it clones.
    pub reference: ReferenceRules,
    /// Whether a request may choose the prompt mode (Qwen3-TTS's streaming / non-streaming).
    pub prompt_modes: bool,
    /// Whether text may still arrive while its utterance runs (`Engine::submit_open`).
    pub open_text: bool,
    /// The start of the tags with which a text marks its speakers' turns, for a model that
    /// groups a text's turns into its own generation batches, each speaker keeping its voice
    /// across them (Fish S2 Pro: `<|speaker:`, as in `<|speaker:0|>`): the elements'
    /// `split-sentences=auto` speaks a text holding one whole. `None`: no such markup.
    pub speaker_turn_tag: Option<&'static str>,
}

impl ModelDescription {
    /// Codec frames per second (12.5 for Qwen3-TTS, ~21.53 for Fish S2 Pro).
    pub fn frame_rate(&self) -> f64 {
        f64::from(self.sample_rate) / self.samples_per_frame.max(1) as f64
    }

    /// Frames in `seconds` of audio, rounded up (at least 1 for a positive duration).
    pub fn frames_in(&self, seconds: f64) -> usize {
        (seconds * self.frame_rate()).ceil().max(0.0) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_rate_and_frames_follow_the_codec() {
        let mut d = ModelDescription {
            model_type: "qwen3_tts".into(),
            name: "Qwen3-TTS".into(),
            sample_rate: 24_000,
            samples_per_frame: 1920,
            num_codebooks: 16,
            speakers: vec![],
            default_speaker: None,
            languages: vec![],
            instruct: InstructUse::Unsupported,
            reference: ReferenceRules::none(24_000),
            prompt_modes: true,
            open_text: true,
            speaker_turn_tag: None,
        };
        assert_eq!(d.frame_rate(), 12.5);
        assert_eq!(d.frames_in(2.0), 25);
        d.sample_rate = 44_100;
        d.samples_per_frame = 2048;
        assert!((d.frame_rate() - 21.533).abs() < 1e-3);
        assert_eq!(d.frames_in(2.0), 44);
    }
}
