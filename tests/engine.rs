//! End-to-end engine tests on the tiny fixture checkpoints (CPU): chunk schedules, exact sample
//! counts, batch = async, windowed mode, finish reasons, cancellation, validation, devices.

mod engine_common;
mod reference_util;

use std::sync::mpsc::RecvTimeoutError;
use std::thread;
use std::time::{Duration, Instant};

use engine_common::*;
use gstomnitts::engine::{
    DecoderStreamingMode, DeviceSpec, Engine, EngineError, EngineEvent, EngineOptions,
    FinishReason, StageConfig,
};
use reference_util::{fixture, max_abs};

/// f32 tolerance of "streamed == whole decode". The fixture decoder is deliberately sensitive: its
/// SnakeBeta stack amplifies f32 rounding so that two whole decodes with different internal pass
/// sizes already differ by ~3e-5 (tests/code2wav.rs, `F32_TOL`); the streaming state itself is
/// checked exactly there in f64. A wrong chunk boundary (a lost or repeated frame, missing left
/// context) shows up as O(0.1) differences.
const TOL: f32 = 1e-4;

const TEXT: &str = "Hello world, this is a test.";
const LONG_TEXT: &str = "The quick brown fox jumps over the lazy dog near the river bank, while seven \
                         small birds sing in the old oak tree. Meanwhile, Dr. Smith reads 3 chapters \
                         of HTTPServer docs at 10:45 AM.";

/// More frames than any test here waits for, within the tiny talker's 32768 positions
/// (max_position_embeddings; a longer budget is refused at start).
const ENDLESS: usize = 30_000;
#[test]
fn streamed_equals_whole_decode_for_every_schedule() {
    let batch = load("tiny-customvoice", config(|c| c.async_chunk = false));
    let spf = batch.samples_per_frame();
    assert_eq!(spf, 1920);
    assert_eq!(batch.sample_rate(), 24000);
    // max_new_tokens 40 → 39 frames (the 40th sampled token is dropped, docs/qwen3-tts.md §5).
    let whole = run(&batch, greedy(&batch, voice(TEXT, Some("vivian")), 40));
    assert_eq!(whole.reason, FinishReason::Length);
    let frames = whole.metrics.frames;
    assert_eq!(frames, 39);
    assert_eq!(whole.audio.len(), frames * spf, "exact sample count");
    assert_eq!(whole.chunk_frames(spf), vec![frames], "batch = one chunk");
    assert!(whole.audio.iter().any(|x| x.abs() > 1e-3), "silent output");
    drop(batch);

    // vLLM-Omni's schedule (`initial`, then `chunk` at a time) and omnitts' ramp (`initial`, then
    // each chunk as long as all the frames before it while that is below `chunk`), each then the
    // remainder.
    for ramp in [false, true] {
        let streaming = load(
            "tiny-customvoice",
            config(|c| c.decoder.codec_chunk_ramp = ramp),
        );
        for chunk in [1usize, 2, 10, 25] {
            for initial in [1usize, 2] {
                let mut req = greedy(&streaming, voice(TEXT, Some("vivian")), 40);
                req.chunk_frames = Some(chunk);
                req.initial_chunk_frames = Some(initial);
                let r = run(&streaming, req);
                assert_eq!(r.reason, FinishReason::Length);
                assert_eq!(r.metrics.frames, frames);
                assert_eq!(
                    r.audio.len(),
                    frames * spf,
                    "chunk {chunk} initial {initial}"
                );
                let mut want = vec![initial];
                let mut done = initial;
                while done < frames {
                    let size = if ramp && done < chunk { done } else { chunk };
                    want.push((frames - done).min(size));
                    done += want[want.len() - 1];
                }
                let label = format!("chunk {chunk} initial {initial} ramp {ramp}");
                assert_eq!(r.chunk_frames(spf), want, "{label}");
                let d = max_abs(&r.audio, &whole.audio);
                assert!(d <= TOL, "{label}: max abs diff {d}");
            }
        }
    }
}

#[test]
fn batch_equals_async_on_every_greedy_fixture() {
    // tiny-voicedesign's f32 rounding noise between decodes cut into different passes reaches
    // 1.02e-4 (tests/code2wav.rs, where its streaming is checked exactly in f64); the shipped
    // schedule's ramped chunks (1, 1, 2, 4, 8, 16, 25) cut it at more places than one chunk size.
    for (name, speaker, tol) in [
        ("tiny-customvoice", Some("ryan"), TOL),
        ("tiny-voicedesign", None, 2.0 * TOL),
    ] {
        let texts = ["Short one.", "The quick brown fox jumps over the lazy dog."];
        let batch = load(name, config(|c| c.async_chunk = false));
        let spf = batch.samples_per_frame();
        let whole: Vec<_> = texts
            .iter()
            .map(|t| run(&batch, greedy(&batch, voice(t, speaker), 30)))
            .collect();
        drop(batch);
        let streaming = load(name, config(|_| {}));
        for (t, w) in texts.iter().zip(&whole) {
            let s = run(&streaming, greedy(&streaming, voice(t, speaker), 30));
            assert_eq!(s.reason, w.reason, "{name} {t:?}");
            assert_eq!(s.metrics.frames, w.metrics.frames, "{name} {t:?}");
            assert!(s.metrics.frames >= 2);
            assert_eq!(s.audio.len(), s.metrics.frames * spf);
            let d = max_abs(&s.audio, &w.audio);
            assert!(d <= tol, "{name} {t:?}: max abs diff {d}");
        }
    }
}

