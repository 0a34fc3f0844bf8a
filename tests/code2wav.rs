//! Code2Wav (stage 1) against the official reference outputs in tests/fixtures (see its README),
//! plus streaming equivalence, windowed mode and error handling.
//!
//! Run: `CARGO_TARGET_DIR=/work/target cargo test --test code2wav -- --nocapture`

mod reference_util;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use gstomnitts::models::qwen3_tts::code2wav::{Code2Wav, Code2WavStream, ModelError};
use reference_util::{fixture, fixtures_dir, frames, max_abs, rel_l2};

const CHECKPOINTS: [&str; 3] = ["tiny-customvoice", "tiny-voicedesign", "tiny-base"];

fn load_model(name: &str) -> Code2Wav {
    let dir = fixture(name);
    Code2Wav::load(&dir, &Device::Cpu)
        .unwrap_or_else(|e| panic!("loading Code2Wav from {}: {e}", dir.display()))
}

struct Reference {
    json: serde_json::Value,
    tensors: HashMap<String, Tensor>,
}

fn reference(name: &str) -> Reference {
    let dir = fixtures_dir().join("reference");
    let text = std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("reference json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("reference json parses");
    let tensors =
        candle_core::safetensors::load(dir.join(format!("{name}.safetensors")), &Device::Cpu)
            .expect("reference safetensors");
    Reference { json, tensors }
}

impl Reference {
    fn wav(&self, key: &str) -> Vec<f32> {
        let t = self
            .tensors
            .get(key)
            .unwrap_or_else(|| panic!("missing {key}"));
        t.to_dtype(DType::F32).unwrap().to_vec1().unwrap()
    }

    fn codes(&self, key: &str) -> Vec<Vec<u32>> {
        let t = self
            .tensors
            .get(key)
            .unwrap_or_else(|| panic!("missing {key}"));
        let rows: Vec<Vec<i64>> = t.to_dtype(DType::I64).unwrap().to_vec2().unwrap();
        rows.into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|v| u32::try_from(v).expect("code id ≥ 0"))
                    .collect()
            })
            .collect()
    }
}

fn rms(a: &[f32]) -> f64 {
    (a.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / a.len().max(1) as f64).sqrt()
}

/// Deterministic pseudo-random codes (xorshift), `frames × 16` ids in [0, 2048).
fn random_codes(frames: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..frames)
        .map(|_| {
            (0..16)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % 2048) as u32
                })
                .collect()
        })
        .collect()
}

#[test]
fn config_and_rates_come_from_json() {
    let m = load_model("tiny-voicedesign");
    assert_eq!(m.samples_per_frame(), 1920);
    assert_eq!(m.sample_rate(), 24000);
    assert_eq!(m.num_quantizers(), 16);
    assert_eq!(m.codebook_size(), 2048);
    let d = &m.config().decoder_config;
    assert_eq!((d.hidden_size, d.latent_dim, d.decoder_dim), (24, 48, 48));
    assert_eq!(d.sliding_window, 72);
}

#[test]
fn decoder_only_matches_reference_for_every_checkpoint() {
    for name in CHECKPOINTS {
        let m = load_model(name);
        let r = reference(name);
        let codes = r.codes("decoder_only/codes");
        let want = r.wav("decoder_only/wav");
        assert_eq!(
            codes.len(),
            r.json["decoder_only"]["frames"].as_u64().unwrap() as usize
        );
        let got = m.decode(&codes).unwrap();
        assert_eq!(got.len(), codes.len() * 1920);
        let e = rel_l2(&got, &want);
        println!(
            "{name} decoder_only: rel L2 {e:.3e}, max abs {:.3e}, rms {:.3}",
            max_abs(&got, &want),
            rms(&want)
        );
        assert!(e < 1e-4, "{name}: decoder_only rel L2 {e}");
    }
}

#[test]
fn greedy_case_codes_match_reference_wavs() {
    for name in CHECKPOINTS {
        let m = load_model(name);
        let r = reference(name);
        let cases = r.json["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let id = case["id"].as_str().unwrap();
            let mut codes = frames(&case["codes"]);
            assert_eq!(codes.len(), case["num_frames"].as_u64().unwrap() as usize);
            let (key, ref_frames) = if case["icl_mode"].as_bool() == Some(true) {
                // ICL: the wrapper decodes ref_code ++ codes, then cuts the front.
                let mut all = frames(&case["ref_code"]);
                let fr = all.len();
                all.append(&mut codes);
                codes = all;
                (format!("{id}/wav_full"), fr)
            } else {
                (format!("{id}/wav"), 0)
            };
            let want = r.wav(&key);
            let got = m.decode(&codes).unwrap();
            let e = rel_l2(&got, &want);
            assert!(
                e < 1e-4,
                "{name}/{id}: rel L2 {e} ({} frames, {ref_frames} ref)",
                codes.len()
            );
            if ref_frames > 0 {
                let cut = case["ref_cut_samples"].as_u64().unwrap() as usize;
                let cut_wav = r.wav(&format!("{id}/wav"));
                assert_eq!(
                    cut_wav.len(),
                    got.len() - cut,
                    "{name}/{id}: ICL cut length"
                );
            }
        }
        println!("{name}: {} greedy cases match", cases.len());
    }
}

