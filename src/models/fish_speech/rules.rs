//! Fish S2 Pro's request rules without its weights ([`FishRules`]): its description (44.1 kHz,
//! 2048 samples and 10 codes a frame, no preset speakers, no language setting, no instruct,
//! optional cloning from a 44.1 kHz reference with its transcript) and the checks of a request.

use std::path::Path;

use super::codec::CodecConfig;
use super::config::FishConfig;
use super::error::FishError;
use super::generate::PROMPT_HEADROOM;
use super::prompt::{CHUNK_LENGTH, PromptBuilder, VoiceReference};
use super::stage0::transpose;
use super::tokenizer::{FishTokenizer, SPEAKER_TAG_START};
use crate::models::tts::text::unspeakable;
use crate::models::tts::{
    InstructUse, ModelDescription, ModelError, ReferenceRules, ReferenceUse, SamplingParams,
    TOO_LONG_FOR_ONE_UTTERANCE, VoiceClonePrompt, VoiceRequest, VoiceRules,
};

/// config.json's `model_type` of S2 Pro.
pub const MODEL_TYPE: &str = "fish_qwen3_omni";
/// Shortest reference recording: 0.5 s at 44.1 kHz.
pub const MIN_REF_SAMPLES: usize = 22_050;
/// Longest reference recording: 60 s at 44.1 kHz (~1292 frames of prompt).
pub const MAX_REF_SAMPLES: usize = 60 * 44_100;
/// Frames a request generates at most when nothing else says (~95 s).
pub const DEFAULT_MAX_FRAMES: usize = 2048;

/// A Fish S2 Pro checkpoint's configs and tokenizer, and what they make of a request.
#[derive(Debug, Clone)]
pub struct FishRules {
    prompts: PromptBuilder,
    codebook_size: usize,
    /// The slow AR's `max_seq_len`: a generation batch's prompt and frames together.
    max_seq_len: usize,
    description: ModelDescription,
}

impl FishRules {
    /// Reads `dir`'s config.json, tokenizer.json and codec config (codec_config.yaml, else S2
    /// Pro's). Errors name the file.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let config = FishConfig::load(dir)?;
        let tokenizer = FishTokenizer::load(dir)?;
        let codec = CodecConfig::load(dir)?;
        let description = ModelDescription {
            model_type: MODEL_TYPE.into(),
            name: "Fish Audio S2 Pro".into(),
            sample_rate: codec.sample_rate,
            samples_per_frame: codec.samples_per_frame(),
            num_codebooks: config.num_codebooks(),
            speakers: Vec::new(),
            default_speaker: None,
            languages: Vec::new(),
            instruct: InstructUse::Unsupported,
            reference: ReferenceRules {
                use_: ReferenceUse::Optional,
                sample_rate: codec.sample_rate,
                min_samples: MIN_REF_SAMPLES,
                max_samples: MAX_REF_SAMPLES,
                speaker_embedding_only: false,
            },
            prompt_modes: false,
            open_text: false,
            speaker_turn_tag: Some(SPEAKER_TAG_START),
        };
        Ok(FishRules {
            prompts: PromptBuilder {
                tokenizer,
                num_codebooks: config.num_codebooks(),
            },
            codebook_size: config.codebook_size(),
            max_seq_len: config.text_config.max_seq_len,
            description,
        })
    }
}

/// Checks that a generation batch's prompt of `t` positions leaves the frames their room in the
/// slow AR's `max_len` positions ([`PROMPT_HEADROOM`]); `text` is the request's, for the error
/// ([`ModelError::InvalidRequest`] on `text`: too long for one utterance).
pub(crate) fn check_prompt_positions(
    text: &str,
    t: usize,
    max_len: usize,
) -> Result<(), ModelError> {
    let limit = max_len.saturating_sub(PROMPT_HEADROOM);
    if t > 0 && t <= limit {
        return Ok(());
    }
    Err(ModelError::invalid(
        "text",
        text,
        format!(
            "{TOO_LONG_FOR_ONE_UTTERANCE}: its prompt takes {t} positions, at most {limit} here \
             (max_seq_len {max_len} less {PROMPT_HEADROOM} for the frames); split the text into \
             sentences (split-sentences) or shorter pieces"
        ),
    ))
}

fn invalid(field: &str, value: &str, msg: impl Into<String>) -> ModelError {
    let value: String = value.chars().take(80).collect();
    ModelError::InvalidRequest {
        field: field.into(),
        value,
        msg: msg.into(),
    }
}

