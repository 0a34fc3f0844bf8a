//! First audio under load (tiny fixture, CPU): a request that arrives while 16 streams run gets
//! its first frame within a bounded number of stage-0 steps, and its first chunk is decoded in a
//! pass of its own, not behind the running streams' long chunks; the chunk ramp shapes its audio;
//! the first-chunk lane (a second decoder for first chunks) leaves every stream's audio as it was;
//! stage 0's `first_frame_alone` gives a new request its first frame in a step of its own.

mod engine_common;
mod reference_util;

use std::time::{Duration, Instant};

use engine_common::*;
use gstomnitts::engine::{Engine, EngineEvent, FirstChunkLane, RequestHandle};

const TEXT: &str = "A sentence that keeps the stream busy for quite a while longer.";

/// A running stream as the test sees it: its handle, when its first audio came and how much audio
/// it has delivered.
struct Running {
    handle: RequestHandle,
    first_audio: Option<Instant>,
    samples: u64,
    finished: bool,
}

impl Running {
    /// Takes the events that are already there.
    fn poll(&mut self) {
        while let Some(ev) = self.handle.try_recv() {
            match ev {
                EngineEvent::Audio(c) => {
                    self.first_audio.get_or_insert_with(Instant::now);
                    self.samples += c.samples.len() as u64;
                }
                EngineEvent::Finished { .. } => self.finished = true,
                _ => {}
            }
        }
    }

    /// Audio delivered beyond what a real-time listener since the first audio has played, s.
    fn slack(&self, rate: u32) -> f64 {
        match self.first_audio {
            Some(t) => self.samples as f64 / f64::from(rate) - t.elapsed().as_secs_f64(),
            None => f64::NEG_INFINITY,
        }
    }
}

fn engine(ramp: bool) -> Engine {
    engine_with_lane(ramp, false)
}

fn engine_with_lane(ramp: bool, lane: bool) -> Engine {
    load(
        "tiny-customvoice",
        config(|c| {
            c.ar.max_num_seqs = 17;
            c.decoder.max_num_seqs = 17;
            c.decoder.initial_codec_chunk_frames = 1;
            c.decoder.codec_chunk_frames = 25;
            c.decoder.codec_chunk_ramp = ramp;
            c.decoder.first_chunk_lane = Some(lane);
            c.ar.guard.enabled = false;
        }),
    )
}

#[test]
fn a_new_request_starts_within_a_step_and_its_first_chunk_goes_first() {
    let engine = engine(false);
    let mut running = sixteen_running(&engine, 400);
    let mut late = greedy(&engine, voice("A new request.", Some("vivian")), 30);
    late.sampling.seed = 99;
    let run = run(&engine, late);
    let m = &run.metrics;
    let steps = m.first_frame_steps.expect("a first frame");
    assert!(
        steps <= 2,
        "the new request's first frame came {steps} stage-0 steps after its arrival"
    );
    assert!(
        m.first_frame_ms
            .is_some_and(|ms| ms <= m.ttfa_ms.unwrap_or(f64::MAX))
    );
    // Its first chunk (one frame) went alone: the running streams' 25-frame chunks waited.
    assert_eq!(
        m.first_pass_frames,
        Some(1),
        "the first chunk was decoded in a pass of {:?} frames",
        m.first_pass_frames
    );
    for r in &mut running {
        r.handle.cancel();
    }
}

#[test]
fn the_chunk_ramp_grows_the_chunks_with_the_audio_out_up_to_the_chunk_size() {
    let ramped_engine = engine(true);
    let spf = ramped_engine.samples_per_frame();
    let mut r = greedy(&ramped_engine, voice(TEXT, Some("ryan")), 70);
    r.sampling.seed = 1;
    let ramped = run(&ramped_engine, r.clone());
    let plain = run(&engine(false), r);
    // The same audio either way (exact streaming), cut differently: within the f32 rounding of
    // decoder passes of other lengths (tests/code2wav.rs bounds streamed vs whole at 1e-4).
    assert_eq!(ramped.audio.len(), plain.audio.len());
    let e = reference_util::rel_l2(&ramped.audio, &plain.audio);
    assert!(e <= 1e-4, "ramped vs plain chunks: rel L2 {e:e}");
    let frames = ramped.metrics.frames;
    assert!(
        frames >= 8,
        "only {frames} frames: the ramp is not exercised"
    );
    // 1, 1, 2, 4, 8, 16 (each as long as the audio before it), then 25 frames, the last chunk
    // cut at the utterance's end.
    let mut want = Vec::new();
    let mut left = frames;
    for n in [1, 1, 2, 4, 8, 16, 25, 25, 25] {
        if left > 0 {
            want.push(n.min(left));
            left -= n.min(left);
        }
    }
    assert_eq!(ramped.chunk_frames(spf), want, "{frames} frames");
    let mut plain_want = vec![1];
    plain_want.extend((1..frames).step_by(25).map(|f| 25.min(frames - f)));
    assert_eq!(plain.chunk_frames(spf), plain_want, "{frames} frames");
}