#[test]
fn windowed_mode_counts_exactly_and_matches_with_full_context() {
    let batch = load("tiny-customvoice", config(|c| c.async_chunk = false));
    let whole = run(&batch, greedy(&batch, voice(TEXT, Some("vivian")), 30));
    let spf = batch.samples_per_frame();
    drop(batch);
    // Left context ≥ the whole utterance: every window sees everything before it.
    let wide = load(
        "tiny-customvoice",
        config(|c| {
            c.decoder.streaming_mode = DecoderStreamingMode::Windowed;
            c.decoder.codec_left_context_frames = 72;
            c.decoder.codec_chunk_frames = 4;
        }),
    );
    let r = run(&wide, greedy(&wide, voice(TEXT, Some("vivian")), 30));
    assert_eq!(r.audio.len(), whole.audio.len());
    // The ramp of the shipped stage config: 1, 1, 2, then chunks of 4 (29 frames).
    assert_eq!(r.chunk_frames(spf), vec![1, 1, 2, 4, 4, 4, 4, 4, 4, 1]);
    let d = max_abs(&r.audio, &whole.audio);
    assert!(d <= TOL, "windowed with full context: max abs diff {d}");
    drop(wide);
    // No left context: still frames × 1920 samples, but not equal to the whole decode.
    let narrow = load(
        "tiny-customvoice",
        config(|c| {
            c.decoder.streaming_mode = DecoderStreamingMode::Windowed;
            c.decoder.codec_left_context_frames = 0;
            c.decoder.codec_chunk_frames = 4;
        }),
    );
    let r = run(&narrow, greedy(&narrow, voice(TEXT, Some("vivian")), 30));
    assert_eq!(r.audio.len(), whole.audio.len());
    assert!(max_abs(&r.audio, &whole.audio) > 1e-3);
}

#[test]
fn finish_reasons_length_and_guard() {
    // Guard budget = max(floor 5, ceil(0.01 × tokens)) = 5 frames.
    let e = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.guard.floor_frames = 5;
            c.ar.guard.frames_per_text_token = 0.01;
        }),
    );
    let r = run(&e, greedy(&e, voice(TEXT, Some("vivian")), 50));
    assert_eq!(r.reason, FinishReason::Guard);
    assert_eq!(r.metrics.frames, 5);
    assert_eq!(r.audio.len(), 5 * e.samples_per_frame());
    // max_new_tokens below the budget ends first, with Length.
    let r = run(&e, greedy(&e, voice(TEXT, Some("vivian")), 4));
    assert_eq!(r.reason, FinishReason::Length);
    assert_eq!(r.metrics.frames, 3);
    drop(e);
    // Default guard: max(75, 6 × text tokens). A short text stops at the 75-frame floor …
    let e = load("tiny-customvoice", config(|_| {}));
    let r = run(&e, greedy(&e, voice(TEXT, Some("vivian")), 90));
    assert_eq!(r.reason, FinishReason::Guard);
    assert_eq!(r.metrics.frames, 75);
    // … while a long text gets a budget that scales with it and is not cut.
    let r = run(&e, greedy(&e, voice(LONG_TEXT, Some("vivian")), 90));
    assert_eq!(r.reason, FinishReason::Length);
    assert_eq!(r.metrics.frames, 89);
    let m = &r.metrics;
    assert!(m.ar_ms_per_frame > 0.0 && m.decoder_ms_per_frame > 0.0);
    assert!(m.rtf > 0.0 && m.wall_ms > 0.0);
    assert!((m.audio_ms - 89.0 * 80.0).abs() < 1e-6);
    assert!(m.ttfa_ms.unwrap() <= m.wall_ms);
}

