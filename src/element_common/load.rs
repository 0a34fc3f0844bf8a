//! From the settings to a loaded engine: the stage config, the devices, the checkpoint (through
//! [`super::hub`]), what the engine tells about it ([`ModelInfo`]) and, for Base checkpoints, the
//! reference voice decoded and encoded once, so that a bad reference fails the state change.
//! Every error names the property and its value.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::{
    DeviceSpec, Engine, EngineError, EngineOptions, SharedEngine, StageConfig, registry,
};
use crate::models::registry as families;
use crate::nn::{Quantization, QuantizationSpec, WeightForm};

use super::bundled_voice;
use super::hub;
use super::input_error::{InputError, input_error};
use super::request::{ModelInfo, build_request, validated};
use super::settings::SynthesisSettings;
use super::voice_clone::VoiceCloner;

/// What an element holds from start to stop.
pub(crate) struct Loaded {
    /// The element's share of its engine (loaded for it, or joined: see
    /// [`SharedEngine::loaded`]); also held by the element's worker, which submits the utterances.
    pub engine: Arc<SharedEngine>,
    pub info: ModelInfo,
    /// Holds the reference decoded at start (Base checkpoints).
    pub cloner: VoiceCloner,
}

/// Loads everything an element's `start()` needs for the settings `s`; `live` elements get
/// later chunks as small as the first (see [`model_info`]). Warnings (unknown stage-config keys,
/// ignored `ref-text`) are posted on `element`'s bus, progress is logged in `cat`.
pub(crate) fn load(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
    live: bool,
) -> Result<Loaded, gst::ErrorMessage> {
    let dir = resolve_model(element, cat, s)?;
    let stage_config = load_stage_config(element, s, &dir)?;
    let (engine, dir) = load_engine(element, cat, s, &stage_config, dir)?;
    let info = model_info(element, s, &stage_config, &engine, dir, live);
    let cloner = prepare_voice(element, cat, s, &info, &engine)?;
    Ok(Loaded {
        engine,
        info,
        cloner,
    })
}

/// How an element came by its engine, for its model-ready message: loaded for it, joined (with
/// how many elements share it), or of its own (`shared-engine=false`).
pub(crate) fn sharing(engine: &SharedEngine, shared_engine: bool) -> String {
    match (engine.loaded(), engine.users()) {
        (true, 1) if shared_engine => "engine loaded".to_string(),
        (true, _) if !shared_engine => "engine of its own (shared-engine=false)".to_string(),
        (true, n) => format!("engine loaded, {n} elements share it"),
        (false, n) => format!("joined the loaded engine, {n} elements share it"),
    }
}

/// The `stage-config` file, or the built-in configuration when unset, with the `quantization`
/// property applied; its warnings go to the bus. The built-in one is the model family's
/// (`configs/qwen3_tts.yaml`, `configs/fish_speech.yaml`), chosen by the checkpoint in `dir`.
fn load_stage_config(
    element: &gst::Element,
    s: &SynthesisSettings,
    dir: &Path,
) -> Result<StageConfig, gst::ErrorMessage> {
    // The checkpoint's family, for the checks that name a property (an unreadable checkpoint is
    // reported by the built-in config's load or the engine's).
    let family = families::detect(dir).ok();
    let (mut stage_config, warnings) = match s.stage_config.as_deref().map(str::trim) {
        Some(p) if !p.is_empty() => {
            let (c, warnings) = StageConfig::from_yaml_file(Path::new(p))
                .map_err(|e| input_error("stage-config", p, e.to_string()).to_error_msg())?;
            // Another family's stage config is named here, with its file (the engine checks
            // it again at load).
            if let Some(family) = family
                && let Err(e) = c.check_family(family)
            {
                let why = match e {
                    EngineError::Config { key, msg, .. } => format!("{key}: {msg}"),
                    e => e.to_string(),
                };
                return Err(input_error("stage-config", p, why).to_error_msg());
            }
            (c, warnings)
        }
        _ => {
            let c = StageConfig::default_for_model(dir).map_err(|e| {
                gst::error_msg!(
                    gst::ResourceError::OpenRead,
                    ("model '{}' ({}): {}", s.model, dir.display(), e)
                )
            })?;
            (c, Vec::new())
        }
    };
    for w in &warnings {
        gst::element_warning!(
            element,
            gst::ResourceError::Settings,
            ("stage-config '{}': {}", s.stage_config_name(), w)
        );
    }
    if let Some(q) = s.quantization.quantization() {
        // A family that loads dense weights only refuses a quantized form here, naming the
        // property (the loader would name the stage config's key).
        if let (QuantizationSpec::Form(form), Some(family)) = (q, family)
            && form != Quantization::None
            && !family.quantized_weights
        {
            return Err(input_error(
                "quantization",
                s.quantization.nick(),
                format!(
                    "{} loads dense weights only: leave quantization auto or set none",
                    family.name
                ),
            )
            .to_error_msg());
        }
        stage_config.ar.quantization = q;
    }
    Ok(stage_config)
}

