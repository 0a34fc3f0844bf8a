//! Stage 0 for many streams over one model: the resumable prefill (`ArModel::begin`,
//! `PendingSession`) against `ArModel::start`, and batched frames (`ArModel::next_frames`) against
//! each session run alone (`ArSession::next_frame`), on the tiny fixtures: every variant
//! (CustomVoice, VoiceDesign, Base with x-vector and ICL prompts), both prompt modes, greedy and
//! sampled, texts of different lengths, rows joining late and finishing at different steps.

mod reference_util;

use gstomnitts::models::qwen3_tts::{
    ArModel, ArSession, ArStep, Checkpoint, FinishReason, ModelError, PromptMode, SamplingParams,
    VoiceClonePrompt, VoiceRequest,
};
use gstomnitts::nn::transformer::PREFILL_CHUNK;
use reference_util::{f32s, fixtures_dir, frames, load_f32, max_abs, reference_suite};
use serde_json::Value;

/// Largest difference between a batched row's logits and its solo run's: float rounding of the
/// batched matmuls (see `src/models/qwen3_tts/batch.rs`); the fixtures' logits are of order 1.
const LOGITS_TOL: f32 = 1e-4;

/// One request of a batch: what to say, how to sample, and the frame step at which it joins.
struct Case {
    name: String,
    req: VoiceRequest,
    sampling: SamplingParams,
    join: usize,
}

/// What a request produced: its frames, why it ended, and the pending logits after the prefill
/// and after every frame.
#[derive(Debug, Default)]
struct Run {
    frames: Vec<Vec<u32>>,
    reason: Option<FinishReason>,
    logits: Vec<Vec<f32>>,
}

fn sampling(dir: &str, max_new_tokens: usize, seed: Option<u64>) -> SamplingParams {
    let ckpt = Checkpoint::open(&fixtures_dir().join(dir)).expect("checkpoint");
    let p = SamplingParams {
        max_new_tokens,
        seed: seed.unwrap_or(0),
        ..SamplingParams::from_generation_config(&ckpt.generation)
    };
    if seed.is_some() { p } else { p.greedy() }
}

fn solo(m: &ArModel, c: &Case) -> Run {
    let mut s = m
        .start(&c.req, &c.sampling)
        .unwrap_or_else(|e| panic!("{}: {e}", c.name));
    let mut run = Run {
        logits: vec![s.pending_logits().to_vec()],
        ..Run::default()
    };
    loop {
        match s.next_frame().unwrap_or_else(|e| panic!("{}: {e}", c.name)) {
            ArStep::Frame(f) => {
                run.frames.push(f);
                run.logits.push(s.pending_logits().to_vec());
            }
            ArStep::Finished(r) => {
                run.reason = Some(r);
                return run;
            }
        }
    }
}

