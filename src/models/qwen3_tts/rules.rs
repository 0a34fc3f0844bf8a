//! Qwen3-TTS's request rules without its weights ([`Qwen3Rules`]): the description of a
//! checkpoint (variant, speakers, languages, instruct, voice cloning) and the checks of
//! [`super::prompt::resolve`].

use std::path::Path;
use std::sync::{Arc, OnceLock};

use super::checkpoint::Checkpoint;
use super::code2wav::SpeechTokenizerConfig;
use super::config::ModelVariant;
use super::prompt::{self, Prompt};
use super::tokenizer::TextTokenizer;
use super::voice_clone::{MAX_REF_AUDIO_SAMPLES, MIN_REF_AUDIO_SAMPLES};
use crate::models::tts::{
    InstructUse, ModelDescription, ModelError, PromptMode, ReferenceRules, ReferenceUse,
    SamplingParams, VoiceRequest, VoiceRules,
};

/// The rate, Hz, Base's speaker and codec encoders take a reference recording at.
pub const REF_AUDIO_RATE: u32 = 24_000;

/// A Qwen3-TTS checkpoint's configs and what they make of a request.
#[derive(Debug, Clone)]
pub struct Qwen3Rules {
    ckpt: Checkpoint,
    description: ModelDescription,
    /// The text tokenizer, loaded the first time a text may be too long for one utterance
    /// ([`VoiceRules::check_length`]); most texts never need it.
    tokenizer: Arc<LazyTokenizer>,
}

/// A checkpoint's text tokenizer, kept once it has loaded; a load that failed is tried again
/// by the next text that needs it (the file may have been mended).
#[derive(Default)]
struct LazyTokenizer(OnceLock<TextTokenizer>);

impl std::fmt::Debug for LazyTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.0.get() {
            None => "not loaded",
            Some(_) => "loaded",
        };
        f.debug_tuple("LazyTokenizer").field(&state).finish()
    }
}

/// Most token ids a UTF-8 text of `n` bytes gives: the byte-level BPE makes an id of one byte at
/// least, after NFC, which at most triples a text's bytes (Unicode's UAX #15 bound for UTF-8).
fn ids_bound(bytes: usize) -> usize {
    bytes.saturating_mul(3)
}

/// More than the prompt rows that are no id of its texts nor a reference frame: the codec
/// prefix (think, language, speaker, pad, bos: 7 at most) and the rows after the text (eos,
/// the codec bos).
const OTHER_ROWS_BOUND: usize = 16;

impl Qwen3Rules {
    /// Reads `dir`'s config.json, generation_config.json and speech_tokenizer/config.json.
    /// Errors: [`ModelError::Io`] / [`ModelError::Json`] / [`ModelError::Config`] naming the
    /// file and field.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let ckpt = Checkpoint::open(dir)?;
        let codec =
            SpeechTokenizerConfig::from_file(&dir.join("speech_tokenizer").join("config.json"))?;
        let description = describe(&ckpt, &codec);
        Ok(Qwen3Rules {
            ckpt,
            description,
            tokenizer: Arc::default(),
        })
    }

    /// The checkpoint's text tokenizer (loaded now the first time). Errors: the load's
    /// [`ModelError`] (not kept: the next call loads again).
    fn tokenizer(&self) -> Result<&TextTokenizer, ModelError> {
        if let Some(t) = self.tokenizer.0.get() {
            return Ok(t);
        }
        let loaded = TextTokenizer::from_dir(&self.ckpt.dir)?;
        Ok(self.tokenizer.0.get_or_init(|| loaded))
    }

    /// The checkpoint's configs.
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ckpt
    }
}

/// The variant's name in messages.
fn variant_name(v: ModelVariant) -> &'static str {
    match v {
        ModelVariant::CustomVoice => "CustomVoice",
        ModelVariant::VoiceDesign => "VoiceDesign",
        ModelVariant::Base => "Base",
    }
}

/// Why a 0.6B CustomVoice checkpoint's instruct is dropped.
const CUSTOM_VOICE_DROPS_INSTRUCT: &str = "this CustomVoice checkpoint drops it, as the reference \
     does for the 0.6B size; style instructions need a 1.7B CustomVoice or a VoiceDesign checkpoint";

/// Base clones a 24 kHz reference of 0.5 s to 60 s; the other variants do not clone.
pub(super) fn reference_rules(variant: ModelVariant) -> ReferenceRules {
    match variant {
        ModelVariant::Base => ReferenceRules {
            use_: ReferenceUse::Required,
            sample_rate: REF_AUDIO_RATE,
            min_samples: MIN_REF_AUDIO_SAMPLES,
            max_samples: MAX_REF_AUDIO_SAMPLES,
            speaker_embedding_only: true,
        },
        _ => ReferenceRules::none(REF_AUDIO_RATE),
    }
}

