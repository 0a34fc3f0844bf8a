//! The dual-track prompt (qwen3-tts.md §3.4; reference `Qwen3TTSForConditionalGeneration.generate`
//! in `modeling_qwen3_tts.py` and the `generate_custom_voice` / `generate_voice_design` wrappers in
//! `inference/qwen3_tts_model.py`).
//!
//! Every prefill row is `T(text_id)` (text embedding → text projection) plus, optionally,
//! `C(codec_id)` (a row of the talker's codec embedding). The plan is pure ids; the talker turns it
//! into vectors.

use super::config::{ModelVariant, Qwen3TtsConfig};
use super::{ModelError, PromptMode, VoiceRequest};

/// One prefill position: `T(text) + C(codec)` (the codec part may be absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRow {
    pub text: u32,
    pub codec: Option<u32>,
}

/// A request resolved against the checkpoint: what the reference would feed `generate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRequest {
    /// `<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n`.
    pub assistant_text: String,
    /// `<|im_start|>user\n{instruct}<|im_end|>\n`, when an instruct is used.
    pub instruct_text: Option<String>,
    /// Lower-case language (`auto` when not given).
    pub language: String,
    /// Lower-case preset speaker, if any.
    pub speaker: Option<String>,
    /// The codec language row after the dialect rule (`None` = auto / nothink form).
    pub language_id: Option<u32>,
    /// The speaker's codec row.
    pub speaker_id: Option<u32>,
    pub mode: PromptMode,
}

fn invalid(field: &str, value: &str, msg: impl Into<String>) -> ModelError {
    ModelError::InvalidRequest {
        field: field.to_string(),
        value: value.to_string(),
        msg: msg.into(),
    }
}

/// The reference default of `non_streaming_mode` for the variant's generate call:
/// `generate_custom_voice` and `generate_voice_design` use `True`, `generate_voice_clone` `False`.
pub fn default_prompt_mode(variant: ModelVariant) -> PromptMode {
    match variant {
        ModelVariant::CustomVoice | ModelVariant::VoiceDesign => PromptMode::NonStreaming,
        ModelVariant::Base => PromptMode::Streaming,
    }
}

/// Validates `req` like the reference wrapper (case-insensitive language and speaker, `auto`
/// default, instruct dropped for 0.6B CustomVoice, empty instruct = none, empty speaker = none)
/// and applies the dialect rule of `generate` (language `chinese` or `auto` with a dialect
/// speaker → that dialect's row).
pub fn resolve(cfg: &Qwen3TtsConfig, req: &VoiceRequest) -> Result<ResolvedRequest, ModelError> {
    let tc = &cfg.talker_config;
    if req.text.trim().is_empty() {
        return Err(invalid("text", &req.text, "text to synthesise is empty"));
    }
    let language = req
        .language
        .as_deref()
        .unwrap_or("auto")
        .trim()
        .to_lowercase();
    let supported = cfg.supported_languages();
    if !supported.contains(&language) {
        return Err(invalid(
            "language",
            req.language.as_deref().unwrap_or(""),
            format!("unsupported language; supported: {}", supported.join(", ")),
        ));
    }
    let speaker = req
        .speaker
        .as_deref()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty());
    let speaker_id = match (&speaker, cfg.variant) {
        (None, _) => None,
        (Some(s), ModelVariant::CustomVoice) => Some(*tc.spk_id.get(s).ok_or_else(|| {
            invalid(
                "speaker",
                req.speaker.as_deref().unwrap_or(""),
                format!(
                    "unknown speaker; supported: {}",
                    cfg.supported_speakers().join(", ")
                ),
            )
        })?),
        (Some(_), v) => {
            return Err(invalid(
                "speaker",
                req.speaker.as_deref().unwrap_or(""),
                format!("a {v} checkpoint has no preset speakers"),
            ));
        }
    };
    let instruct = match cfg.variant {
        ModelVariant::CustomVoice if cfg.ignores_instruct() => None,
        ModelVariant::CustomVoice | ModelVariant::VoiceDesign => {
            req.instruct.as_deref().filter(|s| !s.is_empty())
        }
        ModelVariant::Base => None,
    };
    let mut language_id = if language == "auto" {
        None
    } else {
        Some(tc.codec_language_id[&language])
    };
    if (language == "chinese" || language == "auto")
        && let Some(s) = &speaker
        && let Some(dialect) = tc.spk_is_dialect.get(s)
    {
        language_id = Some(tc.codec_language_id[dialect]);
    }
    Ok(ResolvedRequest {
        assistant_text: format!(
            "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n",
            req.text
        ),
        instruct_text: instruct.map(|i| format!("<|im_start|>user\n{i}<|im_end|>\n")),
        language,
        speaker,
        language_id,
        speaker_id,
        mode: req.prompt_mode.unwrap_or(default_prompt_mode(cfg.variant)),
    })
}