/// All cases in one batch: each joins at its step; a finished row stays in the batch one more
/// step (it must answer Finished again) and then leaves. Returns the runs and the largest number
/// of rows that made a frame together.
fn batched(m: &ArModel, cases: &[Case]) -> (Vec<Run>, usize) {
    let mut sessions: Vec<Option<ArSession<'_>>> = cases.iter().map(|_| None).collect();
    let mut runs: Vec<Run> = cases.iter().map(|_| Run::default()).collect();
    let mut widest = 0;
    for step in 0.. {
        for (k, c) in cases.iter().enumerate() {
            if c.join == step {
                let s = m
                    .start(&c.req, &c.sampling)
                    .unwrap_or_else(|e| panic!("{}: {e}", c.name));
                runs[k].logits.push(s.pending_logits().to_vec());
                sessions[k] = Some(s);
            }
        }
        let (index, mut rows): (Vec<usize>, Vec<&mut ArSession<'_>>) = sessions
            .iter_mut()
            .enumerate()
            .filter_map(|(k, s)| s.as_mut().map(|s| (k, s)))
            .unzip();
        let results = m.next_frames(&mut rows);
        assert_eq!(results.len(), rows.len());
        let (mut making, mut leaving) = (0, Vec::new());
        for ((&k, result), s) in index.iter().zip(results).zip(&rows) {
            let name = &cases[k].name;
            match result.unwrap_or_else(|e| panic!("{name}: {e}")) {
                ArStep::Frame(f) => {
                    assert!(runs[k].reason.is_none(), "{name}: frame after the end");
                    runs[k].frames.push(f);
                    runs[k].logits.push(s.pending_logits().to_vec());
                    making += 1;
                }
                ArStep::Finished(r) => match runs[k].reason {
                    None => runs[k].reason = Some(r),
                    Some(first) => {
                        assert_eq!(first, r, "{name}: Finished changed");
                        leaving.push(k);
                    }
                },
            }
        }
        for k in leaving {
            sessions[k] = None;
        }
        widest = widest.max(making);
        let all_joined = cases.iter().all(|c| c.join <= step);
        if all_joined && sessions.iter().all(Option::is_none) {
            break;
        }
    }
    (runs, widest)
}

/// Runs `cases` alone and in one batch and checks that every row equals its solo run and that
/// at least `min_rows` rows made a frame together. Returns the rows' finish reasons.
fn assert_batched_equals_solo(m: &ArModel, cases: &[Case], min_rows: usize) -> Vec<FinishReason> {
    let (runs, widest) = batched(m, cases);
    assert!(
        widest >= min_rows,
        "at most {widest} rows made a frame together"
    );
    let mut worst = 0f32;
    for (c, got) in cases.iter().zip(&runs) {
        let want = solo(m, c);
        assert!(!want.frames.is_empty(), "{}: no frame", c.name);
        assert_eq!(got.frames, want.frames, "{}: codes differ", c.name);
        assert_eq!(got.reason, want.reason, "{}: finish reason", c.name);
        assert_eq!(got.logits.len(), want.logits.len(), "{}", c.name);
        for (i, (g, w)) in got.logits.iter().zip(&want.logits).enumerate() {
            let d = if g.is_empty() && w.is_empty() {
                0.0
            } else {
                max_abs(g, w)
            };
            assert!(
                d <= LOGITS_TOL,
                "{}: logits after frame {i} differ by {d}",
                c.name
            );
            worst = worst.max(d);
        }
    }
    let lens: Vec<usize> = runs.iter().map(|r| r.frames.len()).collect();
    eprintln!("batched = solo: frames {lens:?}, logits within {worst:e}");
    let mut distinct = lens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() >= 2,
        "every row ended at the same step: {lens:?}"
    );
    runs.iter().filter_map(|r| r.reason).collect()
}

fn voice(
    text: &str,
    speaker: Option<&str>,
    instruct: Option<&str>,
    mode: PromptMode,
) -> VoiceRequest {
    VoiceRequest {
        text: text.into(),
        speaker: speaker.map(str::to_string),
        language: Some("english".into()),
        instruct: instruct.map(str::to_string),
        prompt_mode: Some(mode),
        voice_clone: None,
    }
}

fn case(name: &str, req: VoiceRequest, sampling: SamplingParams, join: usize) -> Case {
    Case {
        name: name.into(),
        req,
        sampling,
        join,
    }
}

#[test]
fn customvoice_batched_equals_solo() {
    let dir = "tiny-customvoice";
    let m = load_f32(&fixtures_dir().join(dir));
    let speakers = m.speakers();
    let (a, b) = (speakers[0].as_str(), speakers[1].as_str());
    use PromptMode::{NonStreaming as Ns, Streaming as St};
    let cases = [
        case(
            "greedy ns",
            voice("Hello world, this is a test.", Some(a), None, Ns),
            sampling(dir, 40, None),
            0,
        ),
        case(
            "greedy st",
            voice("Short.", Some(b), None, St),
            sampling(dir, 25, None),
            0,
        ),
        case(
            "sampled ns",
            voice("A somewhat longer sentence to say.", Some(a), None, Ns),
            sampling(dir, 30, Some(7)),
            0,
        ),
        case(
            "sampled st late",
            voice("Good morning to you all.", Some(b), None, St),
            sampling(dir, 20, Some(8)),
            3,
        ),
        case(
            "greedy late",
            voice("Numbers: one, two, three.", None, None, Ns),
            sampling(dir, 12, None),
            6,
        ),
    ];
    assert_batched_equals_solo(&m, &cases, 3);
}

