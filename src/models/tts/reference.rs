//! What a reference recording must be for a checkpoint that clones voices, and its check.

use super::ModelError;

/// A reference whose peak |sample| is below this (−60 dBFS) is rejected as silent.
pub const SILENT_REF_PEAK: f32 = 1e-3;

/// Whether a checkpoint clones the voice of a reference recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceUse {
    /// It does not clone: a reference is refused.
    Unsupported,
    /// A reference is optional (Fish S2 Pro: without one, the model's own voice).
    Optional,
    /// Every request needs one (Qwen3-TTS Base).
    Required,
}

/// What a reference recording must be for this checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceRules {
    /// Whether the checkpoint clones.
    pub use_: ReferenceUse,
    /// The rate, Hz, the model's encoder takes the recording at (callers resample to it).
    pub sample_rate: u32,
    /// Shortest recording, samples at `sample_rate`.
    pub min_samples: usize,
    /// Longest recording, samples at `sample_rate`.
    pub max_samples: usize,
    /// A clone from the speaker embedding alone, without the transcript, exists (Qwen3-TTS
    /// Base's x-vector-only mode).
    pub speaker_embedding_only: bool,
}

impl ReferenceRules {
    /// Rules of a checkpoint that does not clone (no limits apply).
    pub fn none(sample_rate: u32) -> Self {
        ReferenceRules {
            use_: ReferenceUse::Unsupported,
            sample_rate,
            min_samples: 0,
            max_samples: 0,
            speaker_embedding_only: false,
        }
    }

    /// Seconds of `samples` at the reference rate.
    pub fn seconds(&self, samples: usize) -> f64 {
        samples as f64 / f64::from(self.sample_rate.max(1))
    }

    /// Checks a recording (mono samples at [`ReferenceRules::sample_rate`]) as the model's
    /// encoder needs it. Errors ([`ModelError::InvalidRequest`], field `ref_audio`): the model
    /// does not clone; shorter than `min_samples` or longer than `max_samples`; a non-finite
    /// sample; silent (peak below [`SILENT_REF_PEAK`], −60 dBFS).
    pub fn check(&self, audio: &[f32]) -> Result<(), ModelError> {
        let bad = |value: String, msg: String| ModelError::InvalidRequest {
            field: "ref_audio".into(),
            value,
            msg,
        };
        let n = audio.len();
        let khz = f64::from(self.sample_rate) / 1000.0;
        if self.use_ == ReferenceUse::Unsupported {
            return Err(bad(
                format!("{n} samples"),
                "this model does not clone voices".into(),
            ));
        }
        if n < self.min_samples {
            return Err(bad(
                format!("{n} samples ({:.2} s)", self.seconds(n)),
                format!(
                    "reference audio too short (at least {} samples = {:.1} s at {khz} kHz)",
                    self.min_samples,
                    self.seconds(self.min_samples)
                ),
            ));
        }
        if n > self.max_samples {
            return Err(bad(
                format!("{n} samples ({:.2} s)", self.seconds(n)),
                format!(
                    "reference audio too long (at most {} samples = {:.0} s at {khz} kHz)",
                    self.max_samples,
                    self.seconds(self.max_samples)
                ),
            ));
        }
        if let Some(i) = audio.iter().position(|x| !x.is_finite()) {
            return Err(bad(
                format!("sample {i} = {}", audio[i]),
                "non-finite sample".into(),
            ));
        }
        let peak = audio.iter().fold(0f32, |m, x| m.max(x.abs()));
        if peak < SILENT_REF_PEAK {
            let level = if peak > 0.0 {
                format!("peak {:.1} dBFS", 20.0 * peak.log10())
            } else {
                "digital silence (every sample 0)".to_string()
            };
            return Err(bad(
                level,
                "reference audio is silent (peak below −60 dBFS)".into(),
            ));
        }
        Ok(())
    }
}