fn describe(ckpt: &Checkpoint, codec: &SpeechTokenizerConfig) -> ModelDescription {
    let cfg = &ckpt.config;
    let variant = cfg.variant;
    let speakers = cfg.supported_speakers();
    let instruct = match variant {
        ModelVariant::VoiceDesign => InstructUse::Required,
        ModelVariant::CustomVoice if prompt::uses_instruct(cfg) => InstructUse::Used,
        ModelVariant::CustomVoice => InstructUse::Ignored(CUSTOM_VOICE_DROPS_INSTRUCT.into()),
        ModelVariant::Base => InstructUse::Ignored(
            "a Base checkpoint speaks in the voice of its reference (ref-audio)".into(),
        ),
    };
    let reference = reference_rules(variant);
    ModelDescription {
        model_type: "qwen3_tts".into(),
        name: format!("Qwen3-TTS {}", variant_name(variant)),
        sample_rate: codec.output_sample_rate,
        samples_per_frame: codec.decode_upsample_rate,
        num_codebooks: cfg.talker_config.num_code_groups,
        default_speaker: match variant {
            ModelVariant::CustomVoice => speakers.first().cloned(),
            _ => None,
        },
        speakers,
        languages: cfg.supported_languages(),
        instruct,
        reference,
        prompt_modes: true,
        open_text: true,
        speaker_turn_tag: None,
    }
}

impl VoiceRules for Qwen3Rules {
    fn description(&self) -> &ModelDescription {
        &self.description
    }

    fn default_sampling(&self) -> SamplingParams {
        SamplingParams::from_generation_config(&self.ckpt.generation)
    }

    fn check(&self, voice: &VoiceRequest) -> Result<(), ModelError> {
        prompt::resolve(&self.ckpt.config, voice).map(|_| ())
    }

    /// The prompt and the frames share the talker's positions (`max_position_embeddings`), and a
    /// prompt takes at least one: a frame cap of that many or more fits no request. (Whether a
    /// given prompt fits beside the cap is checked when it starts.)
    fn check_sampling(&self, sampling: &SamplingParams) -> Result<(), ModelError> {
        let budget = prompt::position_budget(&self.ckpt.config);
        if sampling.max_new_tokens < budget {
            return Ok(());
        }
        Err(ModelError::InvalidRequest {
            field: "max_new_tokens".into(),
            value: sampling.max_new_tokens.to_string(),
            msg: format!(
                "the talker's {budget} positions (max_position_embeddings) hold the prompt and \
                 the frames together: the cap must be below {budget}, less the prompt's \
                 positions (set by max-new-tokens, or the stage config's \
                 default_sampling_params.max_tokens when the property is not set)"
            ),
        })
    }

    /// The prompt ([`Prompt::plan`]: its text ids, the settings' rows, an ICL reference's text
    /// and frames) and `max_new_tokens` frames must fit the talker's positions
    /// ([`Prompt::check_position_budget`], as stage 0 checks). A prompt whose bound from its
    /// texts' bytes fits is not tokenized.
    fn check_length(&self, voice: &VoiceRequest, max_new_tokens: usize) -> Result<(), ModelError> {
        let cfg = &self.ckpt.config;
        let r = prompt::resolve(cfg, voice)?;
        let bytes = r.assistant_text.len()
            + r.instruct_text.as_ref().map_or(0, String::len)
            + r.ref_text.as_ref().map_or(0, String::len);
        let bound = ids_bound(bytes)
            .saturating_add(r.ref_frames)
            .saturating_add(OTHER_ROWS_BOUND);
        if bound.saturating_add(max_new_tokens) <= prompt::position_budget(cfg) {
            return Ok(());
        }
        Prompt::plan(cfg, self.tokenizer()?, voice)?.check_position_budget(
            cfg,
            &voice.text,
            max_new_tokens,
        )
    }

    /// Open text needs the streaming prompt mode (one text token per codec frame) and no ICL
    /// clone (its reference transcript comes before the text).
    fn check_open(&self, voice: &VoiceRequest) -> Result<(), ModelError> {
        let r = prompt::resolve(&self.ckpt.config, voice)?;
        if r.mode != PromptMode::Streaming {
            return Err(ModelError::InvalidRequest {
                field: "prompt_mode".into(),
                value: "non-streaming".into(),
                msg: "text that is still arriving needs the streaming prompt mode (one text \
                      token per codec frame)"
                    .into(),
            });
        }
        if r.ref_text.is_some() {
            return Err(ModelError::InvalidRequest {
                field: "voice_clone".into(),
                value: "icl".into(),
                msg: "text that is still arriving cannot use an ICL voice clone (use an \
                      x-vector-only clone)"
                    .into(),
            });
        }
        Ok(())
    }
}