/// Parses a device property the way the engine does and checks that this build can use it;
/// `None` (unset) takes the stage config's device.
fn parse_device(
    property: &'static str,
    value: Option<&str>,
    from_stage_config: DeviceSpec,
) -> Result<DeviceSpec, InputError> {
    // Unset, empty or blank: the stage config's device (as an empty speaker or language is unset).
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(from_stage_config);
    };
    let spec =
        DeviceSpec::from_str(value).map_err(|e| input_error(property, value, e.to_string()))?;
    spec.check_supported()
        .map_err(|e| input_error(property, value, e.to_string()))?;
    Ok(spec)
}

/// The `model` property resolved to a checkpoint directory (a local path, or a Hugging Face
/// repo id through the cache).
fn resolve_model(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
) -> Result<PathBuf, gst::ErrorMessage> {
    let resolved = hub::resolve_model(&s.model, &hub::HubOptions::from_env()).map_err(|e| {
        let kind = match e {
            hub::HubError::NotCached { .. } | hub::HubError::NotFound { .. } => {
                gst::ResourceError::NotFound
            }
            _ => gst::ResourceError::Settings,
        };
        match bundled_voice::not_found_hint(&s.model) {
            Some(hint) => gst::error_msg!(kind, ("{}; {}", e, hint)),
            None => gst::error_msg!(kind, ("{}", e)),
        }
    })?;
    gst::info!(
        cat,
        obj = element,
        "model '{}' → {} ({:?})",
        s.model,
        resolved.dir.display(),
        resolved.source
    );
    Ok(resolved.dir)
}

/// The one place an element gets its engine: the devices, and the engine of the checkpoint in
/// `dir` loaded on them with `stage_config`. Returns the engine and the directory.
fn load_engine(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
    stage_config: &StageConfig,
    dir: PathBuf,
) -> Result<(Arc<SharedEngine>, PathBuf), gst::ErrorMessage> {
    let ar_device = parse_device("ar-device", s.ar_device.as_deref(), stage_config.ar.device)
        .map_err(|e| e.to_error_msg())?;
    let decoder_device = parse_device(
        "decoder-device",
        s.decoder_device.as_deref(),
        stage_config.decoder.device,
    )
    .map_err(|e| e.to_error_msg())?;
    let opts = EngineOptions {
        model_dir: dir.clone(),
        stage_config: stage_config.clone(),
        ar_device,
        decoder_device,
    };
    let loaded = if s.shared_engine {
        registry::acquire(opts)
    } else {
        registry::bound_allocator_retention();
        Engine::load(opts).map(SharedEngine::unshared)
    };
    let engine = loaded.map_err(|e| {
        gst::error_msg!(
            gst::ResourceError::OpenRead,
            (
                "model '{}' ({}) could not be loaded (ar-device {}, decoder-device {}): {}",
                s.model,
                dir.display(),
                ar_device,
                decoder_device,
                e
            )
        )
    })?;
    gst::info!(
        cat,
        obj = element,
        "engine {} ({} elements share it); stage 0 weights: {}; CUDA graphs: {:?}, batched: {:?}",
        if engine.loaded() { "loaded" } else { "joined" },
        engine.users(),
        WeightForm::summary(engine.weight_forms()),
        engine.cuda_graphs(),
        engine.batch_graphs()
    );
    Ok((Arc::new(engine), dir))
}

