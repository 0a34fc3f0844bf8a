//! Voice cloning through the engine (tiny Base fixture, CPU): the ICL reference codes are the
//! decoder's left context for every chunk, so the streamed output of every chunk schedule equals
//! the reference waveform (after its cut of exactly `ref_frames × 1920` samples); two engines with
//! different references running at once never mix; the engine encodes a reference recording exactly
//! like the official front end, once per (recording, transcript, mode).

mod engine_common;
mod reference_util;

use std::sync::Arc;
use std::thread;

use engine_common::*;
use gstomnitts::engine::{
    Engine, EngineError, EngineRequest, FinishReason, StageConfig, VoiceCloneStats,
};
use gstomnitts::models::qwen3_tts::{PromptMode, VoiceClonePrompt, VoiceRequest};
use reference_util::{Suite, code_rows, f32s, frames, reference_suite, rel_l2};
use serde_json::Value;

const TOL: f64 = 1e-4;

struct Case {
    id: String,
    voice: VoiceRequest,
    max_new_tokens: usize,
    frames: usize,
    wav: Vec<f32>,
}

/// The ICL cases of tiny-base with the reference's recorded x-vector and codes.
fn icl_cases() -> Vec<Case> {
    let Suite { json, tensors, .. } = reference_suite("tiny-base");
    let cases: Vec<Case> = json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c.get("icl_mode").and_then(Value::as_bool) == Some(true))
        .map(|c| {
            let t = |k: &str| f32s(&tensors[c["tensors"][k].as_str().unwrap()]);
            let prompt_mode = match c["prompt_mode"].as_str().unwrap() {
                "streaming" => PromptMode::Streaming,
                _ => PromptMode::NonStreaming,
            };
            Case {
                id: c["id"].as_str().unwrap().to_string(),
                voice: VoiceRequest {
                    text: c["text"].as_str().unwrap().to_string(),
                    language: c["language"].as_str().map(str::to_string),
                    prompt_mode: Some(prompt_mode),
                    voice_clone: Some(VoiceClonePrompt {
                        ref_codes: Some(frames(&c["ref_code"])),
                        x_vector: t("ref_spk_embedding"),
                        ref_text: c["ref_text"].as_str().map(str::to_string),
                        icl: true,
                    }),
                    ..Default::default()
                },
                max_new_tokens: c["max_new_tokens"].as_u64().unwrap() as usize,
                frames: c["codes"].as_array().unwrap().len(),
                wav: t("wav"),
            }
        })
        .collect();
    assert!(cases.len() >= 2, "need at least two ICL cases");
    cases
}

fn request(engine: &Engine, case: &Case, chunk: usize, initial: usize) -> EngineRequest {
    let mut r = greedy(engine, case.voice.clone(), case.max_new_tokens);
    r.chunk_frames = Some(chunk);
    r.initial_chunk_frames = Some(initial);
    r
}

#[test]
fn streamed_icl_equals_reference_for_every_schedule() {
    let engine = load("tiny-base", StageConfig::default_async());
    let spf = engine.samples_per_frame();
    for case in icl_cases() {
        for (chunk, initial) in [(1, 1), (2, 1), (10, 2), (25, 1)] {
            let r = run(&engine, request(&engine, &case, chunk, initial));
            assert_eq!(r.reason, FinishReason::Length, "{}", case.id);
            assert_eq!(r.metrics.frames, case.frames, "{}", case.id);
            // Exactly the generated frames: the reference frames' audio is not emitted.
            assert_eq!(r.audio.len(), case.frames * spf, "{}", case.id);
            let e = rel_l2(&r.audio, &case.wav);
            assert!(
                e < TOL,
                "{} chunk {chunk} initial {initial}: rel L2 {e:e}",
                case.id
            );
        }
    }
}

#[test]
fn batch_icl_equals_reference() {
    let engine = load("tiny-base", config(|c| c.async_chunk = false));
    for case in icl_cases() {
        let r = run(
            &engine,
            greedy(&engine, case.voice.clone(), case.max_new_tokens),
        );
        let e = rel_l2(&r.audio, &case.wav);
        assert!(e < TOL, "{}: rel L2 {e:e}", case.id);
    }
}

/// Two engines in one process, each cloning a different reference at the same time: each output
/// equals its reference waveform (no state is shared between requests or engines).
#[test]
fn concurrent_clones_do_not_mix() {
    let cases = icl_cases();
    let (a, b) = (&cases[0], &cases[1]);
    assert_ne!(a.voice.voice_clone, b.voice.voice_clone);
    thread::scope(|s| {
        let runs: Vec<_> = [a, b]
            .into_iter()
            .map(|case| {
                s.spawn(move || {
                    let engine = load("tiny-base", StageConfig::default_async());
                    let mut out = Vec::new();
                    for _ in 0..2 {
                        out.push(run(&engine, request(&engine, case, 2, 1)).audio);
                    }
                    out
                })
            })
            .collect();
        for (case, h) in [a, b].into_iter().zip(runs) {
            for audio in h.join().expect("engine thread panicked") {
                let e = rel_l2(&audio, &case.wav);
                assert!(e < TOL, "{}: rel L2 {e:e} under concurrency", case.id);
            }
        }
    });
}

