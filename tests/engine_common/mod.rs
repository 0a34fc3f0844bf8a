//! Helpers shared by the engine integration tests (tiny fixture checkpoints, CPU). The test file
//! declares `mod reference_util;` too: the fixture paths come from there.
#![allow(dead_code)]

use gstomnitts::engine::{
    AudioChunk, DeviceSpec, Engine, EngineEvent, EngineOptions, EngineRequest, FinishReason,
    Metrics, StageConfig,
};
use gstomnitts::models::qwen3_tts::VoiceRequest;

use crate::reference_util::fixture;

/// The shipped async config with both stages on the CPU, edited by `f`.
pub fn config(f: impl FnOnce(&mut StageConfig)) -> StageConfig {
    let mut c = StageConfig::default_async();
    f(&mut c);
    c
}

pub fn load(name: &str, cfg: StageConfig) -> Engine {
    Engine::load(EngineOptions {
        model_dir: fixture(name),
        stage_config: cfg,
        ar_device: DeviceSpec::Cpu,
        decoder_device: DeviceSpec::Cpu,
    })
    .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

pub fn voice(text: &str, speaker: Option<&str>) -> VoiceRequest {
    VoiceRequest {
        text: text.to_string(),
        speaker: speaker.map(str::to_string),
        language: Some("english".to_string()),
        instruct: None,
        prompt_mode: None,
        voice_clone: None,
    }
}

/// A greedy request with `max_new_tokens`.
pub fn greedy(engine: &Engine, voice: VoiceRequest, max_new_tokens: usize) -> EngineRequest {
    let mut s = engine.default_sampling_params().greedy();
    s.max_new_tokens = max_new_tokens;
    EngineRequest::new(voice, s)
}

/// Everything a request produced.
#[derive(Debug)]
pub struct Run {
    pub events: Vec<EngineEvent>,
    pub chunks: Vec<AudioChunk>,
    pub audio: Vec<f32>,
    pub reason: FinishReason,
    pub metrics: Metrics,
}

impl Run {
    /// Frames per audio chunk.
    pub fn chunk_frames(&self, spf: usize) -> Vec<usize> {
        self.chunks
            .iter()
            .map(|c| {
                assert_eq!(
                    c.samples.len() % spf,
                    0,
                    "chunk not a whole number of frames"
                );
                c.samples.len() / spf
            })
            .collect()
    }
}

/// Submits and drains a request, checking the event protocol on the way: `Started` first,
/// `FirstAudio` right before the first `Audio`, contiguous offsets, exactly one `Finished` last.
pub fn run(engine: &Engine, req: EngineRequest) -> Run {
    let h = engine.submit(req).expect("submit");
    let mut events = Vec::new();
    while let Some(ev) = h.recv() {
        events.push(ev);
    }
    assert!(h.recv().is_none(), "recv after Finished must be None");
    check_protocol(&events)
}

pub fn check_protocol(events: &[EngineEvent]) -> Run {
    assert!(
        matches!(events.first(), Some(EngineEvent::Started)),
        "first event {:?}",
        events.first()
    );
    let mut chunks = Vec::new();
    let mut audio: Vec<f32> = Vec::new();
    let mut first_audio_seen = false;
    let mut finished = None;
    for (i, ev) in events.iter().enumerate().skip(1) {
        assert!(finished.is_none(), "event after Finished: {ev:?}");
        match ev {
            EngineEvent::Started => panic!("second Started at {i}"),
            EngineEvent::FirstAudio { ttfa_ms } => {
                assert!(!first_audio_seen, "second FirstAudio");
                assert!(*ttfa_ms >= 0.0);
                assert!(
                    matches!(events.get(i + 1), Some(EngineEvent::Audio(_))),
                    "FirstAudio not followed by Audio"
                );
                first_audio_seen = true;
            }
            EngineEvent::Audio(c) => {
                assert!(first_audio_seen, "Audio before FirstAudio");
                assert_eq!(c.offset, audio.len() as u64, "non-contiguous offset");
                assert!(!c.samples.is_empty());
                audio.extend_from_slice(&c.samples);
                chunks.push(c.clone());
            }
            EngineEvent::Finished { reason, metrics } => {
                finished = Some((reason.clone(), metrics.clone()))
            }
        }
    }
    let (reason, metrics) = finished.expect("no Finished event");
    assert_eq!(metrics.ttfa_ms.is_some(), first_audio_seen);
    Run {
        events: events.to_vec(),
        chunks,
        audio,
        reason,
        metrics,
    }
}
