//! Continuous batching on stage 0 and stage 1 (tiny fixtures, CPU): requests that run together in
//! one batch — of mixed prompts, text lengths, prompt modes and sampling settings, joining at
//! different steps, one cancelled mid-way — give exactly what each gives alone: the same codes
//! (greedy and, for the same seed, sampled), the same frame count and finish reason, and the same
//! audio within 1e-5 relative L2. Admission refuses what is beyond `max_num_seqs + max_waiting`
//! without harming what runs.

mod engine_common;
mod reference_util;

use std::sync::mpsc::Receiver;
use std::time::Duration;

use engine_common::*;
use gstomnitts::engine::{
    Engine, EngineError, EngineEvent, EngineRequest, FinishReason, RequestHandle,
};
use gstomnitts::models::qwen3_tts::{PromptMode, VoiceClonePrompt, VoiceRequest};
use reference_util::{f32s, fixture, frames, reference_suite, rel_l2};
use serde_json::Value;

const WAVE_TOL: f64 = 1e-5;

/// What one request gave: its codes, audio and finish reason.
#[derive(Debug)]
struct Outcome {
    codes: Vec<Vec<u32>>,
    audio: Vec<f32>,
    reason: FinishReason,
}

fn drain(handle: RequestHandle, codes: Receiver<Vec<u32>>) -> Outcome {
    let mut events = Vec::new();
    while let Some(ev) = handle.recv() {
        events.push(ev);
    }
    let run = check_protocol(&events);
    Outcome {
        codes: codes.try_iter().collect(),
        audio: run.audio,
        reason: run.reason,
    }
}

/// Each request alone, one after the other, on an engine of its own with one place on stage 0.
fn solo(name: &str, reqs: &[EngineRequest]) -> Vec<Outcome> {
    let engine = load(name, config(|c| c.ar.max_num_seqs = 1));
    reqs.iter()
        .map(|r| {
            let (h, codes) = engine.submit_tapped(r.clone()).expect("submit");
            drain(h, codes)
        })
        .collect()
}

fn assert_same(label: &str, got: &Outcome, want: &Outcome) {
    assert_eq!(got.reason, want.reason, "{label}: finish reason");
    assert_eq!(got.codes.len(), want.codes.len(), "{label}: frames");
    for (f, (g, w)) in got.codes.iter().zip(&want.codes).enumerate() {
        assert_eq!(g, w, "{label}: codes of frame {f}");
    }
    assert_eq!(got.audio.len(), want.audio.len(), "{label}: samples");
    let e = rel_l2(&got.audio, &want.audio);
    assert!(e <= WAVE_TOL, "{label}: audio rel L2 {e:e} > {WAVE_TOL:e}");
}

fn sampled(mut r: EngineRequest, seed: u64) -> EngineRequest {
    let s = &mut r.sampling;
    s.do_sample = true;
    s.temperature = 0.9;
    s.top_k = 50;
    s.top_p = 0.95;
    s.repetition_penalty = 1.05;
    s.subtalker_do_sample = true;
    s.subtalker_temperature = 0.8;
    s.subtalker_top_k = 30;
    s.subtalker_top_p = 1.0;
    s.seed = seed;
    r
}

fn mode(mut v: VoiceRequest, m: PromptMode) -> VoiceRequest {
    v.prompt_mode = Some(m);
    v
}