#[test]
fn cancellation_mid_stream_stops_both_stages_and_frees_the_engine() {
    let e = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.guard.enabled = false;
            c.decoder.codec_chunk_frames = 2;
            c.decoder.codec_buffer_frames = 4;
        }),
    );
    let spf = e.samples_per_frame();
    let h = e
        .submit(greedy(&e, voice(TEXT, Some("vivian")), ENDLESS))
        .unwrap();
    let canceller = h.canceller();
    let mut samples = 0usize;
    // Wait for some audio, then cancel from another thread.
    loop {
        match h.recv_timeout(Duration::from_secs(30)).expect("event") {
            EngineEvent::Audio(c) => {
                samples += c.samples.len();
                if samples >= 5 * spf {
                    break;
                }
            }
            EngineEvent::Finished { reason, .. } => panic!("finished early: {reason}"),
            _ => {}
        }
    }
    let t = Instant::now();
    thread::spawn(move || canceller.cancel()).join().unwrap();
    let (reason, metrics) = loop {
        match h.recv_timeout(Duration::from_secs(5)) {
            Ok(EngineEvent::Finished { reason, metrics }) => break (reason, metrics),
            Ok(EngineEvent::Audio(c)) => samples += c.samples.len(),
            Ok(_) => {}
            Err(e) => panic!("no Finished after cancel: {e:?}"),
        }
    };
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(metrics.frames < ENDLESS);
    assert_eq!(samples, metrics.frames * spf);
    assert!(matches!(
        h.recv_timeout(Duration::from_millis(10)),
        Err(RecvTimeoutError::Disconnected)
    ));
    // The engine is free again and the next request runs normally.
    let r = run(&e, greedy(&e, voice(TEXT, Some("vivian")), 6));
    assert_eq!(r.reason, FinishReason::Length);
    assert_eq!(r.metrics.frames, 5);
}

/// A long prompt is read in chunks of 512 positions, and a cancel stops it between two chunks
/// instead of after the whole text (a NULL state change waits for it).
#[test]
fn cancelling_during_a_long_prefill_stops_it_promptly() {
    let e = load("tiny-customvoice", config(|c| c.ar.guard.enabled = false));
    let text = "Every word of this long paragraph is read before the first frame. ".repeat(400);
    let run_prefill = |cancel_after: Option<Duration>| {
        let h = e
            .submit(greedy(&e, voice(&text, Some("vivian")), 2))
            .unwrap();
        assert!(matches!(
            h.recv_timeout(Duration::from_secs(30)),
            Ok(EngineEvent::Started)
        ));
        let t = Instant::now();
        if let Some(after) = cancel_after {
            thread::sleep(after);
            h.cancel();
        }
        let reason = loop {
            match h.recv_timeout(Duration::from_secs(600)) {
                Ok(EngineEvent::Finished { reason, .. }) => break reason,
                Ok(_) => {}
                Err(e) => panic!("no Finished: {e:?}"),
            }
        };
        (reason, t.elapsed())
    };
    let (reason, whole) = run_prefill(None);
    assert_eq!(reason, FinishReason::Length);
    let (reason, cancelled) = run_prefill(Some(Duration::from_millis(50)));
    eprintln!(
        "whole prefill + 1 frame {whole:?}, cancelled after 50 ms: finished in {cancelled:?}"
    );
    assert_eq!(reason, FinishReason::Cancelled);
    assert!(
        cancelled * 4 < whole,
        "cancel took {cancelled:?}, the whole prefill {whole:?}"
    );
}

#[test]
fn cancelling_a_queued_request_finishes_it_promptly() {
    let e = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.guard.enabled = false;
            c.ar.max_num_seqs = 1;
        }),
    );
    let long = e
        .submit(greedy(&e, voice(TEXT, Some("vivian")), ENDLESS))
        .unwrap();
    let queued = e
        .submit(greedy(&e, voice(TEXT, Some("vivian")), 10))
        .unwrap();
    thread::sleep(Duration::from_millis(50));
    queued.cancel();
    match queued.recv_timeout(Duration::from_secs(5)) {
        Ok(EngineEvent::Finished { reason, metrics }) => {
            assert_eq!(reason, FinishReason::Cancelled);
            assert_eq!(metrics.frames, 0);
        }
        other => panic!("expected Finished(Cancelled) without Started, got {other:?}"),
    }
    assert!(!long.is_finished());
    // Dropping a handle cancels its request.
    drop(long);
    let r = run(&e, greedy(&e, voice(TEXT, Some("vivian")), 4));
    assert_eq!(r.reason, FinishReason::Length);
}

#[test]
fn dropping_the_engine_cancels_running_requests() {
    let e = load("tiny-customvoice", config(|c| c.ar.guard.enabled = false));
    let h = e
        .submit(greedy(&e, voice(TEXT, Some("vivian")), ENDLESS))
        .unwrap();
    assert!(matches!(
        h.recv_timeout(Duration::from_secs(30)),
        Ok(EngineEvent::Started)
    ));
    let t = Instant::now();
    drop(e);
    assert!(t.elapsed() < Duration::from_secs(2));
    let mut last = None;
    while let Some(ev) = h.recv() {
        last = Some(ev);
    }
    assert!(matches!(
        last,
        Some(EngineEvent::Finished {
            reason: FinishReason::Cancelled,
            ..
        })
    ));
}

