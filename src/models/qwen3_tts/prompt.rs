//! The dual-track prompt (docs/qwen3-tts.md §3.4; reference
//! `Qwen3TTSForConditionalGeneration.generate`
//! in `modeling_qwen3_tts.py` and the `generate_custom_voice` / `generate_voice_design` wrappers in
//! `inference/qwen3_tts_model.py`).
//!
//! Every prefill row is `T(text_id)` (text embedding → text projection) plus, optionally,
//! `C(codec_id)` (a row of the talker's codec embedding). The plan is pure ids; the talker turns it
//! into vectors.

use super::config::{ModelVariant, Qwen3TtsConfig};
use super::tokenizer::TextTokenizer;
use super::{ModelError, PromptMode, VoiceRequest};
use crate::models::tts::TOO_LONG_FOR_ONE_UTTERANCE;
pub use crate::models::tts::VoiceClonePrompt;

/// The codec-track part of a prompt row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodecPart {
    /// No codec part (instruct and role rows).
    None,
    /// `C(id)`: a row of the talker's codec embedding.
    Id(u32),
    /// The Base speaker row: the raw x-vector of the voice-clone prompt (no projection).
    XVector,
    /// Reference frame `f` of an ICL prompt: `Σ_q Emb_q(ref_codes[f][q])` (`Emb_0` = the
    /// talker's codec embedding, `Emb_q` = code predictor table q−1), as at decode time.
    RefFrame(usize),
}

impl CodecPart {
    /// The codec id, for [`CodecPart::Id`].
    pub fn id(self) -> Option<u32> {
        match self {
            CodecPart::Id(i) => Some(i),
            _ => None,
        }
    }
}

/// One prefill position: `T(text) + codec part`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRow {
    pub text: u32,
    pub codec: CodecPart,
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
    /// Base voice clone: the speaker row is the x-vector.
    pub x_vector: bool,
    /// Base ICL: `<|im_start|>assistant\n{ref_text}<|im_end|>\n` (reference `_build_ref_text`).
    pub ref_text: Option<String>,
    /// Base ICL: number of reference frames.
    pub ref_frames: usize,
}

/// What the assistant text starts with before the text ([`ResolvedRequest::assistant_text`]).
pub const ASSISTANT_HEAD: &str = "<|im_start|>assistant\n";

/// What the assistant text ends with after the text ([`ResolvedRequest::assistant_text`]).
pub const ASSISTANT_TAIL: &str = "<|im_end|>\n<|im_start|>assistant\n";

fn invalid(field: &str, value: &str, msg: impl Into<String>) -> ModelError {
    ModelError::invalid(field, value, msg)
}

/// The talker's position budget when `config.json` names none: the reference
/// `Qwen3TTSTalkerConfig` default of `max_position_embeddings`.
pub const DEFAULT_MAX_POSITIONS: usize = 32768;

/// The most talker positions one utterance may take: `talker_config.max_position_embeddings`
/// (32768 in the released checkpoints and the bundled voice), else [`DEFAULT_MAX_POSITIONS`].
pub fn position_budget(cfg: &Qwen3TtsConfig) -> usize {
    cfg.talker_config
        .max_position_embeddings
        .unwrap_or(DEFAULT_MAX_POSITIONS)
}

