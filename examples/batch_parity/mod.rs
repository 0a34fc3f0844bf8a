//! `gpu_parity --batch-parity DIR`: batched frames against solo streams on one device.
//!
//! DIR is a CustomVoice checkpoint whose attention heads the fused kernels take (head width a
//! multiple of 64: the random checkpoints of the real shapes that `bench_gpu --build-only`
//! writes; the tiny fixtures' 16-wide heads run the unfused ops and have no batched graphs).
//! For each batch size B (1 … 64, every bucket and the sizes around each bucket edge), B streams
//! with prompts of different lengths, each its own seed and
//! `max_new_tokens` (so they leave at different frames), joining at staggered frames (so the
//! batch grows and shrinks while streams join and leave), are stepped with
//! `ArModel::next_frames` (the streams that join at one frame prefilled together with
//! `ArModel::prefill_steps`, whole prompts of one length class in one batched pass):
//! - on a model with the batched frame graphs (`enable_cuda_graphs` + `enable_batch_graphs(64)`),
//! - on the same model kind eagerly (no graphs: the batched eager path),
//!
//! and each stream's codes are compared with the stream run alone (`next_frame` with the
//! one-stream graphs), and so are the talker's codec-head logits after the stream's first frame
//! (its first batched step): max |difference| relative to max |logit|. The batched matmuls are
//! GEMMs where the solo step runs one-row GEMV kernels, so values differ by float rounding, and a
//! greedy code can flip where two logits tie within it (then the stream differs from that frame
//! on). The exit status: every f32 greedy stream's logits within 1e-3 relative of its solo run
//! (a wrong row, position or cache gives O(1) differences), for graphs and eager; identical codes
//! and the first differing frame are reported for every mode (greedy f32, greedy bf16, sampled
//! f32).
//!
//! Then Code2Wav: 16 streams' chunks of different lengths (two rounds) decoded in shared batched
//! passes (`Code2Wav::decode_chunks`) against each stream decoding alone, on the same device: the
//! largest sample difference relative to the largest |sample| (on CUDA the batched passes fold
//! the rows into one product: within float rounding; must be below 1e-4).

use std::path::Path;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use gstomnitts::models::qwen3_tts::code2wav::Code2Wav;
use gstomnitts::models::qwen3_tts::{
    ArModel, ArSession, ArStep, Checkpoint, SamplingParams, VoiceRequest,
};
use serde_json::{Value, json};

/// The batch sizes checked: every bucket (2, 4, … 64), one below and one above each edge, 1.
const SIZES: [usize; 16] = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64];

const WORDS: [&str; 16] = [
    "the", "morning", "train", "was", "late", "again", "so", "we", "walked", "to", "a", "station",
    "under", "grey", "quiet", "skies",
];

/// Stream `i`'s request: a prompt of 3 … 30 words, the fixture's first speaker.
fn request(ckpt_speaker: Option<&str>, i: usize) -> VoiceRequest {
    let n = 3 + (i * 7) % 28;
    let text: Vec<&str> = (0..n).map(|k| WORDS[(i + k * 3) % WORDS.len()]).collect();
    VoiceRequest {
        text: text.join(" "),
        speaker: ckpt_speaker.map(str::to_string),
        ..Default::default()
    }
}

/// Stream `i`'s sampling: greedy or sampled (seed `i + 1`), 12 … 40 new tokens (the guard's
/// `min_new_tokens` aside, EOS may end it earlier).
fn sampling(base: &SamplingParams, i: usize, sample: bool) -> SamplingParams {
    let mut s = base.clone().greedy();
    if sample {
        s.do_sample = true;
        s.subtalker_do_sample = true;
    }
    s.seed = i as u64 + 1;
    s.max_new_tokens = 12 + (i * 5) % 29;
    s
}

/// The frame at which stream `i` joins the batch.
fn join_at(i: usize) -> usize {
    (i % 6) * 3
}

/// A stream's codes and its logits after its first frame.
type Out = (Vec<Vec<u32>>, Vec<f32>);

fn solo(model: &ArModel, req: &VoiceRequest, sp: &SamplingParams) -> Result<Out> {
    let mut s = model.start(req, sp)?;
    let mut codes = Vec::new();
    let mut first = Vec::new();
    while let ArStep::Frame(c) = s.next_frame()? {
        codes.push(c);
        if codes.len() == 1 {
            first = s.pending_logits().to_vec();
        }
    }
    Ok((codes, first))
}