/// What `engine` tells about its checkpoint, and the chunk sizes its requests get.
///
/// Live: later chunks as small as the first unless `chunk-frames` is set. Chunk k+1 then takes
/// as long to synthesise as chunk k takes to play whenever synthesis is faster than real time,
/// so a latency of one first chunk holds for the whole utterance. (The stage config's default,
/// 1 then 25 frames, would leave a gap after the first 80 ms unless RTF < 0.04.)
fn model_info(
    element: &gst::Element,
    s: &SynthesisSettings,
    stage_config: &StageConfig,
    engine: &Engine,
    dir: PathBuf,
    live: bool,
) -> ModelInfo {
    let first_chunk_frames = match stage_config
        .chunk_policy(s.initial_chunk(), s.chunk())
        .next_boundary(0)
    {
        Some(frames) => frames,
        None => {
            // async_chunk: false decodes whole utterances: no audio before the end.
            if live {
                gst::element_warning!(
                    element,
                    gst::ResourceError::Settings,
                    (
                        "stage-config '{}' decodes whole utterances (async_chunk: false): in \
                         live mode speech starts only after each utterance is synthesised",
                        s.stage_config_name()
                    )
                );
            }
            stage_config.decoder.codec_chunk_frames
        }
    };
    let default_chunk_frames =
        (live && s.chunk().is_none() && stage_config.async_chunk).then_some(first_chunk_frames);
    ModelInfo {
        model: s.model.clone(),
        dir,
        description: engine.description().clone(),
        base_sampling: engine.default_sampling_params(),
        samples_per_frame: engine.samples_per_frame(),
        first_chunk_frames,
        default_chunk_frames,
    }
}

/// Validates the voice and sampling settings against the checkpoint, so that a bad speaker,
/// language or reference, or a sampling value the model cannot take (a `max-new-tokens` of
/// `max_position_embeddings` or more, which leaves no room for any text), fails the state change
/// of either element rather than its first text; a Base checkpoint's reference is decoded and
/// encoded here (the engine caches the prompt).
fn prepare_voice(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
    info: &ModelInfo,
    engine: &Engine,
) -> Result<VoiceCloner, gst::ErrorMessage> {
    let probe_text = "probe";
    let (mut request, clone) = build_request(s, info, probe_text).map_err(|e| e.to_error_msg())?;
    let mut cloner = VoiceCloner::new(info.description.reference.clone());
    if let Some(spec) = clone {
        if spec.x_vector_only
            && let Some(t) = s.ref_text.as_deref().filter(|t| !t.trim().is_empty())
        {
            gst::element_warning!(
                element,
                gst::ResourceError::Settings,
                (
                    "ref-text '{}': ignored, x-vector-only=true clones from the speaker \
                     embedding alone (as qwen-tts generate_voice_clone does)",
                    t
                )
            );
        }
        let t = Instant::now();
        request.voice.voice_clone =
            Some(cloner.prompt(engine, &spec).map_err(|e| e.to_error_msg())?);
        gst::info!(
            cat,
            obj = element,
            "reference voice '{}' ({}) ready in {:.0} ms",
            spec.location,
            if spec.x_vector_only {
                "x-vector only"
            } else {
                "ICL"
            },
            t.elapsed().as_secs_f64() * 1000.0
        );
    }
    // The engine's own checks of the settings' request, the sampling values among them. An
    // error it does not tie to a field would name the probe's text, which is not the user's.
    validated(engine, &request).map_err(|e| {
        if e.property == "text" && e.value == probe_text {
            gst::error_msg!(
                gst::ResourceError::Settings,
                ("the model refused the element's settings: {}", e.why)
            )
        } else {
            e.to_error_msg()
        }
    })?;
    Ok(cloner)
}