/// Whether the prompt holds a request's instruct: VoiceDesign and 1.7B CustomVoice checkpoints
/// use it; Base and 0.6B CustomVoice ones drop it, as the reference wrapper does
/// ([`Qwen3TtsConfig::ignores_instruct`]).
pub fn uses_instruct(cfg: &Qwen3TtsConfig) -> bool {
    match cfg.variant {
        ModelVariant::CustomVoice => !cfg.ignores_instruct(),
        ModelVariant::VoiceDesign => true,
        ModelVariant::Base => false,
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

pub use crate::models::tts::text::{
    LANGUAGE_CODES, NO_WORDS_TO_SPEAK, NOTHING_TO_SPEAK, no_words_to_speak, nothing_to_speak,
    resolve_language, unspeakable,
};

/// Validates `req` like the reference wrapper (case-insensitive language and speaker, `auto`
/// default, instruct dropped for 0.6B CustomVoice, empty instruct = none, empty speaker = none)
/// and applies the dialect rule of `generate` (language `chinese` or `auto` with a dialect
/// speaker → that dialect's row). Also refused: text with nothing to speak ([`unspeakable`]).
/// The language may be given by its ISO 639-1 code ([`resolve_language`]).
pub fn resolve(cfg: &Qwen3TtsConfig, req: &VoiceRequest) -> Result<ResolvedRequest, ModelError> {
    let tc = &cfg.talker_config;
    if let Some(why) = unspeakable(&req.text) {
        return Err(invalid("text", &req.text, why));
    }
    let language = resolve_language(
        &cfg.supported_languages(),
        req.language.as_deref().unwrap_or("auto"),
    )
    .map_err(|msg| invalid("language", req.language.as_deref().unwrap_or(""), msg))?;
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
    let clone = resolve_clone(cfg, req)?;
    let instruct = req
        .instruct
        .as_deref()
        .filter(|s| uses_instruct(cfg) && !s.is_empty());
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
        x_vector: clone.is_some(),
        ref_text: clone
            .and_then(|c| c.ref_text.as_ref().filter(|_| c.icl))
            .map(|t| format!("<|im_start|>assistant\n{t}<|im_end|>\n")),
        ref_frames: clone.map_or(0, VoiceClonePrompt::ref_frames),
    })
}