/// Runs `reqs` on one engine whose stage 0 batches up to 8: the first half at once, the rest
/// once stage 0 has made the first request's first frame (they join a running batch); request
/// `cancel` (if any) is cancelled after its first audio. Returns the outcomes in order and the
/// largest batch.
fn batched(name: &str, reqs: &[EngineRequest], cancel: Option<usize>) -> (Vec<Outcome>, u64) {
    let engine = load(
        name,
        config(|c| {
            c.ar.max_num_seqs = 8;
            c.decoder.max_num_seqs = 8;
        }),
    );
    let half = reqs.len() / 2;
    let mut handles: Vec<(RequestHandle, Receiver<Vec<u32>>)> = reqs[..half]
        .iter()
        .map(|r| engine.submit_tapped(r.clone()).expect("submit"))
        .collect();
    // Wait for the first request's first frame (kept). Not its first audio: stage 0 runs ahead of
    // stage 1, and on a busy machine it could finish the whole first half before the first chunk
    // was decoded, so that the rest never joined a running batch.
    let first_frame = handles[0]
        .1
        .recv_timeout(Duration::from_secs(60))
        .expect("first frame of the first request");
    handles.extend(
        reqs[half..]
            .iter()
            .map(|r| engine.submit_tapped(r.clone()).expect("submit")),
    );
    if let Some(c) = cancel {
        let h = &handles[c].0;
        if c == 0 {
            h.cancel();
        } else {
            loop {
                match h.recv_timeout(Duration::from_secs(60)) {
                    Ok(EngineEvent::Audio(_)) => break,
                    Ok(EngineEvent::Finished { reason, .. }) => {
                        panic!("request {c} finished ({reason}) before it could be cancelled")
                    }
                    Ok(_) => {}
                    Err(e) => panic!("request {c}: {e}"),
                }
            }
            h.cancel();
        }
    }
    let mut out = Vec::new();
    for (i, (h, codes)) in handles.into_iter().enumerate() {
        if i == 0 {
            let mut o = drain(h, codes);
            o.codes.insert(0, first_frame.clone());
            out.push(o);
        } else if Some(i) == cancel {
            let mut reason = None;
            while let Some(ev) = h.recv() {
                if let EngineEvent::Finished { reason: r, .. } = ev {
                    reason = Some(r);
                }
            }
            out.push(Outcome {
                codes: codes.try_iter().collect(),
                audio: Vec::new(),
                reason: reason.expect("Finished"),
            });
        } else {
            out.push(drain(h, codes));
        }
    }
    let max_rows = engine.batch_stats()[0].max_rows;
    (out, max_rows)
}

/// Every non-cancelled request equals its solo run; the cancelled one ends `Cancelled` with a
/// prefix of its solo codes; the batch really held several requests at once.
fn check_batch(name: &str, reqs: Vec<EngineRequest>, cancel: Option<usize>) {
    let alone = solo(name, &reqs);
    let (together, max_rows) = batched(name, &reqs, cancel);
    assert!(
        max_rows as usize > reqs.len() / 2,
        "{name}: stage 0 never batched more than {max_rows} rows"
    );
    for (i, (got, want)) in together.iter().zip(&alone).enumerate() {
        let label = format!("{name} request {i}");
        if Some(i) == cancel {
            assert_eq!(got.reason, FinishReason::Cancelled, "{label}");
            assert!(
                got.codes.len() <= want.codes.len(),
                "{label}: too many frames"
            );
            assert_eq!(
                got.codes,
                want.codes[..got.codes.len()],
                "{label}: codes prefix"
            );
        } else {
            assert_same(&label, got, want);
        }
    }
}

#[test]
fn customvoice_batch_equals_solo_runs() {
    let e = load("tiny-customvoice", config(|_| {}));
    let g = |v: VoiceRequest, n| greedy(&e, v, n);
    let long = "A much longer sentence, so that this request keeps running while the others join \
                the batch, finish and leave it again.";
    let reqs = vec![
        g(voice(long, Some("ryan")), 60),
        g(voice("Hello there.", Some("vivian")), 24),
        g(
            mode(
                voice("Streaming prompt mode.", Some("aiden")),
                PromptMode::Streaming,
            ),
            30,
        ),
        sampled(
            g(voice("Sampled with its own seed.", Some("serena")), 40),
            7,
        ),
        g(
            voice(
                "Cancel me in the middle, please, of this sentence.",
                Some("eric"),
            ),
            60,
        ),
        sampled(
            g(voice("Another seed, another voice.", Some("dylan")), 40),
            1234,
        ),
        g(voice("Short.", Some("uncle_fu")), 12),
    ];
    check_batch("tiny-customvoice", reqs, Some(4));
}