#[test]
fn two_interleaved_requests_equal_single_runs() {
    let single = load("tiny-customvoice", config(|_| {}));
    let a1 = run(&single, greedy(&single, voice(TEXT, Some("vivian")), 20));
    let b1 = run(
        &single,
        greedy(&single, voice("Short one.", Some("ryan")), 25),
    );
    drop(single);
    let multi = load(
        "tiny-customvoice",
        config(|c| {
            c.ar.max_num_seqs = 2;
            c.decoder.max_num_seqs = 2;
            c.decoder.codec_chunk_frames = 3;
        }),
    );
    let ha = multi
        .submit(greedy(&multi, voice(TEXT, Some("vivian")), 20))
        .unwrap();
    let hb = multi
        .submit(greedy(&multi, voice("Short one.", Some("ryan")), 25))
        .unwrap();
    let (a2, _, _) = ha.collect().unwrap();
    let (b2, _, _) = hb.collect().unwrap();
    assert!(max_abs(&a1.audio, &a2) <= TOL);
    assert!(max_abs(&b1.audio, &b2) <= TOL);
}

#[test]
fn invalid_requests_fail_synchronously() {
    let e = load("tiny-customvoice", config(|_| {}));
    let mut bad = greedy(&e, voice("   ", Some("vivian")), 10);
    let err = e.submit(bad.clone()).unwrap_err();
    assert!(
        matches!(&err, EngineError::InvalidRequest { field, .. } if field.contains("text")),
        "{err}"
    );
    bad.voice = voice(TEXT, Some("nobody"));
    let err = e.submit(bad.clone()).unwrap_err().to_string();
    assert!(err.contains("speaker") && err.contains("nobody"), "{err}");
    bad.voice = voice(TEXT, Some("VIVIAN")); // case-insensitive, like the reference
    bad.sampling.top_p = 0.0;
    bad.sampling.do_sample = true;
    let err = e.submit(bad.clone()).unwrap_err().to_string();
    assert!(err.contains("sampling.top_p"), "{err}");
    bad.sampling.top_p = 1.0;
    bad.sampling.do_sample = false;
    bad.chunk_frames = Some(0);
    let err = e.submit(bad.clone()).unwrap_err().to_string();
    assert!(err.contains("chunk_frames"), "{err}");
    bad.chunk_frames = None;
    bad.sampling.max_new_tokens = 0;
    assert!(e.submit(bad.clone()).is_err());
    bad.sampling.max_new_tokens = 3;
    let r = run(&e, bad);
    assert_eq!(r.reason, FinishReason::Length);
    assert!(
        e.speakers().iter().any(|s| s == "vivian"),
        "{:?}",
        e.speakers()
    );
    assert!(e.languages().iter().any(|s| s == "english"));
}

#[test]
fn load_errors_name_the_problem() {
    let err = Engine::load(EngineOptions::new(
        "/nonexistent/checkpoint",
        StageConfig::default_async(),
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("/nonexistent/checkpoint"), "{err}");
    let mut opts = EngineOptions::new(fixture("tiny-customvoice"), StageConfig::default_async());
    opts.decoder_device = DeviceSpec::Cuda(0);
    let r = Engine::load(opts);
    if !DeviceSpec::CUDA_COMPILED {
        let err = r.unwrap_err().to_string();
        assert!(
            err.contains("cuda:0") && err.contains("--features cuda"),
            "{err}"
        );
    }
}

#[test]
fn sampled_requests_are_reproducible_by_seed() {
    let e = load("tiny-customvoice", config(|_| {}));
    let mut req = greedy(&e, voice(TEXT, Some("vivian")), 20);
    req.sampling = e.default_sampling_params();
    req.sampling.max_new_tokens = 20;
    req.sampling.seed = 1234;
    let a = run(&e, req.clone());
    let b = run(&e, req.clone());
    assert_eq!(a.audio, b.audio);
    req.sampling.seed = 99;
    let c = run(&e, req);
    assert_eq!(c.metrics.frames, a.metrics.frames);
    assert_ne!(a.audio, c.audio);
}

#[test]
fn api_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Engine>();
    send_sync::<gstomnitts::engine::Canceller>();
    send::<gstomnitts::engine::RequestHandle>();
    send_sync::<EngineEvent>();
    send_sync::<EngineError>();
}

/// CUDA graphs are captured only for a CUDA stage 0; on the CPU the engine says so.
#[test]
fn cuda_graphs_status_on_cpu() {
    let engine = load("tiny-customvoice", config(|_| {}));
    assert_eq!(
        engine.cuda_graphs(),
        &gstomnitts::engine::CudaGraphs::NotApplicable
    );
}