/// Enough sessions for a frame's codebook-0 choices to be spread over threads (8 or more): each
/// sampled row still draws exactly its solo run's codes, through joins and finishes.
#[test]
fn many_sampled_rows_batched_equal_solo() {
    let dir = "tiny-customvoice";
    let m = load_f32(&fixtures_dir().join(dir));
    let speakers = m.speakers();
    let texts = [
        "Hello world, this is a test.",
        "Short.",
        "A somewhat longer sentence to say.",
        "Good morning to you all.",
        "Numbers: one, two, three.",
        "The quick brown fox jumps.",
    ];
    let cases: Vec<Case> = (0..12)
        .map(|k| {
            let mode = if k % 2 == 0 {
                PromptMode::NonStreaming
            } else {
                PromptMode::Streaming
            };
            let speaker = speakers[k % speakers.len()].as_str();
            case(
                "sampled",
                voice(texts[k % texts.len()], Some(speaker), None, mode),
                sampling(dir, 14 + k, Some(100 + k as u64)),
                k % 3,
            )
        })
        .collect();
    assert_batched_equals_solo(&m, &cases, 8);
}

#[test]
fn voicedesign_batched_equals_solo() {
    let dir = "tiny-voicedesign";
    let m = load_f32(&fixtures_dir().join(dir));
    use PromptMode::{NonStreaming as Ns, Streaming as St};
    let calm = Some("A calm low voice.");
    let bright = Some("A bright, fast young voice with a smile.");
    // The reference case that ends on EOS (after 61 of its 80 frames), with its own settings.
    let s = reference_suite(dir);
    let ckpt = Checkpoint::open(&s.ckpt_dir).expect("checkpoint");
    let rec = s.json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["id"] == "long_en_ns")
        .expect("case long_en_ns");
    assert_eq!(rec["finish_reason"], "eos");
    let text = |k: &str| rec[k].as_str().map(str::to_string);
    let eos = VoiceRequest {
        text: text("text").expect("text"),
        language: text("language"),
        instruct: text("instruct"),
        prompt_mode: Some(Ns),
        ..VoiceRequest::default()
    };
    let cases = [
        case(
            "greedy ns",
            voice("Hello world, this is a test.", None, calm, Ns),
            sampling(dir, 30, None),
            0,
        ),
        case(
            "sampled st",
            voice("Another line.", None, bright, St),
            sampling(dir, 18, Some(3)),
            0,
        ),
        case("reference eos", eos, s.sampling(&ckpt, rec), 1),
        case(
            "greedy st late",
            voice("It is raining again today.", None, bright, St),
            sampling(dir, 24, None),
            2,
        ),
        case(
            "sampled ns late",
            voice("Yes.", None, calm, Ns),
            sampling(dir, 10, Some(4)),
            4,
        ),
    ];
    let reasons = assert_batched_equals_solo(&m, &cases, 3);
    assert_eq!(
        reasons[2],
        FinishReason::Eos,
        "the reference case ends on EOS"
    );
    assert!(reasons.contains(&FinishReason::Length));
}

/// The recorded voice-clone prompt of a `tiny-base` reference case (x-vector, and for ICL the
/// reference codes and transcript).
fn recorded_clone(s: &reference_util::Suite, id: &str) -> (Value, VoiceClonePrompt) {
    let case = s.json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no case {id}"))
        .clone();
    let icl = case["icl_mode"].as_bool().expect("icl_mode");
    let x_vector = f32s(&s.tensors[case["tensors"]["ref_spk_embedding"].as_str().expect("x")]);
    let vc = VoiceClonePrompt {
        ref_codes: icl.then(|| frames(&case["ref_code"])),
        x_vector,
        ref_text: case["ref_text"]
            .as_str()
            .filter(|_| icl)
            .map(str::to_string),
        icl,
    };
    (case, vc)
}

#[test]
fn base_clone_batched_equals_solo() {
    let dir = "tiny-base";
    let s = reference_suite(dir);
    let m = load_f32(&s.ckpt_dir);
    let mut cases = Vec::new();
    for (k, (id, seed, max)) in [
        ("xvec_english_ns", None, 30),
        ("icl_english_st", None, 22),
        ("xvec_auto_st", Some(5), 26),
        ("icl_chinese_ns", Some(6), 16),
        ("icl_short_ref_st", None, 12),
    ]
    .into_iter()
    .enumerate()
    {
        let (rec, vc) = recorded_clone(&s, id);
        let mode = match rec["prompt_mode"].as_str() {
            Some("streaming") => PromptMode::Streaming,
            _ => PromptMode::NonStreaming,
        };
        let req = VoiceRequest {
            text: rec["text"].as_str().expect("text").into(),
            language: rec["language"].as_str().map(str::to_string),
            prompt_mode: Some(mode),
            voice_clone: Some(vc),
            ..VoiceRequest::default()
        };
        cases.push(case(id, req, sampling(dir, max, seed), [0, 0, 1, 3, 5][k]));
    }
    assert_batched_equals_solo(&m, &cases, 3);
}