#[test]
fn long_sequence_single_pass_and_official_chunking() {
    let m = load_model("tiny-customvoice");
    let r = reference("tiny-customvoice");
    let codes = r.codes("decoder_long/codes");
    assert_eq!(codes.len(), 330);
    let single = r.wav("decoder_long/wav_single_pass");
    let chunked = r.wav("decoder_long/wav");
    let got = m.decode(&codes).unwrap();
    let e = rel_l2(&got, &single);
    println!(
        "decoder_long single pass: rel L2 {e:.3e}, max abs {:.3e}",
        max_abs(&got, &single)
    );
    assert!(e < 1e-4, "single pass rel L2 {e}");
    // The official Qwen3TTSTokenizer.decode = chunked_decode(300, 25): windows [0, 300) and
    // [275, 330), keeping the last 30 frames of the second.
    let official = m.decode_chunked(&codes, 300, 25).unwrap();
    let e = rel_l2(&official, &chunked);
    println!("decoder_long official 300/25 windows: rel L2 {e:.3e}");
    assert!(e < 1e-4, "chunked rel L2 {e}");
    // ... and the single pass really differs from the chunked reference past frame 300.
    assert!(max_abs(&got[300 * 1920..], &chunked[300 * 1920..]) > 1e-3);
}

/// Splits `n` frames as `initial, chunk, chunk, ..., ragged rest`.
fn schedule(n: usize, initial: usize, chunk: usize) -> Vec<usize> {
    let mut v = vec![initial.min(n)];
    let mut done = v[0];
    while done < n {
        let c = chunk.min(n - done);
        v.push(c);
        done += c;
    }
    v
}

/// f32 tolerance of "streamed == whole". The fixture weights are chosen to be sensitive (README
/// there): the SnakeBeta vocoder amplifies f32 rounding, so two *whole* decodes that differ only in
/// the internal pass size already differ by ~2-3e-5 (see `internal_pass_size_does_not_change_the_result`).
/// The exactness of the streaming state itself is asserted in f64 (`F64_TOL`), where that noise is gone.
const F32_TOL: f32 = 1e-4;
/// f64 compute, f32 output: only the final f32 rounding remains.
const F64_TOL: f32 = 1e-6;

fn load_model_f64(name: &str) -> Code2Wav {
    Code2Wav::load_with_dtype(&fixture(name), &Device::Cpu, DType::F64).expect("f64 load")
}

/// Decodes `codes` with every (initial, chunk) schedule on a reused stream and compares with `decode`.
fn check_streaming(m: &Code2Wav, codes: &[Vec<u32>], tol: f32, label: &str) {
    let n = codes.len();
    let whole = m.decode(codes).unwrap();
    let mut stream = m.stream();
    for initial in [1, 2] {
        for chunk in [1, 2, 10, 25] {
            let sched = schedule(n, initial, chunk);
            assert_eq!(sched.iter().sum::<usize>(), n);
            // The ragged final chunk is exercised whenever (n - initial) % chunk != 0.
            if chunk > 2 {
                assert_ne!(*sched.last().unwrap(), chunk);
            }
            stream.reset();
            let mut out = Vec::with_capacity(whole.len());
            let mut done = 0;
            for &c in &sched {
                let wav = stream.decode_chunk(&codes[done..done + c]).unwrap();
                assert_eq!(wav.len(), c * 1920, "samples for a {c}-frame chunk");
                out.extend(wav);
                done += c;
                assert_eq!(stream.frames_decoded(), done);
            }
            let d = max_abs(&out, &whole);
            println!("{label}: initial {initial}, chunk {chunk:>2}: max abs diff {d:.3e}");
            assert!(
                d <= tol,
                "{label}: initial {initial}, chunk {chunk}: max abs diff {d}"
            );
        }
    }
    // An empty chunk is a no-op.
    stream.reset();
    assert!(stream.decode_chunk(&[]).unwrap().is_empty());
    assert_eq!(stream.frames_decoded(), 0);
}

#[test]
fn streamed_equals_whole_for_all_schedules_f32() {
    let r = reference("tiny-customvoice");
    // 330 frames: far beyond the sliding window (72), so the KV window and RoPE positions matter.
    let codes = r.codes("decoder_long/codes");
    check_streaming(&load_model("tiny-customvoice"), &codes, F32_TOL, "f32");
}

#[test]
fn streamed_equals_whole_for_all_schedules_f64() {
    let r = reference("tiny-customvoice");
    let codes = r.codes("decoder_long/codes");
    let m = load_model_f64("tiny-customvoice");
    check_streaming(&m, &codes, F64_TOL, "f64");
    // The f64 decode agrees with the (f32) reference as well.
    let e = rel_l2(
        &m.decode(&codes).unwrap(),
        &r.wav("decoder_long/wav_single_pass"),
    );
    println!("f64 decoder_long vs reference single pass: rel L2 {e:.3e}");
    assert!(e < 1e-4);
}

#[test]
fn streamed_equals_whole_f64_voicedesign_random() {
    // Another checkpoint (3 heads, other widths) on 160 random frames.
    check_streaming(
        &load_model_f64("tiny-voicedesign"),
        &random_codes(160, 21),
        F64_TOL,
        "f64 voicedesign",
    );
}