/// `Engine::voice_clone_prompt` on the official reference recording: the official x-vector and
/// codes, one encoding per (recording, transcript, mode) with later calls served from the cache,
/// invalid references refused without being cached, and an ICL utterance equal to the official
/// waveform.
#[test]
fn voice_clone_prompt_from_audio_is_exact_and_cached() {
    let suite = reference_suite("tiny-base");
    let clone = |k: &str| suite.clone_tensor(k);
    let audio = f32s(&clone("audio"));
    let want_codes = code_rows(&clone("codes"));
    let (json, tensors) = (&suite.json, &suite.tensors);
    let case = json["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ref_audio"] == "clone/audio" && c["icl_mode"] == true)
        .expect("an ICL case cloned from the reference audio");
    let ref_text = case["ref_text"].as_str().unwrap();

    let engine = load("tiny-base", StageConfig::default_async());
    assert_eq!(engine.voice_clone_stats(), VoiceCloneStats::default());
    let p = engine
        .voice_clone_prompt(&audio, Some(ref_text), false)
        .unwrap();
    let xe = rel_l2(&p.x_vector, &f32s(&clone("xvector")));
    assert!(xe < TOL, "x-vector rel L2 {xe:e}");
    assert_eq!(p.ref_codes.as_ref(), Some(&want_codes));
    assert_eq!((p.icl, p.ref_text.as_deref()), (true, Some(ref_text)));
    let stats = |encodes, cache_hits| VoiceCloneStats {
        encodes,
        cache_hits,
    };
    assert_eq!(engine.voice_clone_stats(), stats(1, 0));
    let again = engine
        .voice_clone_prompt(&audio, Some(ref_text), false)
        .unwrap();
    assert!(
        Arc::ptr_eq(&p, &again),
        "second call must come from the cache"
    );
    assert_eq!(engine.voice_clone_stats(), stats(1, 1));
    // x-vector only: another entry, whatever the (ignored) transcript.
    let x = engine
        .voice_clone_prompt(&audio, Some("ignored"), true)
        .unwrap();
    assert!(!x.icl && x.ref_codes.is_none() && x.ref_text.is_none());
    assert_eq!(x.x_vector, p.x_vector);
    engine.voice_clone_prompt(&audio, None, true).unwrap();
    assert_eq!(engine.voice_clone_stats(), stats(2, 2));
    // Another transcript: another entry.
    engine
        .voice_clone_prompt(&audio, Some("Other words."), false)
        .unwrap();
    assert_eq!(engine.voice_clone_stats(), stats(3, 2));
    // Invalid references: errors naming the field, nothing encoded or cached.
    let field = |r: Result<Arc<VoiceClonePrompt>, EngineError>| match r {
        Err(EngineError::InvalidRequest { field, .. }) => field,
        other => panic!("expected InvalidRequest, got {other:?}"),
    };
    assert_eq!(
        field(engine.voice_clone_prompt(&vec![0.0; 24_000], None, true)),
        "ref_audio"
    );
    assert_eq!(
        field(engine.voice_clone_prompt(&audio[..1000], None, true)),
        "ref_audio"
    );
    assert_eq!(
        field(engine.voice_clone_prompt(&audio, None, false)),
        "ref_text"
    );
    assert_eq!(engine.voice_clone_stats(), stats(3, 2));

    // The cached prompt speaks like the official generator.
    let voice = VoiceRequest {
        text: case["text"].as_str().unwrap().to_string(),
        language: case["language"].as_str().map(str::to_string),
        prompt_mode: Some(PromptMode::Streaming),
        voice_clone: Some(VoiceClonePrompt::clone(&p)),
        ..Default::default()
    };
    let r = run(
        &engine,
        greedy(
            &engine,
            voice,
            case["max_new_tokens"].as_u64().unwrap() as usize,
        ),
    );
    let want = f32s(&tensors[case["tensors"]["wav"].as_str().unwrap()]);
    let e = rel_l2(&r.audio, &want);
    assert!(e < TOL, "{}: rel L2 {e:e}", case["id"]);

    // Not a Base checkpoint.
    let cv = load("tiny-customvoice", StageConfig::default_async());
    assert_eq!(
        field(cv.voice_clone_prompt(&audio, Some(ref_text), false)),
        "model"
    );
}
