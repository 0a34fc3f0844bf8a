//! Code2Wav (stage 1) alone: throughput of batched passes and the deviation of the reduced-precision
//! decoders from f32, side by side in one process (docs/cuda.md, "Code2Wav in reduced precision").
//!
//! For each precision (`f32`: exact; `tf32`: f32 with candle's TF32 switch for matrix products;
//! `bf16`: bf16 weights and activations) and each row count N: N streams decode one 25-frame chunk
//! each in one `decode_chunks` call (a warm-up round, then `--rounds` timed rounds continuing the
//! streams); the best round gives ms a frame and audio-s/s. Accuracy, per precision: 4 streams of
//! `--accuracy-frames` pseudo-random frames decoded whole in f32 are the reference; each precision
//! decodes them whole (SNR against f32) and streamed in ramped chunks 1, 1, 2, 4, 8, 16, 25, …, batched
//! with the other streams (SNR of streamed against its own whole decode: are chunk boundaries
//! inaudible?).
//!
//! ```sh
//! cargo run --release --features cuda --example bench_code2wav -- --model-dir CKPT --device cuda:0
//! ```
//! `OMNITTS_DECODER_KERNELS=0` runs the decoder without its CUDA kernels (the A/B of those).
//!
//! `--first-frame` adds, per precision, a fresh stream's one-frame first chunk eager and on its
//! CUDA graph side by side ([`Code2Wav::enable_first_frame_graph`]): the time of each (p50 of
//! `--first-frame-repeats`, audio read back), the graph's samples against the eager ones, and the
//! accuracy streams decoded on the ramp with the graph against the whole decode.

