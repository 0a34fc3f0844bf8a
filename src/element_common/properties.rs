//! The synthesis properties every omnitts element has: their param specs, set and get on
//! [`SynthesisSettings`], and the read-only properties that describe the loaded checkpoint.
//!
//! An element lists [`synthesis_param_specs`] and [`model_info_param_specs`] among its own, and
//! forwards those names to [`SynthesisSettings::set_property`] / [`SynthesisSettings::property`]
//! and [`model_info_property`]. Properties flagged `MUTABLE_READY` are refused once the element
//! has started ([`refuse_ready_only`]).

use gst::glib;
use gst::prelude::*;

use crate::engine::Engine;

use super::bundled_voice;
use super::request::ModelInfo;
use super::settings::{
    DEFAULT_CHUNK_FRAMES, DEFAULT_INITIAL_CHUNK_FRAMES, DEFAULT_LANGUAGE, PromptModeSetting,
    QuantizationSetting, SAMPLING_DEFAULTS, SamplingDefaults, SynthesisSettings,
};
use crate::models::tts::{MAX_NEW_TOKENS_RANGE, SamplingParams};

/// Param specs of the model, stage config, device, voice, sampling and chunk properties, in the
/// order gst-inspect lists them.
pub(crate) fn synthesis_param_specs() -> Vec<glib::ParamSpec> {
    vec![
        glib::ParamSpecString::builder("model")
            .nick("Model")
            .blurb(
                "Checkpoint (Qwen3-TTS or Fish Audio S2 Pro): a local directory, or a Hugging Face repo id \
                 resolved through the HF cache (HF_HOME / HF_HUB_CACHE) and downloaded \
                 when online (HF_ENDPOINT, HF_HUB_OFFLINE); default (and for NULL, an empty or a blank \
                 value): the bundled small English voice (speaker joe), found in OMNITTS_VOICE_DIR, else \
                 omnitts/voices/omnitts-en under the XDG data directories or the plugin's \
                 prefix (scripts/install.sh), else the source tree's models/omnitts-en",
            )
            .default_value(Some(bundled_voice::default_model().as_str()))
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("stage-config")
            .nick("Stage config")
            .blurb(
                "YAML file with the engine's stage configuration (chunk sizes, queues), of the \
                 checkpoint's model family; unset: that family's built-in async-chunk \
                 configuration (configs/qwen3_tts.yaml, configs/fish_speech.yaml)",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("ar-device")
            .nick("AR device")
            .blurb(
                "Device of stage 0 (talker + code predictor): cpu, cuda:N, or auto (CUDA \
                 device 0 in a CUDA build with a GPU, else cpu); unset: the stage config's \
                 runtime.devices (auto in the built-in one)",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("decoder-device")
            .nick("Decoder device")
            .blurb(
                "Device of stage 1 (Code2Wav decoder): cpu, cuda:N, or auto; unset: the \
                 stage config's runtime.devices (auto in the built-in one)",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecEnum::builder_with_default("quantization", QuantizationSetting::Auto)
            .nick("Quantization")
            .blurb(
                "Stored form of stage 0's linear weights (talker and code predictor, not the \
                 output heads): auto = the stage config's engine_args.quantization (auto in the \
                 built-in one: int8 on the CPU where its fast kernels apply), none = dense \
                 (reference parity), q8-0 = int8, q4-k = 4-bit; the quantized forms run on the \
                 CPU only (docs/cpu.md); Qwen3-TTS only (Fish S2 Pro refuses q8-0 and q4-k)",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecBoolean::builder("shared-engine")
            .nick("Shared engine")
            .blurb(
                "Share one loaded engine with every omnitts element of this process that uses \
                 the same model, devices and stage config: one model in memory, and stage 0 \
                 batches all their utterances in each step. false: load an engine of its own",
            )
            .default_value(true)
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("speaker")
            .nick("Speaker")
            .blurb(
                "Preset speaker of a CustomVoice checkpoint (case-insensitive, see \
                 available-speakers); unset: the checkpoint's alphabetically first speaker \
                 (joe in the bundled voice, aiden in the released checkpoints); a checkpoint \
                 without presets (Qwen3-TTS Base and VoiceDesign, Fish S2 Pro) refuses it. \
                 Applies to text queued after it is set",
            )
            .mutable_playing()
            .build(),
        glib::ParamSpecString::builder("language")
            .nick("Language")
            .blurb(
                "Language of the text, case-insensitive: a name (see available-languages) \
                 or its ISO 639-1 code (en, zh, ja, ko, de, fr, ru, pt, es, it), or auto; \
                 Fish S2 Pro, which takes no language, refuses any other value. Applies to \
                 text queued after it is set",
            )
            .default_value(Some(DEFAULT_LANGUAGE))
            .mutable_playing()
            .build(),
        glib::ParamSpecString::builder("instruct")
            .nick("Instruct")
            .blurb(
                "Style instruction (1.7B CustomVoice) or voice description (VoiceDesign); \
                 ignored by 0.6B CustomVoice and Base (with a warning, as for a VoiceDesign \
                 checkpoint without one); refused by Fish S2 Pro. Applies to text queued after \
                 it is set",
            )
            .mutable_playing()
            .build(),
        glib::ParamSpecEnum::builder_with_default("prompt-mode", PromptModeSetting::Auto)
            .nick("Prompt mode")
            .blurb(
                "Where the text goes in the model's prompt: fed one token per frame \
                 (streaming) or all at once (non-streaming); auto: the variant's default. \
                 Qwen3-TTS only (Fish S2 Pro refuses streaming and non-streaming). Applies to \
                 text queued after it is set",
            )
            .mutable_playing()
            .build(),
        glib::ParamSpecString::builder("ref-audio")
            .nick("Reference audio")
            .blurb(
                "Checkpoints that clone voices (Qwen3-TTS Base, where it is required; Fish \
                 S2 Pro, where it is optional): the recording whose voice is cloned, a file \
                 path or URI in any format GStreamer decodes (resampled to the model's \
                 reference rate, mono: 24 kHz for Qwen3-TTS, 44.1 kHz for Fish); within the \
                 model's length limits (Qwen3-TTS Base: 0.5 s to 60 s), not silent (peak \
                 above -60 dBFS). Decoded once and encoded once per recording. Applies to \
                 text queued after it is set",
            )
            .mutable_playing()
            .build(),
        glib::ParamSpecString::builder("ref-text")
            .nick("Reference text")
            .blurb(
                "The transcript of ref-audio, for in-context (ICL) cloning from the \
                 reference's codec codes (Qwen3-TTS Base: and its speaker embedding; Fish S2 \
                 Pro: always required with ref-audio); required unless x-vector-only=true \
                 (then ignored). Applies to text \
                 queued after it is set",
            )
            .mutable_playing()
            .build(),
        glib::ParamSpecBoolean::builder("x-vector-only")
            .nick("X-vector only")
            .blurb(
                "Qwen3-TTS Base only: clone from the speaker embedding (x-vector) of \
                 ref-audio alone, without its transcript and codes (ref-text ignored); \
                 false: ICL cloning, which needs ref-text. Applies to text queued after \
                 it is set",
            )
            .default_value(false)
            .mutable_playing()
            .build(),
        glib::ParamSpecBoolean::builder("do-sample")
            .nick("Sample")
            .blurb(
                "Sample codes (true) or decode greedily, every codebook (false, \
                 deterministic). Unset sampling properties: the stage config's \
                 default_sampling_params, else the checkpoint's defaults (those shown are \
                 the released Qwen3-TTS checkpoints'; once a model is loaded an unset one \
                 reads as its value: the bundled voice is greedy, Fish S2 Pro samples at \
                 temperature 1.0, top-k 30, top-p 0.9)",
            )
            .default_value(SAMPLING_DEFAULTS.do_sample)
            .mutable_playing()
            .build(),
        glib::ParamSpecDouble::builder("temperature")
            .nick("Temperature")
            .blurb("Sampling temperature of the codes (0 = greedy)")
            .minimum(0.0)
            .maximum(2.0)
            .default_value(SAMPLING_DEFAULTS.temperature)
            .mutable_playing()
            .build(),
        glib::ParamSpecUInt::builder("top-k")
            .nick("Top-k")
            .blurb("Sample among the k most likely codes (0 = no limit)")
            .minimum(0)
            .maximum(4096)
            .default_value(SAMPLING_DEFAULTS.top_k)
            .mutable_playing()
            .build(),
        glib::ParamSpecDouble::builder("top-p")
            .nick("Top-p")
            .blurb("Nucleus sampling probability mass (1 = off)")
            .minimum(0.01)
            .maximum(1.0)
            .default_value(SAMPLING_DEFAULTS.top_p)
            .mutable_playing()
            .build(),
        glib::ParamSpecDouble::builder("repetition-penalty")
            .nick("Repetition penalty")
            .blurb("Penalty on codes already generated (1 = off)")
            .minimum(1.0)
            .maximum(2.0)
            .default_value(SAMPLING_DEFAULTS.repetition_penalty)
            .mutable_playing()
            .build(),
        glib::ParamSpecUInt::builder("max-new-tokens")
            .nick("Max new tokens")
            .blurb(
                "Generation steps per utterance (per generation batch of a Fish S2 Pro \
                 dialogue), as the reference's max_new_tokens: at most N - 1 codec frames of \
                 audio (12.5 a second for Qwen3-TTS, ~21.5 for Fish S2 Pro); the stage \
                 config's runaway guard may end it earlier",
            )
            .minimum(*MAX_NEW_TOKENS_RANGE.start())
            .maximum(*MAX_NEW_TOKENS_RANGE.end())
            .default_value(SAMPLING_DEFAULTS.max_new_tokens)
            .mutable_playing()
            .build(),
        glib::ParamSpecUInt64::builder("seed")
            .nick("Seed")
            .blurb("Random seed of every utterance (same seed and text: same audio)")
            .default_value(SAMPLING_DEFAULTS.seed)
            .mutable_playing()
            .build(),
        glib::ParamSpecUInt::builder("initial-chunk-frames")
            .nick("Initial chunk frames")
            .blurb(
                "Codec frames (80 ms each for Qwen3-TTS, ~46 ms for Fish S2 Pro) in the first audio chunk of an utterance; \
                 smaller = earlier first audio. 0 = the stage config's value. Sets the \
                 live latency",
            )
            .minimum(0)
            .maximum(1000)
            .default_value(DEFAULT_INITIAL_CHUNK_FRAMES)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("chunk-frames")
            .nick("Chunk frames")
            .blurb(
                "Codec frames (80 ms each for Qwen3-TTS, ~46 ms for Fish S2 Pro) per audio chunk after the first. 0 = the stage \
                 config's value; live: the first chunk's size, so that audio keeps pace \
                 with the latency",
            )
            .minimum(0)
            .maximum(1000)
            .default_value(DEFAULT_CHUNK_FRAMES)
            .mutable_playing()
            .build(),
    ]
}

/// Param specs of the read-only properties that describe the loaded checkpoint.
pub(crate) fn model_info_param_specs() -> Vec<glib::ParamSpec> {
    vec![
        glib::ParamSpecString::builder("available-speakers")
            .nick("Available speakers")
            .blurb("Preset speakers of the loaded checkpoint, comma-separated (after start)")
            .read_only()
            .build(),
        glib::ParamSpecString::builder("available-languages")
            .nick("Available languages")
            .blurb(
                "Languages of the loaded checkpoint, comma-separated, auto among them (after \
                 start; empty for a model that takes none)",
            )
            .read_only()
            .build(),
        glib::ParamSpecUInt64::builder("voice-clone-encodes")
            .nick("Voice-clone encodes")
            .blurb(
                "Checkpoints that clone: how many times the engine has encoded a reference \
                 (its encoders) since it was loaded; utterances reusing a \
                 reference take it from the engine's cache; a shared engine counts for \
                 every element sharing it (0 before start)",
            )
            .read_only()
            .build(),
    ]
}

/// The value of a [`model_info_param_specs`] property; `loaded` is `None` before start, its
/// engine `None` with a server (which encodes the references itself). `None` for any other name.
pub(crate) fn model_info_property(
    name: &str,
    loaded: Option<(&ModelInfo, Option<&Engine>)>,
) -> Option<glib::Value> {
    Some(match name {
        "available-speakers" => loaded
            .map(|(info, _)| info.description.speakers.join(","))
            .to_value(),
        "available-languages" => loaded
            .map(|(info, _)| info.description.languages.join(","))
            .to_value(),
        "voice-clone-encodes" => loaded
            .and_then(|(_, engine)| engine)
            .map_or(0, |engine| engine.voice_clone_stats().encodes)
            .to_value(),
        _ => return None,
    })
}

/// Whether setting `pspec` now must be refused: it is flagged mutable only in NULL/READY (the
/// model load or the caps depend on it) and the element has `started`. Then a warning on the bus
/// says that the element keeps its current value.
pub(crate) fn refuse_ready_only(
    element: &gst::Element,
    pspec: &glib::ParamSpec,
    value: &glib::Value,
    started: bool,
) -> bool {
    if !started || !pspec.flags().contains(gst::PARAM_FLAG_MUTABLE_READY) {
        return false;
    }
    let name = pspec.name();
    // A write-only value (the API key) is not shown; an enum by its nick, a string quoted.
    let shown = if !pspec.flags().contains(glib::ParamFlags::READABLE) {
        "the new value".to_string()
    } else if let Some((_, v)) = glib::EnumValue::from_value(value) {
        format!("'{}'", v.nick())
    } else if let Ok(s) = value.get::<Option<String>>() {
        format!(
            "'{}'",
            super::input_error::quoted(s.as_deref().unwrap_or_default())
        )
    } else {
        // Numbers and booleans as gst-launch writes them.
        value
            .serialize()
            .map_or_else(|_| format!("{value:?}"), |v| v.to_string())
    };
    gst::element_warning!(
        element,
        gst::CoreError::StateChange,
        (
            "property '{name}' can only be changed in the NULL or READY state; {} ignored, the \
             element keeps its current value",
            shown
        )
    );
    true
}

impl SynthesisSettings {
    /// Sets the property `name` (one of [`synthesis_param_specs`]) to `value`, type-checked by
    /// GObject; false for any other name.
    pub fn set_property(&mut self, name: &str, value: &glib::Value) -> bool {
        let s = self;
        match name {
            // NULL, empty or blank: unset, the bundled voice (the default), as an empty speaker,
            // device or server is unset; a start without it found lists the places searched.
            "model" => {
                s.model = value
                    .get::<Option<String>>()
                    .expect("type checked upstream")
                    .filter(|m| !m.trim().is_empty())
                    .unwrap_or_else(bundled_voice::default_model)
            }
            "stage-config" => s.stage_config = value.get().expect("type checked upstream"),
            "ar-device" => s.ar_device = value.get().expect("type checked upstream"),
            "decoder-device" => s.decoder_device = value.get().expect("type checked upstream"),
            "shared-engine" => s.shared_engine = value.get().expect("type checked upstream"),
            "quantization" => s.quantization = value.get().expect("type checked upstream"),
            "speaker" => s.speaker = value.get().expect("type checked upstream"),
            "language" => {
                s.language = value
                    .get::<Option<String>>()
                    .expect("type checked upstream")
                    .unwrap_or_else(|| DEFAULT_LANGUAGE.into())
            }
            "instruct" => s.instruct = value.get().expect("type checked upstream"),
            "prompt-mode" => s.prompt_mode = value.get().expect("type checked upstream"),
            "ref-audio" => s.ref_audio = value.get().expect("type checked upstream"),
            "ref-text" => s.ref_text = value.get().expect("type checked upstream"),
            "x-vector-only" => s.x_vector_only = value.get().expect("type checked upstream"),
            "do-sample" => s.do_sample = Some(value.get().expect("type checked upstream")),
            "temperature" => s.temperature = Some(value.get().expect("type checked upstream")),
            "top-k" => s.top_k = Some(value.get().expect("type checked upstream")),
            "top-p" => s.top_p = Some(value.get().expect("type checked upstream")),
            "repetition-penalty" => {
                s.repetition_penalty = Some(value.get().expect("type checked upstream"))
            }
            "max-new-tokens" => {
                s.max_new_tokens = Some(value.get().expect("type checked upstream"))
            }
            "seed" => s.seed = Some(value.get().expect("type checked upstream")),
            "initial-chunk-frames" => {
                s.initial_chunk_frames = value.get().expect("type checked upstream")
            }
            "chunk-frames" => s.chunk_frames = value.get().expect("type checked upstream"),
            _ => return false,
        }
        true
    }

    /// The value of the property `name` (one of [`synthesis_param_specs`]): an unset sampling
    /// property shows its default, the `loaded` checkpoint's (its engine's defaults: the model's
    /// generation defaults under the stage config) once one is, else the released Qwen3-TTS
    /// checkpoints' under the built-in stage config. `None` for any other name.
    pub fn property(&self, name: &str, loaded: Option<&SamplingParams>) -> Option<glib::Value> {
        let s = self;
        let of_loaded = loaded.map(SamplingDefaults::of);
        let d = of_loaded.as_ref().unwrap_or(&*SAMPLING_DEFAULTS);
        Some(match name {
            "model" => s.model.to_value(),
            "stage-config" => s.stage_config.to_value(),
            "ar-device" => s.ar_device.to_value(),
            "decoder-device" => s.decoder_device.to_value(),
            "shared-engine" => s.shared_engine.to_value(),
            "quantization" => s.quantization.to_value(),
            "speaker" => s.speaker.to_value(),
            "language" => s.language.to_value(),
            "instruct" => s.instruct.to_value(),
            "prompt-mode" => s.prompt_mode.to_value(),
            "ref-audio" => s.ref_audio.to_value(),
            "ref-text" => s.ref_text.to_value(),
            "x-vector-only" => s.x_vector_only.to_value(),
            "do-sample" => s.do_sample.unwrap_or(d.do_sample).to_value(),
            "temperature" => s.temperature.unwrap_or(d.temperature).to_value(),
            "top-k" => s.top_k.unwrap_or(d.top_k).to_value(),
            "top-p" => s.top_p.unwrap_or(d.top_p).to_value(),
            "repetition-penalty" => s
                .repetition_penalty
                .unwrap_or(d.repetition_penalty)
                .to_value(),
            "max-new-tokens" => s.max_new_tokens.unwrap_or(d.max_new_tokens).to_value(),
            "seed" => s.seed.unwrap_or(d.seed).to_value(),
            "initial-chunk-frames" => s.initial_chunk_frames.to_value(),
            "chunk-frames" => s.chunk_frames.to_value(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every synthesis spec is settable and readable through the shared set/get, and no other
    /// name is taken.
    #[test]
    fn specs_and_set_get_cover_the_same_names() {
        let mut s = SynthesisSettings::default();
        for spec in synthesis_param_specs() {
            let name = spec.name();
            let v = s
                .property(name, None)
                .unwrap_or_else(|| panic!("{name}: no getter"));
            assert_eq!(v.type_(), spec.value_type(), "{name}");
            assert!(
                s.set_property(name, spec.default_value()),
                "{name}: no setter"
            );
        }
        assert!(!s.set_property("text", &"x".to_value()));
        assert!(s.property("is-live", None).is_none());
        for spec in model_info_param_specs() {
            let v = model_info_property(spec.name(), None).unwrap();
            assert_eq!(v.type_(), spec.value_type(), "{}", spec.name());
        }
        assert!(model_info_property("model", None).is_none());
    }

    /// `model` set to NULL, "" or blank is unset: the bundled voice, reading back as the
    /// property's default (the directory found), never "" (which fails the start without
    /// searching for the voice).
    #[test]
    fn an_unset_model_is_the_bundled_voice() {
        let spec = synthesis_param_specs()
            .into_iter()
            .find(|p| p.name() == "model")
            .unwrap();
        let default = spec.default_value().get::<String>().unwrap();
        assert_eq!(default, bundled_voice::default_model());
        let mut s = SynthesisSettings::default();
        assert_eq!(s.model, default);
        for unset in [None, Some(""), Some("  \t\n")] {
            assert!(s.set_property("model", &"/some/checkpoint".to_value()));
            assert_eq!(s.model, "/some/checkpoint");
            assert!(s.set_property("model", &unset.to_value()));
            assert_eq!(s.model, default, "{unset:?}");
            assert_eq!(
                s.property("model", None).unwrap().get::<String>().unwrap(),
                default,
                "{unset:?} reads back"
            );
        }
    }

    #[test]
    fn unset_sampling_shows_the_default_and_set_values_stick() {
        let mut s = SynthesisSettings::default();
        assert_eq!(
            s.property("seed", None).unwrap().get::<u64>().unwrap(),
            SAMPLING_DEFAULTS.seed
        );
        assert!(s.set_property("seed", &7u64.to_value()));
        assert_eq!(s.seed, Some(7));
        assert!(s.set_property("language", &None::<String>.to_value()));
        assert_eq!(s.language, DEFAULT_LANGUAGE);
        let ready_only: Vec<_> = synthesis_param_specs()
            .into_iter()
            .filter(|p| p.flags().contains(gst::PARAM_FLAG_MUTABLE_READY))
            .map(|p| p.name().to_string())
            .collect();
        assert_eq!(
            ready_only,
            [
                "model",
                "stage-config",
                "ar-device",
                "decoder-device",
                "quantization",
                "shared-engine",
                "initial-chunk-frames"
            ]
        );
    }
}