/// The prefill rows and the text ids fed during decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Token ids of the assistant text (the whole string, incl. role header and tail).
    pub input_ids: Vec<u32>,
    /// Token ids of the instruct string, if any.
    pub instruct_ids: Option<Vec<u32>>,
    /// Prefill rows, in order: instruct, role (3), tags, text.
    pub rows: Vec<PromptRow>,
    /// Text ids added (as `T(id)`) to decode step n while n < len; afterwards `tts_pad`.
    pub trailing: Vec<u32>,
    pub mode: PromptMode,
}

impl Prompt {
    /// Builds the rows of a non-ICL prompt (CustomVoice / VoiceDesign; Base x-vector later).
    ///
    /// `input_ids[0..3]` is the role header and `input_ids[3..len-5]` the text body, as sliced by
    /// the reference. Errors if the body is empty.
    pub fn build(
        cfg: &Qwen3TtsConfig,
        r: &ResolvedRequest,
        input_ids: Vec<u32>,
        instruct_ids: Option<Vec<u32>>,
    ) -> Result<Self, ModelError> {
        let tc = &cfg.talker_config;
        let n = input_ids.len();
        if n < 9 {
            return Err(invalid(
                "text",
                &r.assistant_text,
                format!(
                    "tokenises to {n} ids; the prompt needs a 3-id role header, at least one text id and a 5-id tail"
                ),
            ));
        }
        let (pad, bos, eos) = (
            cfg.tts_pad_token_id,
            cfg.tts_bos_token_id,
            cfg.tts_eos_token_id,
        );
        let body = &input_ids[3..n - 5];

        let mut codec: Vec<u32> = match r.language_id {
            None => vec![
                tc.codec_nothink_id,
                tc.codec_think_bos_id,
                tc.codec_think_eos_id,
            ],
            Some(lang) => vec![
                tc.codec_think_id,
                tc.codec_think_bos_id,
                lang,
                tc.codec_think_eos_id,
            ],
        };
        if let Some(s) = r.speaker_id {
            codec.push(s);
        }
        codec.push(tc.codec_pad_id);
        codec.push(tc.codec_bos_id);
        let m = codec.len();

        let mut rows = Vec::new();
        if let Some(ids) = &instruct_ids {
            rows.extend(ids.iter().map(|&t| PromptRow {
                text: t,
                codec: None,
            }));
        }
        rows.extend(input_ids[..3].iter().map(|&t| PromptRow {
            text: t,
            codec: None,
        }));
        for (i, &c) in codec[..m - 1].iter().enumerate() {
            rows.push(PromptRow {
                text: if i < m - 2 { pad } else { bos },
                codec: Some(c),
            });
        }
        let trailing = match r.mode {
            PromptMode::Streaming => {
                rows.push(PromptRow {
                    text: body[0],
                    codec: Some(codec[m - 1]),
                });
                let mut t = body[1..].to_vec();
                t.push(eos);
                t
            }
            PromptMode::NonStreaming => {
                rows.extend(body.iter().map(|&t| PromptRow {
                    text: t,
                    codec: Some(tc.codec_pad_id),
                }));
                rows.push(PromptRow {
                    text: eos,
                    codec: Some(tc.codec_pad_id),
                });
                rows.push(PromptRow {
                    text: pad,
                    codec: Some(tc.codec_bos_id),
                });
                vec![pad]
            }
        };
        Ok(Self {
            input_ids,
            instruct_ids,
            rows,
            trailing,
            mode: r.mode,
        })
    }
}