#[test]
fn internal_pass_size_does_not_change_the_result() {
    for (m, tol, label) in [
        (load_model("tiny-base"), F32_TOL, "f32"),
        (load_model_f64("tiny-base"), F64_TOL, "f64"),
    ] {
        let mut m = m;
        let codes = random_codes(80, 7);
        let a = m.decode(&codes).unwrap();
        m.set_max_frames_per_pass(1000);
        let b = m.decode(&codes).unwrap();
        m.set_max_frames_per_pass(3);
        let c = m.decode(&codes).unwrap();
        let (ab, ac) = (max_abs(&a, &b), max_abs(&a, &c));
        println!(
            "{label}: pass 32 vs 1000: {ab:.3e}, 32 vs 3: {ac:.3e}, rms {:.3}",
            rms(&a)
        );
        assert!(ab <= tol && ac <= tol, "{label}: {ab} {ac}");
        assert!(rms(&a) > 1e-3, "output is not silent");
    }
}

#[test]
fn decode_window_lengths_and_no_context_case() {
    let m = load_model("tiny-customvoice");
    let codes = random_codes(40, 3);
    for (left, new) in [(0, 1), (0, 7), (5, 1), (25, 10), (39, 1)] {
        let w = m
            .decode_window(&codes[..left], &codes[left..left + new])
            .unwrap();
        assert_eq!(w.len(), new * 1920, "left {left}, new {new}");
    }
    // No context: the same as a fresh whole decode.
    let a = m.decode_window(&[], &codes[..12]).unwrap();
    let b = m.decode(&codes[..12]).unwrap();
    assert!(max_abs(&a, &b) <= F32_TOL);
    // Context: the tail of the whole decode of context ++ new (causality: keep the LAST samples).
    let whole = m.decode(&codes[..30]).unwrap();
    let w = m.decode_window(&codes[..20], &codes[20..30]).unwrap();
    assert!(max_abs(&w, &whole[20 * 1920..]) <= F32_TOL);
    assert!(m.decode_window(&codes[..5], &[]).unwrap().is_empty());
}

/// vLLM-Omni-style windowed streaming (chunks of 25 frames, each decoded with `left` frames of
/// context) against the exact single pass, on 200 random frames.
#[test]
fn windowed_mode_error_shrinks_with_left_context() {
    let m = load_model("tiny-customvoice");
    let codes = random_codes(200, 11);
    let whole = m.decode(&codes).unwrap();
    let chunk = 25;
    let mut errors = Vec::new();
    for left in [0usize, 25, 72, 150] {
        let mut out = Vec::with_capacity(whole.len());
        let mut start = 0;
        while start < codes.len() {
            let end = (start + chunk).min(codes.len());
            let ctx = left.min(start);
            out.extend(
                m.decode_window(&codes[start - ctx..start], &codes[start..end])
                    .unwrap(),
            );
            start = end;
        }
        let e = rel_l2(&out, &whole);
        let d = max_abs(&out, &whole);
        println!(
            "windowed mode, chunk {chunk}, left context {left:>3}: rel L2 {e:.3e}, max abs {d:.3e}"
        );
        errors.push(e);
    }
    for w in errors.windows(2) {
        assert!(
            w[1] <= w[0] * 1.05 + 1e-6,
            "error does not shrink: {errors:?}"
        );
    }
    assert!(
        errors[0] > 1e-3,
        "no-context windows should differ from the exact decode: {errors:?}"
    );
    assert!(
        errors[3] < errors[0] / 10.0,
        "150 frames of context should help: {errors:?}"
    );
}