#[test]
fn voicedesign_batch_equals_solo_runs() {
    let e = load("tiny-voicedesign", config(|_| {}));
    let vd = |text: &str, instruct: &str, n| {
        let mut v = voice(text, None);
        v.instruct = Some(instruct.to_string());
        greedy(&e, v, n)
    };
    let reqs = vec![
        vd(
            "The first one is long and keeps on going for a while.",
            "A deep calm voice.",
            50,
        ),
        vd(
            "Bright and quick.",
            "A bright young voice, speaking fast.",
            20,
        ),
        sampled(vd("Sampled design.", "Whispering.", 30), 99),
        {
            let mut r = vd("Streaming the text.", "Warm.", 30);
            r.voice.prompt_mode = Some(PromptMode::Streaming);
            r
        },
        vd("Two words.", "Loud.", 16),
        sampled(
            vd("One more sampled line for the batch.", "Slow and low.", 36),
            5,
        ),
    ];
    check_batch("tiny-voicedesign", reqs, None);
}

/// Base: x-vector-only and ICL prompts (the reference's recorded x-vectors and codes) in one batch.
#[test]
fn base_clone_batch_equals_solo_runs() {
    let suite = reference_suite("tiny-base");
    let e = load("tiny-base", config(|_| {}));
    let mut reqs = Vec::new();
    for c in suite.json["cases"].as_array().expect("cases") {
        let icl = c.get("icl_mode").and_then(Value::as_bool) == Some(true);
        let x_vector =
            f32s(&suite.tensors[c["tensors"]["ref_spk_embedding"].as_str().expect("id")]);
        let prompt_mode = match c["prompt_mode"].as_str() {
            Some("streaming") => PromptMode::Streaming,
            _ => PromptMode::NonStreaming,
        };
        let v = VoiceRequest {
            text: c["text"].as_str().expect("text").to_string(),
            language: c["language"].as_str().map(str::to_string),
            prompt_mode: Some(prompt_mode),
            voice_clone: Some(VoiceClonePrompt {
                ref_codes: icl.then(|| frames(&c["ref_code"])),
                x_vector,
                ref_text: if icl {
                    c["ref_text"].as_str().map(str::to_string)
                } else {
                    None
                },
                icl,
            }),
            ..Default::default()
        };
        let n = c["max_new_tokens"].as_u64().expect("max_new_tokens") as usize;
        reqs.push(greedy(&e, v, n));
    }
    assert!(
        reqs.iter()
            .any(|r| r.voice.voice_clone.as_ref().is_some_and(|v| v.icl))
            && reqs
                .iter()
                .any(|r| r.voice.voice_clone.as_ref().is_some_and(|v| !v.icl)),
        "the tiny-base suite must hold ICL and x-vector cases"
    );
    // A sampled copy of the first case, so the batch also mixes greedy and sampled rows.
    let extra = sampled(reqs[0].clone(), 31);
    reqs.push(extra);
    while reqs.len() < 6 {
        let again = reqs[reqs.len() % 2].clone();
        reqs.push(again);
    }
    check_batch("tiny-base", reqs, None);
}