/// Steps every stream with `next_frames` from its join frame to its end; returns each stream's
/// codes and first-frame logits, and the largest batch seen.
fn batched(model: &ArModel, reqs: &[(VoiceRequest, SamplingParams)]) -> Result<(Vec<Out>, usize)> {
    let n = reqs.len();
    let mut sessions: Vec<Option<ArSession<'_>>> = (0..n).map(|_| None).collect();
    let mut done = vec![false; n];
    let mut out: Vec<Out> = vec![(Vec::new(), Vec::new()); n];
    let mut largest = 0;
    for frame in 0.. {
        // The streams that join at this frame start together, as the engine starts the prompts
        // of one step: whole prompts of one length class in one batched prefill pass.
        let joining: Vec<usize> = (0..n).filter(|&i| join_at(i) == frame).collect();
        let mut pending = joining
            .iter()
            .map(|&i| {
                let (req, sp) = &reqs[i];
                model.begin(req, sp).with_context(|| format!("stream {i}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut steps: Vec<_> = pending.iter_mut().map(|p| (p, usize::MAX)).collect();
        for (&i, done) in joining.iter().zip(model.prefill_steps(&mut steps)) {
            anyhow::ensure!(
                done.with_context(|| format!("stream {i}: prefill"))?,
                "stream {i}: prefill incomplete"
            );
        }
        drop(steps);
        for (i, p) in joining.iter().zip(pending) {
            sessions[*i] = Some(p.into_session().with_context(|| format!("stream {i}"))?);
        }
        if done.iter().all(|&d| d) {
            break;
        }
        let (idx, mut active): (Vec<usize>, Vec<&mut ArSession<'_>>) = sessions
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|s| (i, s)))
            .unzip();
        largest = largest.max(active.len());
        let results = model.next_frames(&mut active);
        drop(active);
        for (i, r) in idx.into_iter().zip(results) {
            match r.with_context(|| format!("stream {i}"))? {
                ArStep::Frame(c) => {
                    out[i].0.push(c);
                    if out[i].0.len() == 1
                        && let Some(s) = &sessions[i]
                    {
                        out[i].1 = s.pending_logits().to_vec();
                    }
                }
                ArStep::Finished(_) => {
                    sessions[i] = None;
                    done[i] = true;
                }
            }
        }
    }
    Ok((out, largest))
}

/// max |a − b| / max |a| (0 for two empty rows, 1 when only one is empty).
fn rel_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return 1.0;
    }
    let scale = a
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    f64::from(d / scale)
}

/// Frames until the first difference (the common length when none).
fn first_diff(a: &[Vec<u32>], b: &[Vec<u32>]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Runs the check on the checkpoint in `dir` for `modes` (f32, bf16, sampled; empty: all); returns whether every f32 greedy stream's logits
/// stayed within rounding of its solo run (graphs and eager), and the report.
pub fn run(dir: &Path, dev: &Device, modes: &[String]) -> Result<(bool, Value)> {
    let ckpt = Checkpoint::open(dir)?;
    let base = SamplingParams::from_generation_config(&ckpt.generation);
    let mut ok = true;
    let mut rows = Vec::new();
    println!(
        "{:<6} {:<8} {:>3} {:>7} {:>12} {:>12} {:>8} {:>10} {:>10}",
        "dtype",
        "mode",
        "B",
        "largest",
        "graphs==solo",
        "eager==solo",
        "1st dif",
        "graph rel",
        "eager rel"
    );
    let all = [
        ("f32", DType::F32, false),
        ("bf16", DType::BF16, false),
        ("sampled", DType::F32, true),
    ];
    for (_, dtype, sample) in all
        .into_iter()
        .filter(|(name, _, _)| modes.is_empty() || modes.iter().any(|m| m == name))
    {
        let mut graphed = ArModel::load(&ckpt, dev, dtype)?;
        graphed.enable_cuda_graphs()?;
        let buckets = graphed.enable_batch_graphs(64)?;
        let eager = ArModel::load(&ckpt, dev, dtype)?;
        let speaker = graphed.speakers().first().cloned();
        for b in SIZES {
            let reqs: Vec<(VoiceRequest, SamplingParams)> = (0..b)
                .map(|i| (request(speaker.as_deref(), i), sampling(&base, i, sample)))
                .collect();
            let solo_codes = reqs
                .iter()
                .map(|(r, s)| solo(&graphed, r, s))
                .collect::<Result<Vec<_>>>()?;
            let (g, largest) = batched(&graphed, &reqs)?;
            let (e, _) = batched(&eager, &reqs)?;
            let same = |x: &[Out]| {
                x.iter()
                    .zip(&solo_codes)
                    .filter(|(a, b)| a.0 == b.0)
                    .count()
            };
            let worst = |x: &[Out]| {
                x.iter()
                    .zip(&solo_codes)
                    .map(|(a, b)| rel_diff(&b.1, &a.1))
                    .fold(0.0, f64::max)
            };
            let (g_same, e_same) = (same(&g), same(&e));
            let (g_rel, e_rel) = (worst(&g), worst(&e));
            let dif = g
                .iter()
                .zip(&solo_codes)
                .filter(|(a, b)| a.0 != b.0)
                .map(|(a, b)| first_diff(&a.0, &b.0))
                .min();
            let mode = if sample { "sampled" } else { "greedy" };
            println!(
                "{:<6} {:<8} {:>3} {:>7} {:>9}/{:<2} {:>9}/{:<2} {:>8} {:>10.2e} {:>10.2e}",
                format!("{dtype:?}"),
                mode,
                b,
                largest,
                g_same,
                b,
                e_same,
                b,
                dif.map_or("-".to_string(), |d| d.to_string()),
                g_rel,
                e_rel
            );
            if dtype == DType::F32 && !sample {
                ok &= g_rel < 1e-3 && e_rel < 1e-3;
            }
            rows.push(json!({
                "dtype": format!("{dtype:?}"), "mode": mode, "batch": b, "largest_batch": largest,
                "graphs_equal_solo": g_same, "eager_equal_solo": e_same, "streams": b,
                "graphs_first_diff_min": dif, "graphs_logits_rel": g_rel, "eager_logits_rel": e_rel,
                "buckets": buckets,
            }));
        }
    }
    let (c2w_rel, c2w_rows) = code2wav_check(dir, dev)?;
    println!(
        "Code2Wav: {c2w_rows} streams batched vs alone, max |diff| / max |sample| = {c2w_rel:.2e}"
    );
    ok &= c2w_rel < 1e-4;
    Ok((
        ok,
        json!({ "batch_parity": rows, "code2wav_batched_rel": c2w_rel, "ok": ok }),
    ))
}

/// Code2Wav's batched passes against each stream alone (two rounds of chunks of 1 … 9 frames).
fn code2wav_check(dir: &Path, dev: &Device) -> Result<(f64, usize)> {
    let c2w = Code2Wav::load(dir, dev)?;
    let n = 16usize;
    let groups = 16usize;
    let code =
        |i: usize, f: usize, q: usize| ((i * 7919 + f * 104_729 + q * 1_299_709) % 2048) as u32;
    let chunk = |i: usize, round: usize| -> Vec<Vec<u32>> {
        let frames = 1 + (i * 3 + round * 5) % 9;
        (0..frames)
            .map(|f| (0..groups).map(|q| code(i, f + round * 100, q)).collect())
            .collect()
    };
    let mut solo = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = c2w.stream();
        let mut audio = s.decode_chunk(&chunk(i, 0))?;
        audio.extend(s.decode_chunk(&chunk(i, 1))?);
        solo.push(audio);
    }
    let mut streams: Vec<_> = (0..n).map(|_| c2w.stream()).collect();
    let mut batched = vec![Vec::new(); n];
    for round in 0..2 {
        let chunks: Vec<Vec<Vec<u32>>> = (0..n).map(|i| chunk(i, round)).collect();
        let refs: Vec<&[Vec<u32>]> = chunks.iter().map(Vec::as_slice).collect();
        let mut s: Vec<_> = streams.iter_mut().collect();
        for (i, r) in c2w.decode_chunks(&mut s, &refs).into_iter().enumerate() {
            batched[i].extend(r?);
        }
    }
    let mut worst = 0f64;
    for (a, b) in solo.iter().zip(&batched) {
        worst = worst.max(rel_diff(a, b));
    }
    // Where stage 1's time goes: one round of 25-frame chunks (the engine's later chunk size) for
    // 1, 16 and 64 streams, after a warm-up round.
    for rows in [1usize, 16, 64] {
        let mut streams: Vec<_> = (0..rows).map(|_| c2w.stream()).collect();
        let chunks: Vec<Vec<Vec<u32>>> = (0..rows)
            .map(|i| {
                (0..25)
                    .map(|f| (0..groups).map(|q| code(i, f, q)).collect())
                    .collect()
            })
            .collect();
        let refs: Vec<&[Vec<u32>]> = chunks.iter().map(Vec::as_slice).collect();
        let mut ms = Vec::new();
        for _ in 0..3 {
            let mut s: Vec<_> = streams.iter_mut().collect();
            let t = std::time::Instant::now();
            for r in c2w.decode_chunks(&mut s, &refs) {
                r?;
            }
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let best = ms[1..].iter().copied().fold(f64::INFINITY, f64::min);
        println!(
            "Code2Wav: {rows} streams x 25 frames in {best:.1} ms ({:.2} ms a frame, {:.0} audio-s/s)",
            best / (rows * 25) as f64,
            (rows * 25) as f64 * 0.08 / (best / 1e3)
        );
    }
    Ok((worst, n))
}