#[test]
fn invalid_codes_are_rejected_without_touching_the_stream() {
    let m = load_model("tiny-customvoice");
    let codes = random_codes(6, 5);
    let mut bad_id = codes.clone();
    bad_id[2][7] = 2048;
    match m.decode(&bad_id) {
        Err(ModelError::InvalidRequest { field, value, .. }) => {
            assert_eq!(field, "codes[2][7]");
            assert_eq!(value, "2048");
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    let mut short = codes.clone();
    short[1].pop();
    assert!(matches!(
        m.decode(&short),
        Err(ModelError::InvalidRequest { .. })
    ));
    let mut long = codes.clone();
    long[0].push(1);
    assert!(matches!(
        m.decode(&long),
        Err(ModelError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.decode_window(&bad_id, &codes),
        Err(ModelError::InvalidRequest { .. })
    ));
    assert!(matches!(
        m.decode_window(&codes, &short),
        Err(ModelError::InvalidRequest { .. })
    ));

    let whole = m.decode(&codes).unwrap();
    let mut s = m.stream();
    let mut out = s.decode_chunk(&codes[..3]).unwrap();
    assert!(s.decode_chunk(&bad_id[2..]).is_err());
    assert_eq!(s.frames_decoded(), 3);
    out.extend(s.decode_chunk(&codes[3..]).unwrap());
    assert!(max_abs(&out, &whole) <= F32_TOL);
}

/// One stream of the batched tests: its codes (the first `primed` of them reference codes whose
/// audio is dropped, as a Base ICL request primes its decoder), its chunk schedule, and the tick
/// of the batched run at which it joins.
struct Job {
    codes: Vec<Vec<u32>>,
    primed: usize,
    sched: Vec<usize>,
    join: usize,
}

/// Six streams of different lengths (two past the 72-frame window), schedules and join ticks;
/// streams 1 and 4 are primed with reference codes (their first chunk).
fn jobs() -> Vec<Job> {
    let job = |frames: usize, primed: usize, initial, chunk, join, seed| {
        let mut sched = if primed > 0 { vec![primed] } else { vec![] };
        sched.extend(schedule(frames - primed, initial, chunk));
        Job {
            codes: random_codes(frames, seed),
            primed,
            sched,
            join,
        }
    };
    vec![
        job(60, 0, 1, 25, 0, 31),
        job(77, 30, 1, 25, 0, 32),
        job(90, 0, 2, 10, 1, 33),
        job(25, 0, 1, 25, 3, 34),
        job(140, 40, 1, 25, 2, 35),
        job(33, 0, 3, 7, 4, 36),
    ]
}

/// The job's audio after the primed frames, decoded alone chunk by chunk.
fn solo(m: &Code2Wav, job: &Job) -> Vec<f32> {
    let mut stream = m.stream();
    let mut out = Vec::new();
    let mut done = 0;
    for &c in &job.sched {
        out.extend(stream.decode_chunk(&job.codes[done..done + c]).unwrap());
        done += c;
    }
    out.split_off(job.primed * 1920)
}

/// All `jobs` decoded together: at tick `t` every joined stream with chunks left decodes its
/// next chunk, all in one `decode_chunks` call. Returns each job's audio after its primed frames.
fn batched(m: &Code2Wav, jobs: &[Job]) -> Vec<Vec<f32>> {
    let mut streams: Vec<_> = jobs.iter().map(|_| m.stream()).collect();
    let mut outs = vec![Vec::new(); jobs.len()];
    let mut done = vec![0; jobs.len()];
    let last_tick = jobs.iter().map(|j| j.join + j.sched.len()).max().unwrap();
    for tick in 0..last_tick {
        let (mut batch, mut chunks, mut who) = (Vec::new(), Vec::new(), Vec::new());
        for (i, (job, stream)) in jobs.iter().zip(streams.iter_mut()).enumerate() {
            let Some(&c) = tick.checked_sub(job.join).and_then(|k| job.sched.get(k)) else {
                continue;
            };
            batch.push(stream);
            chunks.push(&job.codes[done[i]..done[i] + c]);
            who.push(i);
        }
        let results = m.decode_chunks(&mut batch, &chunks);
        assert_eq!(results.len(), who.len());
        for (&i, r) in who.iter().zip(results) {
            let wav = r.unwrap_or_else(|e| panic!("stream {i} at tick {tick}: {e}"));
            let c = jobs[i].sched[tick - jobs[i].join];
            assert_eq!(wav.len(), c * 1920, "stream {i} at tick {tick}: samples");
            done[i] += c;
            outs[i].extend(wav);
        }
    }
    for (i, (s, job)) in streams.iter().zip(jobs).enumerate() {
        assert_eq!(
            s.frames_decoded(),
            job.codes.len(),
            "stream {i}: frames decoded"
        );
    }
    outs.into_iter()
        .zip(jobs)
        .map(|(mut o, j)| o.split_off(j.primed * 1920))
        .collect()
}

/// Batched = solo, to the bit, for 1..6 streams at once (joining at different ticks), and each
/// solo stream equals its whole decode: on two checkpoints (tiny-voicedesign: 3 heads, other
/// widths), in f32 and f64, and once with passes of at most 8 frames per stream and 20 per batch,
/// so that streams are cut into passes of several lengths and equal-length groups are split.
/// tiny-voicedesign's f32 streamed-vs-whole rounding noise reaches F32_TOL (1.02e-4 on stream 2),
/// so its streaming exactness is checked in f64, where that noise is gone.
#[test]
fn batched_streams_equal_solo_streams() {
    let jobs = jobs();
    for (name, f64, per_stream, per_batch, whole_tol) in [
        ("tiny-customvoice", false, None, None, Some(F32_TOL)),
        ("tiny-customvoice", false, Some(8), Some(20), Some(F32_TOL)),
        ("tiny-voicedesign", false, None, None, None),
        ("tiny-voicedesign", true, None, None, Some(F64_TOL)),
    ] {
        let mut m = if f64 {
            load_model_f64(name)
        } else {
            load_model(name)
        };
        if let (Some(s), Some(b)) = (per_stream, per_batch) {
            m.set_max_frames_per_pass(s);
            m.set_max_batch_frames(b);
        }
        let dtype = if f64 { "f64" } else { "f32" };
        let label = format!("{name} {dtype}, pass sizes {per_stream:?}/{per_batch:?}");
        let solos: Vec<Vec<f32>> = jobs.iter().map(|j| solo(&m, j)).collect();
        for (i, (job, wav)) in jobs.iter().zip(&solos).enumerate() {
            let Some(tol) = whole_tol else { break };
            let whole = m.decode(&job.codes).unwrap();
            let d = max_abs(wav, &whole[job.primed * 1920..]);
            assert!(d <= tol, "{label}: stream {i}: solo streamed vs whole {d}");
        }
        for b in 1..=jobs.len() {
            let got = batched(&m, &jobs[..b]);
            for (i, (g, want)) in got.iter().zip(&solos).enumerate() {
                assert!(
                    g == want,
                    "{label}: {b} streams: stream {i} differs from its solo run (rel L2 {:.1e}, \
                     max abs {:.1e})",
                    rel_l2(g, want),
                    max_abs(g, want)
                );
            }
        }
        println!(
            "{label}: 1..={} streams batched, every one bit-identical to solo",
            jobs.len()
        );
    }
}

/// A stream with bad codes, or one of another model, gets its error and keeps its state; the
/// other streams of the call decode as alone; an empty chunk gives no samples.
#[test]
fn decode_chunks_isolates_bad_streams() {
    let m = load_model("tiny-customvoice");
    let other = load_model("tiny-customvoice");
    let codes = random_codes(12, 41);
    let mut bad = codes.clone();
    bad[3][5] = 4000;
    let (mut good, mut wrong, mut foreign, mut idle) =
        (m.stream(), m.stream(), other.stream(), m.stream());
    for s in [&mut good, &mut wrong] {
        s.decode_chunk(&codes[..2]).unwrap();
    }
    let results = m.decode_chunks(
        &mut [&mut good, &mut wrong, &mut foreign, &mut idle],
        &[&codes[2..], &bad[2..], &codes[..4], &[]],
    );
    let mut results = results.into_iter();
    let good_wav = results.next().unwrap().unwrap();
    match results.next().unwrap() {
        Err(ModelError::InvalidRequest { field, value, .. }) => {
            assert_eq!((field.as_str(), value.as_str()), ("codes[1][5]", "4000"));
        }
        other => panic!("expected InvalidRequest for the bad codes, got {other:?}"),
    }
    match results.next().unwrap() {
        Err(ModelError::InvalidRequest { field, .. }) => assert_eq!(field, "stream"),
        other => panic!("expected InvalidRequest for the foreign stream, got {other:?}"),
    }
    assert!(results.next().unwrap().unwrap().is_empty());
    assert!(results.next().is_none());
    assert_eq!(
        (
            good.frames_decoded(),
            wrong.frames_decoded(),
            foreign.frames_decoded(),
            idle.frames_decoded()
        ),
        (12, 2, 0, 0)
    );
    let whole = m.decode(&codes).unwrap();
    assert!(max_abs(&good_wav, &whole[2 * 1920..]) <= F32_TOL);
    // The rejected stream continues as if the bad chunk had never been offered.
    let rest = wrong.decode_chunk(&codes[2..]).unwrap();
    assert!(max_abs(&rest, &whole[2 * 1920..]) <= F32_TOL);
    assert!(m.decode_chunks(&mut [], &[]).is_empty());
    // One chunk per stream, or every stream is refused and none decodes.
    let refused = m.decode_chunks(&mut [&mut good, &mut idle], &[&codes[..1]]);
    assert_eq!(refused.len(), 2);
    for r in refused {
        match r {
            Err(ModelError::InvalidRequest { field, .. }) => assert_eq!(field, "chunks.len()"),
            other => panic!("expected InvalidRequest for chunks.len(), got {other:?}"),
        }
    }
    assert_eq!((good.frames_decoded(), idle.frames_decoded()), (12, 0));
}

/// Copies `tiny-customvoice/speech_tokenizer` into a temp checkpoint dir, letting `edit` change the
/// decoder tensors and `edit_config` the JSON.
fn modified_checkpoint(
    tag: &str,
    edit: impl FnOnce(&mut HashMap<String, Tensor>),
    edit_config: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let src = fixture("tiny-customvoice").join("speech_tokenizer");
    let dir = std::env::temp_dir().join(format!("code2wav-test-{}-{tag}", std::process::id()));
    let st = dir.join("speech_tokenizer");
    std::fs::create_dir_all(&st).unwrap();
    let mut tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, st.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit_config(&mut cfg);
    std::fs::write(st.join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    dir
}

#[test]
fn missing_tensor_wrong_shape_and_bad_config_are_named() {
    let name = "decoder.pre_transformer.layers.1.mlp.up_proj.weight";
    let dir = modified_checkpoint(
        "missing",
        |t| {
            t.remove(name).expect("tensor exists");
        },
        |_| {},
    );
    match Code2Wav::load(&dir, &Device::Cpu) {
        Err(e @ ModelError::MissingTensor { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(name) && msg.contains("model.safetensors"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected MissingTensor, got {e}"),
        Ok(_) => panic!("expected MissingTensor, got a model"),
    }
    let _ = std::fs::remove_dir_all(&dir);

    let name = "decoder.decoder.2.block.1.conv.weight";
    let dir = modified_checkpoint(
        "shape",
        |t| {
            let w = t.get(name).unwrap().narrow(2, 0, 4).unwrap();
            t.insert(name.to_string(), w);
        },
        |_| {},
    );
    match Code2Wav::load(&dir, &Device::Cpu) {
        Err(ModelError::Shape {
            name: n,
            expected,
            got,
            ..
        }) => {
            assert_eq!(n, name);
            assert_eq!(expected[2], 10);
            assert_eq!(got[2], 4);
        }
        Err(e) => panic!("expected Shape, got {e}"),
        Ok(_) => panic!("expected Shape, got a model"),
    }
    let _ = std::fs::remove_dir_all(&dir);

    // Unknown extra tensors and a missing encoder are fine.
    let dir = modified_checkpoint(
        "extra",
        |t| {
            t.retain(|k, _| !k.starts_with("encoder."));
            t.insert(
                "decoder.something_new".into(),
                Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
            );
        },
        |_| {},
    );
    let m = Code2Wav::load(&dir, &Device::Cpu).unwrap();
    assert_eq!(m.decode(&random_codes(2, 1)).unwrap().len(), 2 * 1920);
    let _ = std::fs::remove_dir_all(&dir);

    let dir = modified_checkpoint(
        "cfg-missing",
        |_| {},
        |c| {
            c["decoder_config"]
                .as_object_mut()
                .unwrap()
                .remove("sliding_window");
        },
    );
    let msg = Code2Wav::load(&dir, &Device::Cpu)
        .err()
        .expect("config error")
        .to_string();
    assert!(
        msg.contains("sliding_window") && msg.contains("config.json"),
        "{msg}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let dir = modified_checkpoint(
        "cfg-rate",
        |_| {},
        |c| {
            c["decode_upsample_rate"] = serde_json::json!(2000);
        },
    );
    match Code2Wav::load(&dir, &Device::Cpu) {
        Err(ModelError::Config { field, .. }) => assert_eq!(field, "decode_upsample_rate"),
        Err(e) => panic!("expected Config, got {e}"),
        Ok(_) => panic!("expected Config, got a model"),
    }
    let _ = std::fs::remove_dir_all(&dir);

    match Code2Wav::load(Path::new("/nonexistent/checkpoint"), &Device::Cpu) {
        Err(ModelError::Io { path, .. }) => assert!(path.ends_with("speech_tokenizer/config.json")),
        Err(e) => panic!("expected Io, got {e}"),
        Ok(_) => panic!("expected Io, got a model"),
    }
}

#[test]
fn non_finite_output_is_an_error() {
    // A NaN in the final conv's bias poisons every sample.
    let dir = modified_checkpoint(
        "nan",
        |t| {
            let b = Tensor::new(&[f32::NAN], &Device::Cpu).unwrap();
            t.insert("decoder.decoder.6.conv.bias".into(), b);
        },
        |_| {},
    );
    let m = Code2Wav::load(&dir, &Device::Cpu).unwrap();
    let e = m
        .decode(&random_codes(2, 2))
        .expect_err("NaN must be an error");
    assert!(e.to_string().contains("not finite"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Real-size decoder (docs/qwen3-tts.md §1.5 values) with seeded random weights, for timing.
/// Writes ~460 MB to the temp dir. Run:
/// `CARGO_TARGET_DIR=/work/target cargo test --release --test code2wav real_size_speed -- --ignored --nocapture`
#[test]
#[ignore]
fn real_size_speed() {
    let dev = Device::Cpu;
    let dir = std::env::temp_dir().join(format!("code2wav-real-{}", std::process::id()));
    let st = dir.join("speech_tokenizer");
    std::fs::create_dir_all(&st).unwrap();
    let cfg = serde_json::json!({
        "decode_upsample_rate": 1920, "output_sample_rate": 24000,
        "decoder_config": {
            "codebook_size": 2048, "codebook_dim": 512, "latent_dim": 1024, "hidden_size": 512,
            "intermediate_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
            "num_key_value_heads": 16, "head_dim": 64, "hidden_act": "silu", "rms_norm_eps": 1e-5,
            "rope_theta": 10000, "sliding_window": 72, "num_quantizers": 16,
            "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2, 2], "decoder_dim": 1536
        }
    });
    std::fs::write(st.join("config.json"), cfg.to_string()).unwrap();
    let mut t: HashMap<String, Tensor> = HashMap::new();
    let mut add = |name: String, shape: &[usize], fan_in: usize, mean: f64| {
        let std = if fan_in == 0 {
            0.1
        } else {
            1.0 / (fan_in as f64).sqrt()
        };
        t.insert(
            name,
            Tensor::randn(mean as f32, std as f32, shape, &dev).unwrap(),
        );
    };
    let p = "decoder";
    for (g, n) in [("rvq_first", 1), ("rvq_rest", 15)] {
        for i in 0..n {
            add(
                format!("{p}.quantizer.{g}.vq.layers.{i}._codebook.embedding_sum"),
                &[2048, 256],
                0,
                0.0,
            );
            add(
                format!("{p}.quantizer.{g}.vq.layers.{i}._codebook.cluster_usage"),
                &[2048],
                0,
                1.0,
            );
        }
        add(
            format!("{p}.quantizer.{g}.output_proj.weight"),
            &[512, 256, 1],
            256,
            0.0,
        );
    }
    add(
        format!("{p}.pre_conv.conv.weight"),
        &[1024, 512, 3],
        1536,
        0.0,
    );
    add(format!("{p}.pre_conv.conv.bias"), &[1024], 0, 0.0);
    let tp = format!("{p}.pre_transformer");
    add(format!("{tp}.input_proj.weight"), &[512, 1024], 1024, 0.0);
    add(format!("{tp}.input_proj.bias"), &[512], 0, 0.0);
    add(format!("{tp}.output_proj.weight"), &[1024, 512], 512, 0.0);
    add(format!("{tp}.output_proj.bias"), &[1024], 0, 0.0);
    add(format!("{tp}.norm.weight"), &[512], 0, 1.0);
    for l in 0..8 {
        let lp = format!("{tp}.layers.{l}");
        for n in ["q", "k", "v"] {
            add(
                format!("{lp}.self_attn.{n}_proj.weight"),
                &[1024, 512],
                512,
                0.0,
            );
        }
        add(
            format!("{lp}.self_attn.o_proj.weight"),
            &[512, 1024],
            1024,
            0.0,
        );
        add(format!("{lp}.mlp.gate_proj.weight"), &[1024, 512], 512, 0.0);
        add(format!("{lp}.mlp.up_proj.weight"), &[1024, 512], 512, 0.0);
        add(
            format!("{lp}.mlp.down_proj.weight"),
            &[512, 1024],
            1024,
            0.0,
        );
        for n in ["input_layernorm", "post_attention_layernorm"] {
            add(format!("{lp}.{n}.weight"), &[512], 0, 1.0);
        }
        for n in ["self_attn_layer_scale", "mlp_layer_scale"] {
            add(format!("{lp}.{n}.scale"), &[512], 0, 0.3);
        }
    }
    for i in 0..2 {
        let up = format!("{p}.upsample.{i}");
        add(format!("{up}.0.conv.weight"), &[1024, 1024, 2], 1024, 0.0);
        add(format!("{up}.0.conv.bias"), &[1024], 0, 0.0);
        add(format!("{up}.1.dwconv.conv.weight"), &[1024, 1, 7], 7, 0.0);
        add(format!("{up}.1.dwconv.conv.bias"), &[1024], 0, 0.0);
        add(format!("{up}.1.norm.weight"), &[1024], 0, 1.0);
        add(format!("{up}.1.norm.bias"), &[1024], 0, 0.0);
        add(format!("{up}.1.pwconv1.weight"), &[4096, 1024], 1024, 0.0);
        add(format!("{up}.1.pwconv1.bias"), &[4096], 0, 0.0);
        add(format!("{up}.1.pwconv2.weight"), &[1024, 4096], 4096, 0.0);
        add(format!("{up}.1.pwconv2.bias"), &[1024], 0, 0.0);
        add(format!("{up}.1.gamma"), &[1024], 0, 0.3);
    }
    add(
        format!("{p}.decoder.0.conv.weight"),
        &[1536, 1024, 7],
        7168,
        0.0,
    );
    add(format!("{p}.decoder.0.conv.bias"), &[1536], 0, 0.0);
    for (b, (rate, cin)) in [(8, 1536), (5, 768), (4, 384), (3, 192)]
        .into_iter()
        .enumerate()
    {
        let bp = format!("{p}.decoder.{}.block", b + 1);
        let cout = cin / 2;
        add(format!("{bp}.0.alpha"), &[cin], 0, 0.0);
        add(format!("{bp}.0.beta"), &[cin], 0, 0.0);
        add(
            format!("{bp}.1.conv.weight"),
            &[cin, cout, 2 * rate],
            cin * 2,
            0.0,
        );
        add(format!("{bp}.1.conv.bias"), &[cout], 0, 0.0);
        for u in 2..5 {
            for a in ["act1", "act2"] {
                add(format!("{bp}.{u}.{a}.alpha"), &[cout], 0, 0.0);
                add(format!("{bp}.{u}.{a}.beta"), &[cout], 0, 0.0);
            }
            add(
                format!("{bp}.{u}.conv1.conv.weight"),
                &[cout, cout, 7],
                cout * 7,
                0.0,
            );
            add(format!("{bp}.{u}.conv1.conv.bias"), &[cout], 0, 0.0);
            add(
                format!("{bp}.{u}.conv2.conv.weight"),
                &[cout, cout, 1],
                cout,
                0.0,
            );
            add(format!("{bp}.{u}.conv2.conv.bias"), &[cout], 0, 0.0);
        }
    }
    add(format!("{p}.decoder.5.alpha"), &[96], 0, 0.0);
    add(format!("{p}.decoder.5.beta"), &[96], 0, 0.0);
    add(format!("{p}.decoder.6.conv.weight"), &[1, 96, 7], 672, 0.0);
    add(format!("{p}.decoder.6.conv.bias"), &[1], 0, 0.0);
    let params: usize = t.values().map(|x| x.elem_count()).sum();
    println!("decoder parameters: {:.1} M", params as f64 / 1e6);
    candle_core::safetensors::save(&t, st.join("model.safetensors")).unwrap();
    drop(t);

    // CODE2WAV_SPEED_F64=1: f64 compute (shows that streamed == whole up to f32 output rounding
    // even at full size, where random weights amplify f32 noise strongly).
    let f64_mode = std::env::var_os("CODE2WAV_SPEED_F64").is_some();
    let dtype = if f64_mode { DType::F64 } else { DType::F32 };
    let m = Code2Wav::load_with_dtype(&dir, &dev, dtype).unwrap();
    let frames = if f64_mode { 80 } else { 100 };
    let secs = frames as f64 * 0.08;
    let codes = random_codes(frames, 9);
    let t0 = std::time::Instant::now();
    let whole = m.decode(&codes).unwrap();
    let dt = t0.elapsed().as_secs_f64();
    let clip = whole.iter().filter(|v| v.abs() >= 1.0).count() as f64 / whole.len() as f64;
    println!(
        "{dtype:?} whole decode, {frames} frames ({secs:.1} s audio): {dt:.2} s, RTF {:.3}; rms {:.3}, clipped {:.1} %",
        dt / secs,
        rms(&whole),
        clip * 100.0
    );
    let chunks: &[usize] = if f64_mode { &[25] } else { &[1, 10, 25] };
    for &chunk in chunks {
        let mut s = m.stream();
        let t0 = std::time::Instant::now();
        let mut out = Vec::new();
        for c in codes.chunks(chunk) {
            out.extend(s.decode_chunk(c).unwrap());
        }
        let dt = t0.elapsed().as_secs_f64();
        println!(
            "stream, chunk {chunk:>2}: {:.1} ms/frame, RTF {:.3}, max abs diff vs whole {:.2e}",
            dt * 1000.0 / frames as f64,
            dt / secs,
            max_abs(&out, &whole)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Batched against separate passes on the tiny fixture and the bundled voice: `b` streams past
/// the window decode 2 chunks of 25 frames each (steady state), and `b` fresh streams their first
/// 1-frame chunk, once with one `decode_chunks` call per chunk round and once with `b`
/// `decode_chunk` calls; interleaved, best of 3. Only the ratios within one run mean anything.
/// Run: `cargo test --release --test code2wav batched_decode_speed -- --ignored --nocapture`
#[test]
#[ignore]
fn batched_decode_speed() {
    let voice = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en");
    for (label, dir) in [("tiny", fixture("tiny-customvoice")), ("bundled", voice)] {
        let m = Code2Wav::load(&dir, &Device::Cpu).unwrap();
        let nq = m.num_quantizers();
        let codes: Vec<Vec<Vec<u32>>> = (0..8)
            .map(|s| {
                random_codes(150, 50 + s)
                    .into_iter()
                    .map(|f| f[..nq].to_vec())
                    .collect()
            })
            .collect();
        let primed: Vec<_> = codes
            .iter()
            .map(|c| {
                let mut st = m.stream();
                st.decode_chunk(&c[..100]).unwrap();
                st
            })
            .collect();
        for b in [1usize, 2, 4, 8] {
            for (case, start, chunk, rounds) in [("steady 25", 100, 25, 2), ("first 1", 0, 1, 1)] {
                let fresh = || -> Vec<_> {
                    match start {
                        0 => (0..b).map(|_| m.stream()).collect(),
                        _ => primed[..b].to_vec(),
                    }
                };
                let chunk_of = |s: usize, r: usize| {
                    let from = start + r * chunk;
                    &codes[s][from..from + chunk]
                };
                let batched = |streams: &mut Vec<Code2WavStream<'_>>| {
                    for r in 0..rounds {
                        let mut batch: Vec<_> = streams.iter_mut().collect();
                        let chunks: Vec<_> = (0..b).map(|s| chunk_of(s, r)).collect();
                        for res in m.decode_chunks(&mut batch, &chunks) {
                            res.unwrap();
                        }
                    }
                };
                let (mut best_batched, mut best_separate) = (f64::MAX, f64::MAX);
                for _ in 0..3 {
                    let mut streams = fresh();
                    let t = std::time::Instant::now();
                    batched(&mut streams);
                    best_batched = best_batched.min(t.elapsed().as_secs_f64());
                    let mut streams = fresh();
                    let t = std::time::Instant::now();
                    for r in 0..rounds {
                        for (s, st) in streams.iter_mut().enumerate() {
                            st.decode_chunk(chunk_of(s, r)).unwrap();
                        }
                    }
                    best_separate = best_separate.min(t.elapsed().as_secs_f64());
                }
                let frames = (b * rounds * chunk) as f64;
                println!(
                    "{label:>7}, {b} streams, {case}: batched {:.2} ms/frame, separate {:.2} \
                     ms/frame, separate / batched {:.2}",
                    best_batched * 1e3 / frames,
                    best_separate * 1e3 / frames,
                    best_separate / best_batched
                );
            }
        }
    }
}

/// The bf16 decoder (a CUDA choice; here on the CPU, where candle runs the same operations) on
/// the bundled voice's trained decoder: same number of f32 samples, streamed equal to whole within
/// its own rounding, and a signal-to-noise ratio against the f32 decoder above a floor (34.3 dB
/// measured on these codes; docs/cuda.md "Code2Wav in reduced precision" has the real shapes').
#[test]
fn bf16_decoder_stays_near_f32_on_the_bundled_voice() {
    fn snr_db(reference: &[f32], x: &[f32]) -> f64 {
        let signal: f64 = reference.iter().map(|&v| (v as f64).powi(2)).sum();
        let noise: f64 = reference
            .iter()
            .zip(x)
            .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
            .sum();
        10.0 * (signal / noise.max(1e-30)).log10()
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en");
    let f32_model = Code2Wav::load(&dir, &Device::Cpu).expect("f32 load");
    let bf16_model = Code2Wav::load_with_dtype(&dir, &Device::Cpu, DType::BF16).expect("bf16 load");
    let codes = random_codes(24, 7);
    let want = f32_model.decode(&codes).expect("f32 decode");
    let whole = bf16_model.decode(&codes).expect("bf16 decode");
    assert_eq!(whole.len(), want.len());
    let snr = snr_db(&want, &whole);
    assert!(snr > 30.0, "bf16 vs f32 SNR {snr:.1} dB");
    let mut stream = bf16_model.stream();
    let mut streamed = Vec::new();
    for part in codes.chunks(5) {
        streamed.extend(stream.decode_chunk(part).expect("bf16 chunk"));
    }
    let boundary_snr = snr_db(&whole, &streamed);
    assert!(
        boundary_snr > 60.0,
        "bf16 streamed vs whole SNR {boundary_snr:.1} dB"
    );
}
