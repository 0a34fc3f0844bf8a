//! Starting with a server instead of a model (the remote counterpart of [`super::load`]): the
//! properties without a request field refused, the server probed (`GET /v1/models`, the served
//! model checked, its voices read), the voice settings checked and a voice-clone reference
//! decoded once, so that any of these fails the state change. Errors name the property.

use std::path::PathBuf;
use std::time::Instant;

use crate::engine::StageConfig;
use crate::models::qwen3_tts::{
    GenerationConfig, ModelVariant, SamplingParams, served_description,
};
use crate::remote::{RemoteError, SAMPLES_PER_FRAME, ServerOptions, SpeechClient};

use super::request::ModelInfo;
use super::server_request::{
    ServerTarget, build_speech_request, check_no_local_engine, check_server_reference,
    server_variant,
};
use super::settings::SynthesisSettings;
use super::voice_clone::VoiceCloner;

/// What `start()` gets from [`connect`].
pub(crate) struct Connected {
    pub client: SpeechClient,
    pub target: ServerTarget,
    /// The element's view of the server's model: its voices as speakers, the chunk sizes.
    pub info: ModelInfo,
    /// Holds the reference decoded at start.
    pub cloner: VoiceCloner,
}

/// The GStreamer error for a failed probe of the server named by the `server` property `given`.
fn probe_error(given: &str, e: &RemoteError) -> gst::ErrorMessage {
    let kind = match e {
        RemoteError::BadUrl { .. } | RemoteError::Model { .. } => gst::ResourceError::Settings,
        RemoteError::Status {
            status: 401 | 403, ..
        } => gst::ResourceError::NotAuthorized,
        RemoteError::Dns { .. }
        | RemoteError::Connect { .. }
        | RemoteError::Status { status: 404, .. } => gst::ResourceError::NotFound,
        _ => gst::ResourceError::OpenRead,
    };
    gst::error_msg!(kind, ("server '{}' cannot be used: {}", given, e))
}

/// Checks and probes the server `options` describe (the `server` property was `given`), and the
/// synthesis settings `s` against it. Blocks for up to the server timeout per probe step.
pub(crate) fn connect(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
    given: &str,
    options: ServerOptions,
    task_type: Option<ModelVariant>,
) -> Result<Connected, gst::ErrorMessage> {
    check_no_local_engine(s).map_err(|e| e.to_error_msg())?;
    if options.api_key.is_some() && !options.url.is_https() {
        gst::warning!(
            cat,
            obj = element,
            "server '{given}': the API key goes over plain HTTP"
        );
    }
    let protocol = options.protocol;
    let request_model = options.model.clone();
    let client = SpeechClient::new(options);
    let t = Instant::now();
    let probed = client.probe().map_err(|e| probe_error(given, &e))?;
    gst::info!(
        cat,
        obj = element,
        "server '{given}' answered in {:.0} ms: models {:?}, voices {:?}",
        t.elapsed().as_secs_f64() * 1000.0,
        probed.models,
        probed.voices
    );
    let served_model = request_model
        .clone()
        .or_else(|| probed.models.first().cloned());
    let root = served_model
        .as_deref()
        .and_then(|m| probed.root(m))
        .map(str::to_string);
    let target = ServerTarget {
        url: client.options().url.to_string(),
        request_model,
        variant: server_variant(task_type, served_model.as_deref(), root.as_deref()),
        served_model,
        voices: probed.voices,
        uploaded_voices: probed.uploaded_voices,
        protocol,
    };
    gst::info!(
        cat,
        obj = element,
        "server '{given}': model {:?} (checkpoint {root:?}), variant {:?}",
        target.served_model,
        target.variant
    );
    let (_, clone) = build_speech_request(s, &target, "probe").map_err(|e| e.to_error_msg())?;
    let base = served_description(ModelVariant::Base, Vec::new(), Vec::new(), false);
    let mut cloner = VoiceCloner::new(base.reference);
    if let Some(spec) = clone {
        let samples = cloner
            .checked_samples(&spec.location)
            .map_err(|e| e.to_error_msg())?;
        check_server_reference(&spec.location, samples.len()).map_err(|e| e.to_error_msg())?;
    }
    let first_chunk_frames = StageConfig::default_async()
        .chunk_policy(s.initial_chunk(), None)
        .next_boundary(0)
        .unwrap_or(1);
    let info = ModelInfo {
        model: target
            .served_model
            .clone()
            .unwrap_or_else(|| target.url.clone()),
        dir: PathBuf::new(),
        // Unknown for a served CustomVoice model's size: no warning about a dropped instruct.
        description: served_description(
            target.variant.unwrap_or(ModelVariant::CustomVoice),
            target.voices.clone().unwrap_or_default(),
            Vec::new(),
            target.variant != Some(ModelVariant::Base),
        ),
        base_sampling: SamplingParams::from_generation_config(&GenerationConfig::default()),
        samples_per_frame: SAMPLES_PER_FRAME,
        first_chunk_frames,
        default_chunk_frames: None,
    };
    Ok(Connected {
        client,
        target,
        info,
        cloner,
    })
}