/// With one unfinished session the batched call is the solo path: the same codes and bit-identical
/// logits; finished rows cost nothing and answer Finished again.
#[test]
fn one_row_is_the_solo_path() {
    let dir = "tiny-customvoice";
    let m = load_f32(&fixtures_dir().join(dir));
    let speaker = m.speakers().into_iter().next();
    let req = voice(
        "Hello world, this is a test.",
        speaker.as_deref(),
        None,
        PromptMode::NonStreaming,
    );
    for p in [sampling(dir, 15, None), sampling(dir, 15, Some(21))] {
        let mut alone = m.start(&req, &p).expect("start");
        let mut batched = m.start(&req, &p).expect("start");
        let mut done = m
            .start(
                &req,
                &SamplingParams {
                    max_new_tokens: 1,
                    ..p.clone()
                },
            )
            .expect("start");
        assert_eq!(
            done.next_frame().expect("frame"),
            ArStep::Finished(FinishReason::Length)
        );
        loop {
            let want = alone.next_frame().expect("frame");
            let got = m.next_frames(&mut [&mut done, &mut batched]);
            let mut got = got.into_iter();
            assert_eq!(
                got.next().map(|r| r.expect("finished row")),
                Some(ArStep::Finished(FinishReason::Length))
            );
            assert_eq!(got.next().map(|r| r.expect("frame")), Some(want.clone()));
            assert_eq!(batched.pending_logits(), alone.pending_logits());
            if matches!(want, ArStep::Finished(_)) {
                break;
            }
        }
    }
    assert!(m.next_frames(&mut []).is_empty());
}