#[test]
fn the_first_chunk_lane_leaves_every_streams_audio_as_it_was() {
    let lane = engine_with_lane(true, true);
    assert_eq!(lane.first_chunk_lane(), &FirstChunkLane::On);
    let plain = engine(true);
    assert_eq!(plain.first_chunk_lane(), &FirstChunkLane::Off);
    let spf = lane.samples_per_frame();
    let requests: Vec<_> = [("ryan", 40), ("vivian", 3), ("ryan", 2), ("vivian", 25)]
        .into_iter()
        .enumerate()
        .map(|(k, (speaker, frames))| {
            let mut r = greedy(&lane, voice(TEXT, Some(speaker)), frames);
            r.sampling.seed = k as u64;
            r
        })
        .collect();
    // Four at once through the lane (their first chunks decoded there, the rest on stage 1's
    // thread after the carried frames), each against the same request alone without the lane.
    let together: Vec<_> = std::thread::scope(|s| {
        let lane = &lane;
        let handles: Vec<_> = requests
            .iter()
            .map(|r| s.spawn(move || run(lane, r.clone())))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a request thread"))
            .collect()
    });
    for (k, (with, r)) in together.iter().zip(&requests).enumerate() {
        let without = run(&plain, r.clone());
        assert_eq!(with.reason, without.reason, "request {k}");
        assert_eq!(
            with.chunk_frames(spf),
            without.chunk_frames(spf),
            "request {k}: chunks"
        );
        assert!(!with.audio.is_empty(), "request {k}: no audio");
        let e = reference_util::rel_l2(&with.audio, &without.audio);
        assert!(e <= 1e-4, "request {k}: lane vs none: rel L2 {e:e}");
        assert_eq!(with.metrics.frames, without.metrics.frames, "request {k}");
        assert!(with.metrics.ttfa_ms.is_some(), "request {k}: no TTFA");
    }
}

/// 16 greedy streams of `frames` frames started on `engine` and let run until every one still live is
/// 1 s ahead of a real-time listener (tiny checkpoint on the CPU: many times faster than real
/// time), so that none of their next chunks is urgent and stage 0 has stepped them for a while.
fn sixteen_running(engine: &Engine, frames: usize) -> Vec<Running> {
    let rate = engine.sample_rate();
    let mut running: Vec<Running> = (0..16)
        .map(|k| {
            let mut r = greedy(engine, voice(TEXT, Some("ryan")), frames);
            r.sampling.seed = k;
            Running {
                handle: engine.submit(r).expect("submit"),
                first_audio: None,
                samples: 0,
                finished: false,
            }
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        running.iter_mut().for_each(Running::poll);
        let live: Vec<&Running> = running.iter().filter(|r| !r.finished).collect();
        assert!(
            live.len() >= 8,
            "the running streams ended early (EOS): only {} left",
            live.len()
        );
        if live.iter().all(|r| r.slack(rate) >= 1.0) {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "the 16 streams did not get 1 s ahead of real time in 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn with_first_frame_alone_a_new_requests_first_frame_comes_in_a_step_of_its_own() {
    let idle_engine = engine(false);
    let mut late = greedy(&idle_engine, voice("A new request.", Some("vivian")), 30);
    late.sampling.seed = 99;
    let idle = run(&idle_engine, late.clone());
    drop(idle_engine);
    for alone in [false, true] {
        let engine = load(
            "tiny-customvoice",
            config(|c| {
                // Steps alone are taken while fewer streams run than half of the places.
                c.ar.max_num_seqs = 33;
                c.decoder.max_num_seqs = 33;
                c.ar.first_frame_alone = Some(alone);
                // Room for every frame: no running stream sits a step out with a full buffer.
                c.decoder.codec_buffer_frames = 2500;
                c.ar.guard.enabled = false;
            }),
        );
        // Streams long enough that stage 0 still steps them when the new request comes, and
        // stepped long enough that the steps alone of their own start (they may join over a few
        // steps) are a small share of stage 0's recent time.
        let mut running = sixteen_running(&engine, 2000);
        let started = engine.batch_stats()[0].steps;
        let deadline = Instant::now() + Duration::from_secs(60);
        while engine.batch_stats()[0].steps < started + 200 {
            assert!(
                Instant::now() < deadline,
                "stage 0 did not step 200 times in 60 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let before = engine.batch_stats()[0];
        let with = run(&engine, late.clone());
        let after = engine.batch_stats()[0];
        for r in &mut running {
            r.handle.cancel();
        }
        // While it ran, stage 0's steps held other rows than its own (more rows than steps).
        assert!(
            after.rows - before.rows > after.steps - before.steps,
            "alone {alone}: the running streams had left stage 0 ({before:?} → {after:?})"
        );
        let m = &with.metrics;
        let rows = m.first_frame_rows.expect("a first frame");
        if alone {
            assert_eq!(
                rows, 1,
                "first_frame_alone: the first frame came in a step of {rows} rows"
            );
            assert_eq!(m.first_frame_steps, Some(1), "{m:?}");
        } else {
            assert!(
                rows >= 2,
                "without first_frame_alone, a step of {rows} rows"
            );
        }
        // Its own step or the batch's, the request says what it says alone on an idle engine.
        assert_eq!(with.reason, idle.reason, "alone {alone}");
        assert_eq!(with.metrics.frames, idle.metrics.frames, "alone {alone}");
        let e = reference_util::rel_l2(&with.audio, &idle.audio);
        assert!(e <= 1e-4, "alone {alone}: vs idle: rel L2 {e:e}");
    }
    assert!(!idle.audio.is_empty());
}