#[path = "common/cuda_profiler.rs"]
mod cuda_profiler;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::DType;
use clap::Parser;
use gstomnitts::engine::{ChunkPolicy, ChunkRamp, DeviceSpec};
use gstomnitts::models::qwen3_tts::code2wav::Code2Wav;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "Code2Wav alone: batched throughput and reduced-precision deviation")]
struct Args {
    /// Checkpoint directory (reads speech_tokenizer/).
    #[arg(long)]
    model_dir: PathBuf,
    /// cuda:N or cpu.
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Precisions, comma separated: f32, tf32, bf16.
    #[arg(long, default_value = "f32,tf32,bf16", value_delimiter = ',')]
    precisions: Vec<String>,
    /// Streams per timed pass, comma separated.
    #[arg(long, default_value = "1,16,64", value_delimiter = ',')]
    rows: Vec<usize>,
    /// Frames per stream per timed pass.
    #[arg(long, default_value_t = 25)]
    frames: usize,
    /// Timed rounds per row count (after one warm-up round); the best is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Frames of each accuracy stream.
    #[arg(long, default_value_t = 100)]
    accuracy_frames: usize,
    /// Mark the timed rounds as the profiled range (cuProfilerStart / cuProfilerStop), for
    /// `ncu --profile-from-start off`: the warm-up and accuracy decodes stay out of the profile.
    #[arg(long)]
    profile: bool,
    /// Also time and check a fresh stream's one-frame first chunk, eager and on its graph.
    #[arg(long)]
    first_frame: bool,
    /// Decodes of the first frame timed per variant.
    #[arg(long, default_value_t = 50)]
    first_frame_repeats: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Starts (`true`) or stops the CUDA profiler's range when `--profile` is given.
fn profiler(args: &Args, on: bool) {
    if args.profile {
        cuda_profiler::profiler_range(on);
    }
}

/// Deterministic pseudo-random codes (xorshift): `frames × quantizers` ids below `size`.
fn codes(frames: usize, quantizers: usize, size: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..frames)
        .map(|_| {
            (0..quantizers)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % size as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// Signal-to-noise ratio of `x` against `reference`, in dB.
fn snr_db(reference: &[f32], x: &[f32]) -> f64 {
    let signal: f64 = reference.iter().map(|&v| (v as f64).powi(2)).sum();
    let noise: f64 = reference
        .iter()
        .zip(x)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    10.0 * (signal / noise.max(1e-30)).log10()
}

/// The ramped chunk sizes of the engine's default schedule (1, 1, 2, 4, 8, 16, then 25) covering
/// `frames`.
fn ramp(frames: usize) -> Vec<usize> {
    let policy = ChunkPolicy::Streaming {
        initial: 1,
        chunk: 25,
        ramp: ChunkRamp::Total,
    };
    let mut done = 0;
    policy
        .boundaries()
        .map_while(|b| {
            let end = b.min(frames);
            let n = end.checked_sub(done).filter(|&n| n > 0)?;
            done = end;
            Some(n)
        })
        .collect()
}

/// Timed batched passes: for each row count, (rows, best ms, ms a frame, audio-s/s).
fn throughput(c2w: &Code2Wav, args: &Args) -> Result<Vec<serde_json::Value>> {
    let (nq, cb) = (c2w.num_quantizers(), c2w.codebook_size());
    let seconds_per_frame = c2w.samples_per_frame() as f64 / c2w.sample_rate() as f64;
    let mut out = Vec::new();
    for &rows in &args.rows {
        let chunks: Vec<Vec<Vec<u32>>> = (0..rows)
            .map(|i| codes(args.frames, nq, cb, 1000 + i as u64))
            .collect();
        let refs: Vec<&[Vec<u32>]> = chunks.iter().map(Vec::as_slice).collect();
        let mut streams: Vec<_> = (0..rows).map(|_| c2w.stream()).collect();
        let mut times = Vec::new();
        for round in 0..=args.rounds {
            let mut s: Vec<_> = streams.iter_mut().collect();
            profiler(args, round == 1);
            let t = Instant::now();
            for r in c2w.decode_chunks(&mut s, &refs) {
                r.context("decode_chunks")?;
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            profiler(args, false);
        }
        let best = times[1..].iter().copied().fold(f64::INFINITY, f64::min);
        let frames = (rows * args.frames) as f64;
        let audio_s_per_s = frames * seconds_per_frame / (best / 1e3);
        println!(
            "  {rows:>3} streams x {} frames: {best:8.1} ms ({:.3} ms a frame, {audio_s_per_s:.0} audio-s/s)",
            args.frames,
            best / frames
        );
        out.push(
            json!({"rows": rows, "ms": best, "ms_per_frame": best / frames,
                        "audio_s_per_s": audio_s_per_s}),
        );
    }
    Ok(out)
}

/// Per stream: its samples.
type Waves = Vec<Vec<f32>>;

/// The accuracy streams decoded whole, and streamed in ramped chunks batched together.
fn decode_both(c2w: &Code2Wav, inputs: &[Vec<Vec<u32>>]) -> Result<(Waves, Waves)> {
    let whole = inputs
        .iter()
        .map(|c| c2w.decode(c).context("whole decode"))
        .collect::<Result<Vec<_>>>()?;
    let mut streams: Vec<_> = inputs.iter().map(|_| c2w.stream()).collect();
    let mut streamed = vec![Vec::new(); inputs.len()];
    let mut at = 0;
    for n in ramp(inputs[0].len()) {
        let parts: Vec<&[Vec<u32>]> = inputs.iter().map(|c| &c[at..at + n]).collect();
        let mut s: Vec<_> = streams.iter_mut().collect();
        for (i, r) in c2w.decode_chunks(&mut s, &parts).into_iter().enumerate() {
            streamed[i].extend(r.context("streamed decode")?);
        }
        at += n;
    }
    Ok((whole, streamed))
}

/// The largest absolute difference between `a` and `b` (∞ when their lengths differ).
fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `--first-frame`: a fresh stream's one-frame first chunk on `eager` and on `graphed` (the same
/// checkpoint and dtype, its first-frame graph captured) side by side; `whole` are the accuracy
/// streams decoded whole on `eager`.
fn first_frame(
    eager: &Code2Wav,
    graphed: &Code2Wav,
    inputs: &[Vec<Vec<u32>>],
    whole: &[Vec<f32>],
    repeats: usize,
) -> Result<serde_json::Value> {
    let time = |c2w: &Code2Wav| -> Result<(f64, Vec<f32>)> {
        let mut ms = Vec::with_capacity(repeats);
        let mut wav = Vec::new();
        for i in 0..repeats.max(1) + 3 {
            let frame = &inputs[i % inputs.len()][..1];
            let t = Instant::now();
            let w = c2w.stream().decode_chunk(frame).context("first frame")?;
            if i >= 3 {
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
            if i % inputs.len() == 0 {
                wav = w;
            }
        }
        ms.sort_by(f64::total_cmp);
        Ok((ms[ms.len() / 2], wav))
    };
    let (eager_ms, eager_wav) = time(eager)?;
    let (graph_ms, graph_wav) = time(graphed)?;
    let diff = max_abs(&eager_wav, &graph_wav);
    let (_, streamed) = decode_both(graphed, inputs)?;
    let boundaries = (0..inputs.len())
        .map(|i| snr_db(&whole[i], &streamed[i]))
        .fold(f64::INFINITY, f64::min);
    println!(
        "  first frame from a fresh state, p50 of {repeats}: eager {eager_ms:.2} ms, graph {graph_ms:.2} ms \
         ({:.1}x); graph vs eager max abs diff {diff:e}; streamed with the graph vs whole: {boundaries:.1} dB",
        eager_ms / graph_ms
    );
    Ok(
        json!({"eager_ms_p50": eager_ms, "graph_ms_p50": graph_ms, "graph_vs_eager_max_abs": diff,
              "snr_streamed_with_graph_vs_whole_db": boundaries}),
    )
}

fn main() -> Result<()> {
    let args = Args::parse();
    let spec: DeviceSpec = args.device.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let dev = spec.open()?;
    let probe = Code2Wav::load(&args.model_dir, &dev)?;
    let (nq, cb) = (probe.num_quantizers(), probe.codebook_size());
    let inputs: Vec<Vec<Vec<u32>>> = (0..4)
        .map(|i| codes(args.accuracy_frames, nq, cb, 77 + i))
        .collect();
    let (reference, _) = decode_both(&probe, &inputs)?;
    drop(probe);
    let mut results = Vec::new();
    for p in &args.precisions {
        let (dtype, tf32) = match p.as_str() {
            "f32" => (DType::F32, false),
            "tf32" => (DType::F32, true),
            "bf16" => (DType::BF16, false),
            other => bail!("unknown precision {other} (f32, tf32, bf16)"),
        };
        #[cfg(feature = "cuda")]
        candle_core::cuda::set_gemm_reduced_precision_f32(tf32);
        #[cfg(not(feature = "cuda"))]
        if tf32 {
            bail!("tf32 needs a CUDA build");
        }
        let c2w = Code2Wav::load_with_dtype(&args.model_dir, &dev, dtype)?;
        println!("Code2Wav {p} on {}:", args.device);
        let timing = throughput(&c2w, &args)?;
        let (whole, streamed) = decode_both(&c2w, &inputs)?;
        let vs_f32 = (0..inputs.len())
            .map(|i| snr_db(&reference[i], &whole[i]))
            .fold(f64::INFINITY, f64::min);
        let boundaries = (0..inputs.len())
            .map(|i| snr_db(&whole[i], &streamed[i]))
            .fold(f64::INFINITY, f64::min);
        println!(
            "  SNR against f32 (whole, worst of 4 streams): {vs_f32:.1} dB; streamed vs whole: {boundaries:.1} dB"
        );
        let first = if args.first_frame {
            let mut graphed = Code2Wav::load_with_dtype(&args.model_dir, &dev, dtype)?;
            graphed
                .enable_first_frame_graph()
                .context("capturing the first-frame graph")?;
            Some(first_frame(
                &c2w,
                &graphed,
                &inputs,
                &whole,
                args.first_frame_repeats,
            )?)
        } else {
            None
        };
        results.push(
            json!({"precision": p, "timing": timing, "snr_vs_f32_db": vs_f32,
                            "snr_streamed_vs_whole_db": boundaries, "first_frame": first}),
        );
    }
    #[cfg(feature = "cuda")]
    candle_core::cuda::set_gemm_reduced_precision_f32(false);
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({"results": results}))?,
        )?;
    }
    Ok(())
}