/// Checks `voice` for a Fish checkpoint (see [`FishRules`]): speakable text without control
/// tokens (speaker-tagged text of several generation batches is generated batch after batch by
/// stage 0); no speaker, language (other than `auto`), instruct or prompt mode; a clone in ICL
/// form with its transcript and codes `[frames][num_codebooks]` below `codebook_size`.
pub(crate) fn check_voice(
    prompts: &PromptBuilder,
    codebook_size: usize,
    voice: &VoiceRequest,
) -> Result<(), ModelError> {
    if let Some(why) = unspeakable(&voice.text) {
        return Err(invalid("text", &voice.text, why));
    }
    prompts
        .batches(&voice.text, CHUNK_LENGTH)
        .map_err(|e| match e {
            // A control token in the text: named with the text.
            FishError::InvalidRequest { msg, .. } => invalid("text", &voice.text, msg),
            e => e.into(),
        })?;
    let name = "a Fish S2 Pro checkpoint";
    if let Some(s) = voice.speaker.as_deref().filter(|s| !s.trim().is_empty()) {
        return Err(invalid(
            "speaker",
            s,
            format!("{name} has no preset speakers (write <|speaker:N|> tags in the text)"),
        ));
    }
    if let Some(l) = voice
        .language
        .as_deref()
        .filter(|l| !l.trim().is_empty() && !l.trim().eq_ignore_ascii_case("auto"))
    {
        return Err(invalid(
            "language",
            l,
            format!("{name} takes no language setting (it reads the text as written)"),
        ));
    }
    if let Some(i) = voice.instruct.as_deref().filter(|i| !i.trim().is_empty()) {
        return Err(invalid("instruct", i, format!("{name} has no instruct")));
    }
    if let Some(m) = voice.prompt_mode {
        return Err(invalid(
            "prompt_mode",
            &m.to_string(),
            format!("{name} has one prompt form (the prompt mode is Qwen3-TTS's)"),
        ));
    }
    if let Some(vc) = &voice.voice_clone {
        check_clone(vc, prompts.num_codebooks, codebook_size)?;
    }
    Ok(())
}

/// A Fish clone: ICL, a transcript, codes `[frames][codebooks]` below the codebook size, no
/// speaker embedding.
fn check_clone(vc: &VoiceClonePrompt, ncb: usize, size: usize) -> Result<(), ModelError> {
    if !vc.icl || !vc.x_vector.is_empty() {
        return Err(invalid(
            "voice_clone",
            "x-vector",
            "Fish S2 Pro clones from the reference's codes and transcript (ICL) only",
        ));
    }
    let text = vc.ref_text.as_deref().unwrap_or("");
    if let Some(why) = unspeakable(text) {
        return Err(invalid(
            "voice_clone.ref_text",
            text,
            format!("voice cloning needs the transcript of the reference audio; it has {why}"),
        ));
    }
    let codes = vc.ref_codes.as_deref().unwrap_or(&[]);
    if codes.is_empty() {
        return Err(invalid(
            "voice_clone.ref_codes",
            "0 frames",
            "voice cloning needs the reference audio's codes",
        ));
    }
    for (f, frame) in codes.iter().enumerate() {
        if frame.len() != ncb {
            return Err(invalid(
                "voice_clone.ref_codes",
                &format!("frame {f}: {} codes", frame.len()),
                format!("every frame needs {ncb} codes"),
            ));
        }
        if let Some(&c) = frame.iter().find(|&&c| c as usize >= size) {
            return Err(invalid(
                "voice_clone.ref_codes",
                &format!("frame {f}: code {c}"),
                format!("codes must be below the codebook size {size}"),
            ));
        }
    }
    Ok(())
}

impl VoiceRules for FishRules {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    /// The reference's long-form defaults: temperature 1.0, top_p 0.9, top_k 30 (both ARs),
    /// [`DEFAULT_MAX_FRAMES`] frames.
    fn default_sampling(&self) -> SamplingParams {
        SamplingParams {
            do_sample: true,
            temperature: 1.0,
            top_k: 30,
            top_p: 0.9,
            repetition_penalty: 1.0,
            subtalker_do_sample: true,
            subtalker_temperature: 1.0,
            subtalker_top_k: 30,
            subtalker_top_p: 0.9,
            max_new_tokens: DEFAULT_MAX_FRAMES,
            seed: 0,
        }
    }

    fn check(&self, voice: &VoiceRequest) -> Result<(), ModelError> {
        check_voice(&self.prompts, self.codebook_size, voice)
    }

    /// Every generation batch of the text, alone with the reference (as stage 0 begins the
    /// request: a later batch's history gives way when it does not fit), must leave the frames
    /// [`PROMPT_HEADROOM`] of the slow AR's positions; the frame cap only shortens a batch.
    fn check_length(&self, voice: &VoiceRequest, _max_new_tokens: usize) -> Result<(), ModelError> {
        let reference = voice.voice_clone.as_ref().map(|vc| VoiceReference {
            codes: transpose(vc.ref_codes.as_deref().unwrap_or(&[])),
            transcript: vc.ref_text.clone().unwrap_or_default(),
        });
        for batch in self.prompts.batches(&voice.text, CHUNK_LENGTH)? {
            let prompt = self.prompts.build(&batch, reference.as_ref(), &[])?;
            check_prompt_positions(&voice.text, prompt.len(), self.max_seq_len)?;
        }
        Ok(())
    }

    fn check_open(&self, _voice: &VoiceRequest) -> Result<(), ModelError> {
        Err(invalid(
            "model",
            MODEL_TYPE,
            "Fish S2 Pro takes whole texts only (its prompt holds the text before the first \
             frame): text that is still arriving needs a Qwen3-TTS checkpoint",
        ))
    }
}