/// Checks the voice-clone part of `req`: required for Base, refused otherwise; x-vector width =
/// talker hidden size and finite; ICL needs non-empty `ref_text` and reference codes of
/// `num_code_groups` codes below the codebook size; x-vector-only mode takes no codes.
fn resolve_clone<'a>(
    cfg: &Qwen3TtsConfig,
    req: &'a VoiceRequest,
) -> Result<Option<&'a VoiceClonePrompt>, ModelError> {
    let tc = &cfg.talker_config;
    let Some(vc) = &req.voice_clone else {
        if cfg.variant == ModelVariant::Base {
            return Err(invalid(
                "voice_clone",
                "None",
                "a Base checkpoint clones a voice: give reference audio (a voice-clone prompt)",
            ));
        }
        return Ok(None);
    };
    if cfg.variant != ModelVariant::Base {
        return Err(invalid(
            "voice_clone",
            &format!("{} reference frames", vc.ref_frames()),
            format!(
                "a {} checkpoint cannot clone voices (Base only)",
                cfg.variant
            ),
        ));
    }
    let d = tc.transformer.hidden_size;
    if vc.x_vector.len() != d {
        return Err(invalid(
            "voice_clone.x_vector",
            &format!("{} values", vc.x_vector.len()),
            format!("the speaker embedding must have {d} values (talker hidden size)"),
        ));
    }
    if let Some(i) = vc.x_vector.iter().position(|x| !x.is_finite()) {
        return Err(invalid(
            "voice_clone.x_vector",
            &format!("[{i}] = {}", vc.x_vector[i]),
            "non-finite value",
        ));
    }
    if !vc.icl {
        if let Some(c) = &vc.ref_codes {
            return Err(invalid(
                "voice_clone.ref_codes",
                &format!("{} frames", c.len()),
                "reference codes are only used in ICL mode (icl = false here)",
            ));
        }
        return Ok(Some(vc));
    }
    let text = vc.ref_text.as_deref().unwrap_or("");
    if text.trim().is_empty() {
        return Err(invalid(
            "voice_clone.ref_text",
            text,
            "ICL voice cloning needs the transcript of the reference audio",
        ));
    }
    let codes = vc.ref_codes.as_deref().unwrap_or(&[]);
    if codes.is_empty() {
        return Err(invalid(
            "voice_clone.ref_codes",
            "0 frames",
            "ICL voice cloning needs the reference audio's codes",
        ));
    }
    let groups = tc.num_code_groups;
    let size = tc.code_predictor_config.vocab_size;
    for (f, frame) in codes.iter().enumerate() {
        if frame.len() != groups {
            return Err(invalid(
                "voice_clone.ref_codes",
                &format!("frame {f}: {} codes", frame.len()),
                format!("every frame needs {groups} codes"),
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
    Ok(Some(vc))
}

/// The prefill rows and the text ids fed during decoding.
/// The prefill rows and the text ids fed during decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Token ids of the assistant text (the whole string, incl. role header and tail).
    pub input_ids: Vec<u32>,
    /// Token ids of the instruct string, if any.
    pub instruct_ids: Option<Vec<u32>>,
    /// Base ICL: token ids of `<|im_start|>assistant\n{ref_text}<|im_end|>\n`.
    pub ref_ids: Option<Vec<u32>>,
    /// Prefill rows, in order: instruct, role (3), tags, text (or the ICL block).
    pub rows: Vec<PromptRow>,
    /// Text ids added (as `T(id)`) to decode step n while n < len; afterwards `tts_pad`.
    pub trailing: Vec<u32>,
    pub mode: PromptMode,
    /// Base ICL: reference frames in the prompt (and to cut from the decoded audio).
    pub ref_frames: usize,
    /// The voice-clone prompt the rows refer to (x-vector, reference codes), set by `plan`.
    pub voice_clone: Option<VoiceClonePrompt>,
}

impl Prompt {
    /// Resolves `req` against the checkpoint, tokenizes its texts with `tok` and builds its
    /// prompt (no model computation; stage 0's plan, and the caller-side length check of
    /// [`Qwen3Rules`](super::Qwen3Rules)).
    pub fn plan(
        cfg: &Qwen3TtsConfig,
        tok: &TextTokenizer,
        req: &VoiceRequest,
    ) -> Result<Self, ModelError> {
        let r = resolve(cfg, req)?;
        let input_ids = tok.encode(&r.assistant_text)?;
        let instruct_ids = match &r.instruct_text {
            Some(t) => Some(tok.encode(t)?),
            None => None,
        };
        let ref_ids = match &r.ref_text {
            Some(t) => Some(tok.encode(t)?),
            None => None,
        };
        let mut p = Self::build_with_ref(cfg, &r, input_ids, instruct_ids, ref_ids)?;
        p.voice_clone = req.voice_clone.clone();
        Ok(p)
    }

    /// Talker positions the prompt takes: its prefill rows and, in streaming mode, the text ids
    /// still to be fed (one a frame; the trailing `tts_pad` of the other modes is no text).
    pub fn positions(&self, cfg: &Qwen3TtsConfig) -> usize {
        let streamed = if self.trailing == [cfg.tts_pad_token_id] {
            0
        } else {
            self.trailing.len()
        };
        self.rows.len() + streamed
    }

    /// Text ids of the prompt: those of the text body and, for ICL, of the reference text's body;
    /// the rest of [`Self::positions`] is fixed by the request's settings.
    pub fn text_ids(&self) -> usize {
        let body = self.input_ids.len().saturating_sub(8);
        let ref_body = self
            .ref_ids
            .as_ref()
            .map_or(0, |ids| ids.len().saturating_sub(5));
        body + ref_body
    }

    /// Checks that the prompt and `max_new_tokens` frames fit in the talker's position budget
    /// ([`position_budget`]): `positions + max_new_tokens ≤ max_position_embeddings`. Beyond it the
    /// model has never seen such positions and a huge text would take memory and prefill time
    /// without bound, so the text is refused (field `text`, naming the most text ids one
    /// utterance holds with these settings), or `max_new_tokens` when it alone leaves no room.
    pub fn check_position_budget(
        &self,
        cfg: &Qwen3TtsConfig,
        text: &str,
        max_new_tokens: usize,
    ) -> Result<(), ModelError> {
        let budget = position_budget(cfg);
        let positions = self.positions(cfg);
        if positions.saturating_add(max_new_tokens) <= budget {
            return Ok(());
        }
        let text_ids = self.text_ids().min(positions);
        let fixed = positions - text_ids;
        let room = budget.saturating_sub(fixed);
        if max_new_tokens >= room {
            return Err(invalid(
                "max_new_tokens",
                &max_new_tokens.to_string(),
                format!(
                    "{max_new_tokens} frames and the prompt's {fixed} other positions leave no room \
                     for text in the talker's {budget} positions (max_position_embeddings); \
                     lower max-new-tokens"
                ),
            ));
        }
        let limit = room - max_new_tokens;
        Err(invalid(
            "text",
            text,
            format!(
                "{TOO_LONG_FOR_ONE_UTTERANCE}: {text_ids} text ids, at most {limit} here (the \
                 talker's {budget} positions, max_position_embeddings, less {max_new_tokens} for \
                 max-new-tokens frames and {fixed} for the rest of the prompt); split the text \
                 into sentences (split-sentences) or shorter pieces"
            ),
        ))
    }

    /// Builds the rows of a prompt without ICL block (CustomVoice, VoiceDesign, Base x-vector
    /// only). See [`Prompt::build_with_ref`].
    pub fn build(
        cfg: &Qwen3TtsConfig,
        r: &ResolvedRequest,
        input_ids: Vec<u32>,
        instruct_ids: Option<Vec<u32>>,
    ) -> Result<Self, ModelError> {
        Self::build_with_ref(cfg, r, input_ids, instruct_ids, None)
    }

    /// Builds the rows (reference `Qwen3TTSForConditionalGeneration.generate` and
    /// `generate_icl_prompt`).
    ///
    /// `input_ids[0..3]` is the role header and `input_ids[3..len-5]` the text body, as sliced by
    /// the reference; for ICL (`r.ref_text` set) `ref_ids[3..len-2]` is the reference-text body.
    /// Errors if a body is empty or `ref_ids` is missing in ICL mode.
    pub fn build_with_ref(
        cfg: &Qwen3TtsConfig,
        r: &ResolvedRequest,
        input_ids: Vec<u32>,
        instruct_ids: Option<Vec<u32>>,
        ref_ids: Option<Vec<u32>>,
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
        let ref_body = match (&r.ref_text, &ref_ids) {
            (None, _) => None,
            (Some(t), None) => {
                return Err(invalid(
                    "voice_clone.ref_text",
                    t,
                    "ICL prompt built without the reference text's token ids",
                ));
            }
            (Some(t), Some(ids)) => {
                if ids.len() < 6 {
                    return Err(invalid(
                        "voice_clone.ref_text",
                        t,
                        format!(
                            "tokenises to {} ids; needs a 3-id role header, at least one text id and a 2-id tail",
                            ids.len()
                        ),
                    ));
                }
                Some(&ids[3..ids.len() - 2])
            }
        };

        let mut codec: Vec<CodecPart> = match r.language_id {
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
        }
        .into_iter()
        .map(CodecPart::Id)
        .collect();
        if let Some(s) = r.speaker_id {
            codec.push(CodecPart::Id(s));
        } else if r.x_vector {
            codec.push(CodecPart::XVector);
        }
        codec.push(CodecPart::Id(tc.codec_pad_id));
        codec.push(CodecPart::Id(tc.codec_bos_id));
        let m = codec.len();

        let mut rows = Vec::new();
        if let Some(ids) = &instruct_ids {
            rows.extend(ids.iter().map(|&t| PromptRow {
                text: t,
                codec: CodecPart::None,
            }));
        }
        rows.extend(input_ids[..3].iter().map(|&t| PromptRow {
            text: t,
            codec: CodecPart::None,
        }));
        for (i, &c) in codec[..m - 1].iter().enumerate() {
            rows.push(PromptRow {
                text: if i < m - 2 { pad } else { bos },
                codec: c,
            });
        }
        let icl = ref_body.is_some();
        let trailing = if let Some(ref_body) = ref_body {
            // ICL block: text t = [ref body, body, E] (L rows), codec u = [C(bos), frames] (F+1).
            let t: Vec<u32> = ref_body
                .iter()
                .chain(body)
                .copied()
                .chain(std::iter::once(eos))
                .collect();
            let u: Vec<CodecPart> = std::iter::once(CodecPart::Id(tc.codec_bos_id))
                .chain((0..r.ref_frames).map(CodecPart::RefFrame))
                .collect();
            match r.mode {
                PromptMode::NonStreaming => {
                    rows.extend(t.iter().map(|&text| PromptRow {
                        text,
                        codec: CodecPart::Id(tc.codec_pad_id),
                    }));
                    rows.extend(u.iter().map(|&codec| PromptRow { text: pad, codec }));
                    vec![pad]
                }
                PromptMode::Streaming => {
                    let k = u.len();
                    rows.extend(u.iter().enumerate().map(|(i, &codec)| PromptRow {
                        text: t.get(i).copied().unwrap_or(pad),
                        codec,
                    }));
                    if t.len() > k {
                        t[k..].to_vec()
                    } else {
                        vec![pad]
                    }
                }
            }
        } else {
            match r.mode {
                PromptMode::Streaming => {
                    rows.push(PromptRow {
                        text: body[0],
                        codec: codec[m - 1],
                    });
                    let mut t = body[1..].to_vec();
                    t.push(eos);
                    t
                }
                PromptMode::NonStreaming => {
                    rows.extend(body.iter().map(|&t| PromptRow {
                        text: t,
                        codec: CodecPart::Id(tc.codec_pad_id),
                    }));
                    rows.push(PromptRow {
                        text: eos,
                        codec: CodecPart::Id(tc.codec_pad_id),
                    });
                    rows.push(PromptRow {
                        text: pad,
                        codec: CodecPart::Id(tc.codec_bos_id),
                    });
                    vec![pad]
                }
            }
        };
        Ok(Self {
            input_ids,
            instruct_ids,
            ref_ids: ref_ids.filter(|_| icl),
            rows,
            trailing,
            mode: r.mode,
            ref_frames: if icl { r.ref_frames } else { 0 },
            voice_clone: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::models::qwen3_tts::tokenizer::TextTokenizer;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
    }

    fn config(dir: &str) -> Qwen3TtsConfig {
        Qwen3TtsConfig::from_file(&fixture(dir).join("config.json")).unwrap()
    }

    fn request(text: &str, language: Option<&str>) -> VoiceRequest {
        VoiceRequest {
            text: text.into(),
            speaker: Some("vivian".into()),
            language: language.map(str::to_string),
            ..Default::default()
        }
    }

    fn refusal(r: Result<impl std::fmt::Debug, ModelError>) -> (String, String, String) {
        match r {
            Err(ModelError::InvalidRequest { field, value, msg }) => (field, value, msg),
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn iso_639_1_codes_are_language_aliases() {
        let cfg = config("tests/fixtures/tiny-customvoice");
        let supported = cfg.supported_languages();
        for (code, name) in LANGUAGE_CODES {
            for v in [code.to_string(), code.to_uppercase(), format!(" {code} ")] {
                assert_eq!(resolve_language(&supported, &v).as_deref(), Ok(name), "{v}");
            }
            assert_eq!(resolve_language(&supported, name).as_deref(), Ok(name));
        }
        assert_eq!(resolve_language(&supported, "AUTO").as_deref(), Ok("auto"));
        let r = resolve(&cfg, &request("Hallo.", Some("DE"))).unwrap();
        assert_eq!(r.language, "german");
        assert_eq!(
            r.language_id,
            Some(cfg.talker_config.codec_language_id["german"])
        );
        assert_eq!(
            r,
            resolve(&cfg, &request("Hallo.", Some("German"))).unwrap()
        );
    }

    #[test]
    fn unknown_language_lists_names_and_codes() {
        let cfg = config("tests/fixtures/tiny-customvoice");
        let (field, value, msg) = refusal(resolve(&cfg, &request("Hi.", Some("xx"))));
        assert_eq!((field.as_str(), value.as_str()), ("language", "xx"));
        for want in [
            "auto",
            "english (en)",
            "chinese (zh)",
            "korean (ko)",
            "italian (it)",
        ] {
            assert!(msg.contains(want), "{msg}");
        }
        // A code is an alias only of a language the checkpoint has: the bundled voice speaks
        // English alone.
        let voice = config("models/omnitts-en");
        let joe = |language| VoiceRequest {
            speaker: Some("joe".into()),
            ..request("Hi.", Some(language))
        };
        let (field, value, msg) = refusal(resolve(&voice, &joe("zh")));
        assert_eq!((field.as_str(), value.as_str()), ("language", "zh"));
        assert!(msg.contains("supported: auto, english (en) ("), "{msg}");
        assert_eq!(resolve(&voice, &joe("En")).unwrap().language, "english");
    }

    #[test]
    fn text_without_letters_or_digits_is_refused() {
        let cfg = config("tests/fixtures/tiny-customvoice");
        let punctuation = "!?.,;:".repeat(20);
        for text in [
            "!!!",
            "...",
            "* * *",
            "😀😀😀😀",
            "?! -- (…) «»",
            punctuation.as_str(),
        ] {
            let (field, _, msg) = refusal(resolve(&cfg, &request(text, None)));
            assert_eq!(field, "text", "{text}");
            assert_eq!(msg, NO_WORDS_TO_SPEAK, "{text}");
        }
        let (_, _, msg) = refusal(resolve(&cfg, &request(" \u{200B}\n", None)));
        assert_eq!(msg, NOTHING_TO_SPEAK);
        for text in ["Hello!", "42", "你好。", "Ça va ?", "😀 yes", "①", "x"] {
            assert!(resolve(&cfg, &request(text, None)).is_ok(), "{text}");
            assert_eq!(unspeakable(text), None, "{text}");
        }
    }

    /// The prompt of `text` on `dir`'s checkpoint in the variant's default mode.
    fn plan(cfg: &Qwen3TtsConfig, tok: &TextTokenizer, text: &str) -> Prompt {
        let r = resolve(cfg, &request(text, None)).unwrap();
        let ids = tok.encode(&r.assistant_text).unwrap();
        Prompt::build(cfg, &r, ids, None).unwrap()
    }

    #[test]
    fn one_utterance_fits_the_talker_position_budget() {
        let dir = fixture("tests/fixtures/tiny-customvoice");
        let cfg = config("tests/fixtures/tiny-customvoice");
        let tok = TextTokenizer::from_dir(&dir).unwrap();
        assert_eq!(position_budget(&cfg), 32768);
        let text = "one two three four five six seven eight nine ten ".repeat(4);
        let p = plan(&cfg, &tok, &text);
        let fixed = p.positions(&cfg) - p.text_ids();
        assert!(p.text_ids() >= 40 && fixed > 5, "{} {fixed}", p.text_ids());
        // Exactly at the budget it fits; one frame more and the text is refused, naming the limit
        // and what to do.
        let frames = 32768 - p.positions(&cfg);
        assert!(p.check_position_budget(&cfg, &text, frames).is_ok());
        let (field, value, msg) = refusal(p.check_position_budget(&cfg, &text, frames + 1));
        assert_eq!(field, "text");
        assert!(
            value.ends_with('…')
                && value.chars().count() == crate::models::tts::QUOTED_VALUE_CHARS + 1
        );
        let limit = p.text_ids() - 1;
        for want in [
            format!("{} text ids, at most {limit} here", p.text_ids()),
            "32768 positions, max_position_embeddings".into(),
            format!("less {} for max-new-tokens", frames + 1),
            "split-sentences".into(),
        ] {
            assert!(msg.contains(&want), "{want:?} not in {msg}");
        }
        // max-new-tokens alone can leave no room for text.
        let (field, value, _) = refusal(p.check_position_budget(&cfg, &text, 32768 - fixed));
        assert_eq!(
            (field.as_str(), value),
            ("max_new_tokens", (32768 - fixed).to_string())
        );
    }

    #[test]
    fn streaming_prompts_count_the_text_still_to_feed() {
        let dir = fixture("tests/fixtures/tiny-customvoice");
        let cfg = config("tests/fixtures/tiny-customvoice");
        let tok = TextTokenizer::from_dir(&dir).unwrap();
        let text = "A short sentence of several words to feed.";
        let non_streaming = plan(&cfg, &tok, text);
        let mut req = request(text, None);
        req.prompt_mode = Some(PromptMode::Streaming);
        let r = resolve(&cfg, &req).unwrap();
        let streaming =
            Prompt::build(&cfg, &r, tok.encode(&r.assistant_text).unwrap(), None).unwrap();
        assert!(streaming.rows.len() < non_streaming.rows.len());
        assert_eq!(streaming.text_ids(), non_streaming.text_ids());
        assert_eq!(streaming.positions(&cfg), non_streaming.positions(&cfg) - 1);
    }
}