#[test]
fn admission_refuses_beyond_max_waiting_and_running_requests_finish() {
    let engine = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.max_num_seqs = 2;
            c.ar.max_waiting = 1;
        }),
    );
    let long = "This sentence is long enough to keep the stage busy for a while.";
    let reqs: Vec<EngineRequest> = ["ryan", "vivian", "aiden"]
        .iter()
        .map(|s| greedy(&engine, voice(long, Some(s)), 40))
        .collect();
    let alone = solo("tiny-customvoice", &reqs);
    let handles: Vec<_> = reqs
        .iter()
        .map(|r| {
            engine
                .submit_tapped(r.clone())
                .expect("three fit: 2 running + 1 waiting")
        })
        .collect();
    assert_eq!(engine.requests_in_stage0(), 3);
    let refused = engine.submit(reqs[0].clone());
    match refused {
        Err(EngineError::Busy {
            held,
            max_num_seqs,
            max_waiting,
        }) => {
            assert_eq!((held, max_num_seqs, max_waiting), (3, 2, 1));
            let msg = EngineError::Busy {
                held,
                max_num_seqs,
                max_waiting,
            }
            .to_string();
            assert!(
                msg.contains("max_waiting") && msg.contains("max_num_seqs"),
                "{msg}"
            );
        }
        other => panic!("a fourth request must be refused, got {other:?}"),
    }
    for (i, ((h, codes), want)) in handles.into_iter().zip(&alone).enumerate() {
        assert_same(&format!("admitted request {i}"), &drain(h, codes), want);
    }
    // Places are given back: the engine takes new requests again.
    assert_eq!(engine.requests_in_stage0(), 0);
    let again = run(&engine, reqs[1].clone());
    assert_eq!(again.audio.len(), alone[1].audio.len());
}

/// The registry: equal options share one engine, other options get their own; the last share
/// releases it, and the next acquire loads it again.
#[test]
fn registry_shares_one_engine_per_key() {
    use gstomnitts::engine::{DeviceSpec, EngineOptions, registry};
    let opts = |max: usize| EngineOptions {
        model_dir: fixture("tiny-customvoice"),
        stage_config: config(|c| c.ar.max_num_seqs = max),
        ar_device: DeviceSpec::Cpu,
        decoder_device: DeviceSpec::Cpu,
    };
    let before = Engine::loads_in_process();
    let a = registry::acquire(opts(3)).expect("load");
    let b = registry::acquire(opts(3)).expect("join");
    let c = registry::acquire(opts(4)).expect("another key");
    assert!(a.loaded() && !b.loaded() && c.loaded());
    assert!(a.same_engine(&b) && !a.same_engine(&c));
    assert_eq!((a.users(), c.users()), (2, 1));
    // `auto` resolves to the CPU here, so it is the same key as `cpu`.
    let mut auto = opts(3);
    auto.ar_device = DeviceSpec::Auto;
    auto.decoder_device = DeviceSpec::Auto;
    if DeviceSpec::Auto.resolve() == DeviceSpec::Cpu {
        let d = registry::acquire(auto).expect("join with auto devices");
        assert!(d.same_engine(&a));
    }
    let both = Engine::loads_in_process() - before;
    assert!(
        both >= 2,
        "two keys, two loads (other tests may load too): {both}"
    );
    drop((a, b, c));
    let again = registry::acquire(opts(3)).expect("reload");
    assert!(again.loaded(), "the last share released the engine");
    let r = run(
        &again,
        greedy(&again, voice("Still works.", Some("ryan")), 10),
    );
    assert!(!r.audio.is_empty());
}

/// `max_waiting` comes from stage 0's engine_args (default 64); a negative value names its key.
#[test]
fn max_waiting_is_read_from_the_stage_config() {
    use gstomnitts::engine::StageConfig;
    let yaml = |args: &str| {
        format!(
            "async_chunk: true\nstage_args:\n  - stage_id: 0\n    engine_args: {{model_stage: qwen3_tts{args}}}\n  - stage_id: 1\n    engine_args: {{model_stage: code2wav}}\n    engine_input_source: [0]\n"
        )
    };
    let (c, w) = StageConfig::from_yaml_str(&yaml(", max_num_seqs: 4, max_waiting: 3")).unwrap();
    assert!(w.is_empty(), "{w:?}");
    assert_eq!((c.ar.max_num_seqs, c.ar.max_waiting), (4, 3));
    let (c, _) = StageConfig::from_yaml_str(&yaml("")).unwrap();
    assert_eq!(c.ar.max_waiting, 64);
    let e = StageConfig::from_yaml_str(&yaml(", max_waiting: -1"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("stage_args[0].engine_args.max_waiting"), "{e}");
}