/// The description of a Qwen3-TTS checkpoint known only by its variant, speakers and languages
/// (a model served by a remote vLLM-Omni server): 24 kHz, 1920 samples and 16 codes a frame.
/// `uses_instruct` false describes a checkpoint that drops the instruct.
pub fn served_description(
    variant: ModelVariant,
    speakers: Vec<String>,
    languages: Vec<String>,
    uses_instruct: bool,
) -> ModelDescription {
    let instruct = match variant {
        ModelVariant::VoiceDesign => InstructUse::Required,
        ModelVariant::Base => InstructUse::Ignored(
            "a Base checkpoint speaks in the voice of its reference (ref-audio)".into(),
        ),
        ModelVariant::CustomVoice if uses_instruct => InstructUse::Used,
        ModelVariant::CustomVoice => InstructUse::Ignored(CUSTOM_VOICE_DROPS_INSTRUCT.into()),
    };
    ModelDescription {
        model_type: "qwen3_tts".into(),
        name: format!("Qwen3-TTS {}", variant_name(variant)),
        sample_rate: REF_AUDIO_RATE,
        samples_per_frame: 1920,
        num_codebooks: 16,
        default_speaker: match variant {
            ModelVariant::CustomVoice => speakers.first().cloned(),
            _ => None,
        },
        speakers,
        languages,
        instruct,
        reference: reference_rules(variant),
        prompt_modes: true,
        open_text: true,
        speaker_turn_tag: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::tts::TOO_LONG_FOR_ONE_UTTERANCE;

    fn rules() -> Qwen3Rules {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        Qwen3Rules::open(&dir).unwrap()
    }

    fn voice(text: &str, mode: PromptMode) -> VoiceRequest {
        VoiceRequest {
            text: text.into(),
            speaker: Some("vivian".into()),
            prompt_mode: Some(mode),
            ..VoiceRequest::default()
        }
    }

    /// A text whose bound from its bytes fits is accepted without the tokenizer, which is then
    /// never loaded.
    #[test]
    fn a_short_text_is_not_tokenized() {
        let r = rules();
        let v = voice(&"Hello there. ".repeat(100), PromptMode::NonStreaming);
        assert!(r.check_length(&v, 4096).is_ok());
        assert!(r.tokenizer.0.get().is_none(), "{:?}", r.tokenizer);
    }

    /// Where the caller-side check refuses, stage 0 would too, and only there: at the position
    /// budget's edge, in both prompt modes, it agrees with the prompt stage 0 plans.
    #[test]
    fn the_length_check_agrees_with_stage_0() {
        let r = rules();
        let cfg = &r.checkpoint().config;
        let budget = prompt::position_budget(cfg);
        let tok = TextTokenizer::from_dir(&r.checkpoint().dir).unwrap();
        let text = "one two three four five six seven eight nine ten ".repeat(40);
        for mode in [PromptMode::NonStreaming, PromptMode::Streaming] {
            let v = voice(&text, mode);
            let positions = Prompt::plan(cfg, &tok, &v).unwrap().positions(cfg);
            for frames in [budget - positions - 1, budget - positions] {
                assert!(r.check_length(&v, frames).is_ok(), "{mode:?} {frames}");
            }
            let e = r.check_length(&v, budget - positions + 1).unwrap_err();
            match e {
                ModelError::InvalidRequest { field, msg, .. } => {
                    assert_eq!(field, "text");
                    assert!(msg.starts_with(TOO_LONG_FOR_ONE_UTTERANCE), "{msg}");
                }
                e => panic!("{e}"),
            }
            // No room for any text: the frame cap is named instead.
            let e = r.check_length(&v, budget - 1).unwrap_err();
            assert!(
                matches!(&e, ModelError::InvalidRequest { field, .. } if field == "max_new_tokens"),
                "{e}"
            );
        }
    }

    /// A tokenizer that failed to load is not kept: once its files are back, the next long
    /// text loads it and is checked.
    #[test]
    fn a_failed_tokenizer_load_is_tried_again() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        let dir = std::env::temp_dir().join(format!("omnitts-rules-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("speech_tokenizer")).unwrap();
        for f in [
            "config.json",
            "generation_config.json",
            "speech_tokenizer/config.json",
        ] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        let r = Qwen3Rules::open(&dir).unwrap();
        let long = voice(&"word ".repeat(3_000), PromptMode::NonStreaming);
        let e = r.check_length(&long, 1).unwrap_err();
        assert!(
            matches!(e, ModelError::Tokenizer(_) | ModelError::Io { .. }),
            "{e}"
        );
        for f in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        assert!(r.check_length(&long, 1).is_ok());
        assert!(r.tokenizer.0.get().is_some(), "{:?}", r.tokenizer);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The bound that spares short texts the tokenizer: no text gives more ids than three per
    /// byte, also where NFC lengthens it (U+0958 decomposes), in other scripts and emoji.
    #[test]
    fn ids_never_exceed_the_bytes_bound() {
        let tok = TextTokenizer::from_dir(&rules().checkpoint().dir).unwrap();
        for s in [
            "word ".repeat(50),
            "\u{0958}".repeat(50),
            "\u{2126}\u{212B}".repeat(30),
            "日本語のテキスト".repeat(20),
            "😀🎉 ".repeat(30),
            "مرحبا بالعالم ".repeat(20),
            "a\u{0301}\u{0323} ".repeat(30),
        ] {
            let ids = tok.encode(&s).unwrap().len();
            assert!(
                ids <= ids_bound(s.len()),
                "{s:?}: {ids} ids, {} bytes",
                s.len()
            );
        }
    }
}
