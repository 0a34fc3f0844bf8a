//! Voice-clone prompts of Base checkpoints ([`ArModel::create_voice_clone_prompt`]): the
//! reference audio's x-vector and, for ICL, its codes and transcript.

use super::ar_model::ArModel;
use crate::models::tts::ModelError;
use crate::models::tts::VoiceClonePrompt;

/// Shortest reference audio [`ArModel::create_voice_clone_prompt`] accepts: 0.5 s at 24 kHz.
pub const MIN_REF_AUDIO_SAMPLES: usize = 12_000;
/// Longest reference audio: 60 s at 24 kHz (750 codec frames of prompt and decoder context).
pub const MAX_REF_AUDIO_SAMPLES: usize = 60 * 24_000;
pub use crate::models::tts::SILENT_REF_PEAK;

/// Checks reference audio (mono samples at 24 kHz) as [`ArModel::create_voice_clone_prompt`]
/// needs it. Errors ([`ModelError::InvalidRequest`], field `ref_audio`): shorter than
/// [`MIN_REF_AUDIO_SAMPLES`] (0.5 s) or longer than [`MAX_REF_AUDIO_SAMPLES`] (60 s), a
/// non-finite sample, silent (peak below [`SILENT_REF_PEAK`], −60 dBFS).
pub fn check_reference_audio(audio_24k: &[f32]) -> Result<(), ModelError> {
    super::rules::reference_rules(super::ModelVariant::Base).check(audio_24k)
}

impl ArModel {
    /// Builds a voice-clone prompt from reference audio, like the reference wrapper's
    /// `create_voice_clone_prompt` (`inference/qwen3_tts_model.py`): the x-vector of the speaker
    /// encoder and, unless `x_vector_only`, the reference codes (codec encoder,
    /// `ceil(samples / 1920)` frames) and `ref_text` for ICL.
    ///
    /// `audio_24k`: mono samples at 24 kHz, nominally in [-1, 1] (resample first).
    ///
    /// Errors ([`ModelError::InvalidRequest`]): not a Base checkpoint (`model`); audio shorter
    /// than [`MIN_REF_AUDIO_SAMPLES`] (0.5 s) or longer than [`MAX_REF_AUDIO_SAMPLES`] (60 s),
    /// non-finite samples, or silent (peak below [`SILENT_REF_PEAK`], −60 dBFS) (`ref_audio`);
    /// missing/empty `ref_text` in ICL mode (`ref_text`).
    pub fn create_voice_clone_prompt(
        &self,
        audio_24k: &[f32],
        ref_text: Option<&str>,
        x_vector_only: bool,
    ) -> Result<VoiceClonePrompt, ModelError> {
        let bad = |field: &str, value: String, msg: String| ModelError::InvalidRequest {
            field: field.into(),
            value,
            msg,
        };
        let (Some(se), Some(ce)) = (&self.speaker_encoder, &self.codec_encoder) else {
            return Err(bad(
                "model",
                self.config.tts_model_type.clone(),
                "voice cloning needs a Base checkpoint".into(),
            ));
        };
        check_reference_audio(audio_24k)?;
        let ref_text = ref_text.filter(|t| !t.trim().is_empty());
        if !x_vector_only && ref_text.is_none() {
            return Err(bad(
                "ref_text",
                String::new(),
                "ICL voice cloning needs the transcript of the reference audio (or use x-vector-only mode)"
                    .into(),
            ));
        }
        let x_vector = se.embed_audio(audio_24k)?.to_vec1::<f32>()?;
        let ref_codes = if x_vector_only {
            None
        } else {
            Some(ce.encode(audio_24k)?)
        };
        Ok(VoiceClonePrompt {
            ref_codes,
            x_vector,
            ref_text: if x_vector_only {
                None
            } else {
                ref_text.map(str::to_string)
            },
            icl: !x_vector_only,
        })
    }
}
