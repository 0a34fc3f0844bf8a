//! Qwen3-TTS's request rules without its weights ([`Qwen3Rules`]): the description of a
//! checkpoint (variant, speakers, languages, instruct, voice cloning) and the checks of
//! [`super::prompt::resolve`].

use std::path::Path;

use super::checkpoint::Checkpoint;
use super::code2wav::SpeechTokenizerConfig;
use super::config::ModelVariant;
use super::prompt;
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
}

impl Qwen3Rules {
    /// Reads `dir`'s config.json, generation_config.json and speech_tokenizer/config.json.
    /// Errors: [`ModelError::Io`] / [`ModelError::Json`] / [`ModelError::Config`] naming the
    /// file and field.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let ckpt = Checkpoint::open(dir)?;
        let codec =
            SpeechTokenizerConfig::from_file(&dir.join("speech_tokenizer").join("config.json"))?;
        let description = describe(&ckpt, &codec);
        Ok(Qwen3Rules { ckpt, description })
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