#[test]
fn a_session_of_another_model_is_refused() {
    let dir = fixtures_dir().join("tiny-customvoice");
    let (m, other) = (load_f32(&dir), load_f32(&dir));
    let speaker = m.speakers().into_iter().next();
    let req = voice("Hello.", speaker.as_deref(), None, PromptMode::NonStreaming);
    let p = sampling("tiny-customvoice", 5, None);
    let mut mine = m.start(&req, &p).expect("start");
    let mut theirs = other.start(&req, &p).expect("start");
    let before = theirs.pending_logits().to_vec();
    let results = m.next_frames(&mut [&mut mine, &mut theirs]);
    assert!(matches!(results[0], Ok(ArStep::Frame(_))));
    match &results[1] {
        Err(ModelError::InvalidRequest { field, .. }) => assert_eq!(field, "sessions"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(
        theirs.pending_logits(),
        before,
        "the refused session was touched"
    );
    assert_eq!(theirs.frames_generated(), 0);
}

/// The frames and pending logits of a session to its end.
fn to_end(mut s: ArSession<'_>) -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let mut logits = vec![s.pending_logits().to_vec()];
    let mut frames = Vec::new();
    while let ArStep::Frame(f) = s.next_frame().expect("frame") {
        frames.push(f);
        logits.push(s.pending_logits().to_vec());
    }
    (frames, logits)
}

/// `begin` + `prefill_step(PREFILL_CHUNK)` until complete + `into_session` is `start`, bit for bit,
/// also for a prompt of several chunks; smaller steps give the same codes and logits within float
/// rounding; the step count, `remaining`, and the errors of an unfinished or invalid prefill.
#[test]
fn resumable_prefill_equals_start() {
    let dir = "tiny-customvoice";
    let m = load_f32(&fixtures_dir().join(dir));
    let speaker = m.speakers().into_iter().next();
    let long = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(60);
    for (text, mode) in [
        ("Hello world, this is a test.", PromptMode::NonStreaming),
        (long.as_str(), PromptMode::NonStreaming),
        (
            "A streaming prompt keeps its text for the frames.",
            PromptMode::Streaming,
        ),
    ] {
        let req = voice(text, speaker.as_deref(), None, mode);
        let p = sampling(dir, 12, None);
        let (want_frames, want_logits) = to_end(m.start(&req, &p).expect("start"));

        let mut pending = m.begin(&req, &p).expect("begin");
        let total = pending.prefill_len();
        assert_eq!(pending.remaining(), total);
        assert!(!pending.prefill_step(0).expect("empty step"));
        assert_eq!(pending.remaining(), total);
        let mut steps = 0;
        while !pending.prefill_step(PREFILL_CHUNK).expect("step") {
            steps += 1;
            assert_eq!(pending.remaining(), total - steps * PREFILL_CHUNK);
        }
        assert_eq!(
            steps + 1,
            total.div_ceil(PREFILL_CHUNK),
            "{total} positions"
        );
        assert_eq!(pending.remaining(), 0);
        assert!(
            pending
                .prefill_step(PREFILL_CHUNK)
                .expect("step after the end")
        );
        let (frames, logits) = to_end(pending.into_session().expect("session"));
        assert_eq!(frames, want_frames, "{total} positions: codes");
        assert_eq!(
            logits, want_logits,
            "{total} positions: logits not bit-identical"
        );

        let mut pending = m.begin(&req, &p).expect("begin");
        let step = 7;
        let mut n = 0;
        while !pending.prefill_step(step).expect("step") {
            n += 1;
            assert_eq!(pending.remaining(), total - n * step);
        }
        let (frames, logits) = to_end(pending.into_session().expect("session"));
        assert_eq!(
            frames, want_frames,
            "{total} positions in steps of {step}: codes"
        );
        for (i, (g, w)) in logits.iter().zip(&want_logits).enumerate() {
            if !g.is_empty() {
                let d = max_abs(g, w);
                assert!(d <= LOGITS_TOL, "steps of {step}: logits {i} differ by {d}");
            }
        }
    }
    let req = voice("Hello.", speaker.as_deref(), None, PromptMode::NonStreaming);
    let mut pending = m.begin(&req, &sampling(dir, 5, None)).expect("begin");
    pending.prefill_step(2).expect("step");
    let left = pending.remaining();
    assert!(left > 0);
    match pending.into_session() {
        Err(ModelError::PrefillIncomplete { remaining }) => assert_eq!(remaining, left),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("a session from an unfinished prefill"),
    }
    let bad = VoiceRequest {
        speaker: Some("nobody".into()),
        ..req.clone()
    };
    match m.begin(&bad, &sampling(dir, 5, None)) {
        Err(ModelError::InvalidRequest { field, .. }) => assert_eq!(field, "speaker"),
        Err(e) => panic!("unexpected {e}"),
        Ok(_) => panic!("an unknown speaker was accepted"),
    }
    let zero = SamplingParams {
        max_new_tokens: 0,
        ..sampling(dir, 5, None)
    };
    assert!(matches!(
        m.begin(&req, &zero),
        Err(ModelError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.start_until(&req, &sampling(dir, 5, None), &|| true),
        Err(ModelError::Stopped)
    ));
}

/// What the batched step's float noise comes from: candle's CPU matmul (`Linear` on `[rows, 1, k]`,
/// one gemm of `rows` rows) against the same rows one at a time. Prints whether the rows are
/// bit-identical and by how much they differ, for a fixture-sized and a 0.6B-sized projection;
/// fails if they differ by more than float rounding.
#[test]
fn cpu_matmul_rows_versus_one_row() {
    use candle_core::{Device, Module, Tensor};
    for (k, n) in [(32, 96), (1024, 3072)] {
        let w = Tensor::randn(0f32, 0.05, (n, k), &Device::Cpu).expect("w");
        let lin = candle_nn::Linear::new(w, None);
        for rows in [2, 8] {
            let x = Tensor::randn(0f32, 1.0, (rows, 1, k), &Device::Cpu).expect("x");
            let all = f32s(&lin.forward(&x).expect("rows"));
            let mut one = Vec::with_capacity(all.len());
            for r in 0..rows {
                let row = x.narrow(0, r, 1).expect("row");
                one.extend(f32s(&lin.forward(&row).expect("one row")));
            }
            let d = max_abs(&all, &one);
            let scale = one.iter().fold(0f32, |m, v| m.max(v.abs()));
            eprintln!(
                "k={k} n={n} rows={rows}: {} (max abs diff {d:e}, max |y| {scale:.2})",
                if d == 0.0 { "bit-identical" } else { "differ" }
            );
            assert!(d <= 1e-5 * scale.max(1.0), "k={k} n={n} rows={rows}: {d}");
        }
    }
}
