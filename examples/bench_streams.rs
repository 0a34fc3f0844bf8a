//! Many streams on one model: N requests started together, on one shared engine (stage 0 and
//! stage 1 batch them) against N engines of their own (one stream each, as every element had
//! before the shared engine), side by side in one run.
//!
//! ```sh
//! cargo run --release --example bench_streams -- --model-dir models/omnitts-en --streams 1,2,4,8,16
//! cargo run --release --example bench_streams -- --model-dir tests/fixtures/tiny-customvoice
//! ```
//!
//! Every stream asks for the same number of frames (`--frames`; greedy, runaway guard off,
//! `max_new_tokens = frames + 1`, each stream its own seed and text so the batch is not N copies
//! of one row; a stream that ends early by EOS is reported with the frames it made). For each N
//! it prints: aggregate audio-seconds per second of wall time (all audio / time from the first
//! submit to the last `Finished`), per-stream real-time factor (wall time of the stream / its
//! audio; median and worst), the time to stage 0's first frame (p50, from the codes tap) and to
//! first audio (p50 / p95), the mean batch of stage 0, where the
//! time goes (median over the streams of stage 0's ms per frame, which in a batch is the time of a
//! step of the whole batch, and of stage 1's decode ms per frame), and the shared / separate ratio
//! of the aggregate. JSON on stdout's last line (also `--json PATH`).
//!
//! On a GPU (`--device cuda:0 --shared-only`; N separate copies of a large model do not fit) the
//! closed-loop rows also report TTFA p99. `--rates 5,10,20,40` adds open-loop runs: requests
//! arriving at R per second for `--duration` seconds (Poisson, fixed seed) on one engine batching
//! up to `--max-batch` streams: TTFA p50 / p95 / p99, per-stream RTF (processing time / audio:
//! below 1 is faster than real time) worst and p95, how many streams stayed faster than real
//! time, and how many requests admission refused.

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use clap::Parser;
use gstomnitts::engine::{
    DeviceSpec, Engine, EngineOptions, EngineRequest, Metrics, SharedEngine, StageConfig,
};
use gstomnitts::models::qwen3_tts::VoiceRequest;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "omnitts: N streams on one shared engine against N separate engines")]
struct Args {
    /// Checkpoint directory.
    #[arg(long, default_value = "models/omnitts-en")]
    model_dir: PathBuf,
    /// Stream counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    streams: Vec<usize>,
    /// Frames per stream (80 ms each).
    #[arg(long, default_value_t = 50)]
    frames: usize,
    /// Device of both stages: cpu | cuda:N | auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Skip the N-separate-engines runs.
    #[arg(long)]
    shared_only: bool,
    /// Open-loop arrival rates (requests per second), comma separated; none by default.
    #[arg(long, value_delimiter = ',')]
    rates: Vec<f64>,
    /// Seconds of arrivals per open-loop rate.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    /// The open-loop engine's `max_num_seqs` (streams batched at once).
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Write the JSON report here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

const TEXTS: [&str; 8] = [
    "The morning train was late again, so we walked to the station together.",
    "Please put the kettle on and bring two cups to the table by the window.",
    "A light rain fell over the harbour while the boats came slowly home.",
    "She opened the letter, read it twice, and then smiled at the garden.",
    "Turn left at the old mill, and the farm is the second house on the right.",
    "The meeting starts at nine, but the coffee is ready a little before.",
    "He painted the fence blue because his daughter asked him to.",
    "We listened to the wind in the trees until the fire burned low.",
];

/// One stream's result.
struct Stream {
    metrics: Metrics,
    /// Submit → stage 0's first frame (its codes, from the codes tap), ms: the part of the time to
    /// first audio before stage 1.
    first_frame_ms: f64,
    /// Submit of the first stream of the run → this stream's `Finished`, s.
    end_s: f64,
}

fn request(engine: &Engine, i: usize, frames: usize) -> EngineRequest {
    let mut voice = VoiceRequest {
        text: TEXTS[i % TEXTS.len()].to_string(),
        ..Default::default()
    };
    voice.speaker = engine.speakers().first().cloned();
    let mut s = engine.default_sampling_params().greedy();
    s.max_new_tokens = frames + 1;
    s.seed = i as u64 + 1;
    EngineRequest::new(voice, s)
}

fn config(n: usize) -> StageConfig {
    let mut c = StageConfig::default_async();
    c.ar.guard.enabled = false;
    c.ar.max_num_seqs = n.max(1);
    c.decoder.max_num_seqs = n.max(1);
    c
}

fn load(args: &Args, n: usize) -> Result<Engine> {
    let device: DeviceSpec = args.device.parse()?;
    let t = Instant::now();
    let e = Engine::load(EngineOptions {
        model_dir: args.model_dir.clone(),
        stage_config: config(n),
        ar_device: device,
        decoder_device: device,
    })
    .with_context(|| format!("loading {}", args.model_dir.display()))?;
    eprintln!(
        "engine for {n} streams loaded in {:.1} s; CUDA graphs {:?}, batched {:?}",
        t.elapsed().as_secs_f64(),
        e.cuda_graphs(),
        e.batch_graphs()
    );
    Ok(e)
}

/// Runs `n` streams at once, stream `i` on `engines[i % engines.len()]`.
fn run_streams(engines: &[SharedEngine], n: usize, frames: usize) -> Result<Vec<Stream>> {
    let t0 = Instant::now();
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let e = &engines[i % engines.len()];
            let submitted = Instant::now();
            e.submit_tapped(request(e, i, frames))
                .map(|(h, codes)| (h, codes, submitted))
                .map_err(anyhow::Error::from)
        })
        .collect::<Result<_, _>>()?;
    thread::scope(|s| {
        let joins: Vec<_> = handles
            .into_iter()
            .map(|(h, codes, submitted)| {
                s.spawn(move || -> Result<Stream> {
                    // The first frame's codes arrive before the request finishes (the tap is
                    // unbounded, so waiting here holds nothing up).
                    let first_frame_ms = codes
                        .recv()
                        .map_or(f64::NAN, |_| submitted.elapsed().as_secs_f64() * 1e3);
                    let (_, _, metrics) = h.collect()?;
                    drop(codes);
                    Ok(Stream {
                        metrics,
                        first_frame_ms,
                        end_s: t0.elapsed().as_secs_f64(),
                    })
                })
            })
            .collect();
        join_all(joins)
    })
}

/// Joins the stream threads, in order; a panicked thread is an error.
fn join_all<T>(joins: Vec<thread::ScopedJoinHandle<'_, Result<T>>>) -> Result<Vec<T>> {
    joins
        .into_iter()
        .map(|j| {
            j.join()
                .map_err(|_| anyhow::anyhow!("stream thread panicked"))?
        })
        .collect()
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let k = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[k.min(v.len() - 1)]
}

fn summary(label: &str, n: usize, streams: &[Stream], mean_batch: f64) -> Value {
    let audio_s: f64 = streams.iter().map(|s| s.metrics.audio_ms / 1e3).sum();
    let wall_s = streams.iter().map(|s| s.end_s).fold(0.0, f64::max);
    let rtf: Vec<f64> = streams.iter().map(|s| s.metrics.rtf).collect();
    let ttfa: Vec<f64> = streams
        .iter()
        .map(|s| s.metrics.ttfa_ms.unwrap_or(f64::NAN))
        .collect();
    let frames: Vec<f64> = streams.iter().map(|s| s.metrics.frames as f64).collect();
    let queue: Vec<f64> = streams.iter().map(|s| s.metrics.queue_ms).collect();
    let first_frame: Vec<f64> = streams.iter().map(|s| s.first_frame_ms).collect();
    let prefill: Vec<f64> = streams.iter().map(|s| s.metrics.ar_prefill_ms).collect();
    let ar: Vec<f64> = streams.iter().map(|s| s.metrics.ar_ms_per_frame).collect();
    let dec: Vec<f64> = streams
        .iter()
        .map(|s| s.metrics.decoder_ms_per_frame)
        .collect();
    json!({
        "engines": label, "streams": n,
        "aggregate_audio_s_per_s": audio_s / wall_s,
        "audio_s": audio_s, "wall_s": wall_s,
        "rtf_p50": percentile(rtf.clone(), 50.0), "rtf_max": percentile(rtf, 100.0),
        "ttfa_ms_p50": percentile(ttfa.clone(), 50.0), "ttfa_ms_p95": percentile(ttfa.clone(), 95.0),
        "ttfa_ms_p99": percentile(ttfa, 99.0),
        "frames_min": percentile(frames, 0.0),
        "queue_ms_p50": percentile(queue, 50.0), "prefill_ms_p50": percentile(prefill, 50.0),
        "first_frame_ms_p50": percentile(first_frame, 50.0),
        "mean_batch_stage0": mean_batch,
        "ar_ms_per_step_p50": percentile(ar, 50.0),
        "decoder_ms_per_frame_p50": percentile(dec, 50.0),
    })
}

/// Requests arriving at `rate` per second for `duration_s` (exponential gaps from a fixed seed)
/// on `engine`; each collected on its own thread. Returns the finished streams' metrics and the
/// number of requests admission refused.
fn open_loop(
    engine: &SharedEngine,
    rate: f64,
    duration_s: f64,
    frames: usize,
) -> Result<(Vec<Metrics>, usize, f64)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(2026);
    let mut at = 0.0;
    let mut arrivals = Vec::new();
    loop {
        let u: f64 = rng.random();
        at += -(1.0 - u).ln() / rate;
        if at >= duration_s {
            break;
        }
        arrivals.push(at);
    }
    let t0 = Instant::now();
    let mut refused = 0;
    let metrics = thread::scope(|s| -> Result<Vec<Metrics>> {
        let mut joins = Vec::new();
        for (i, &at) in arrivals.iter().enumerate() {
            let wait = at - t0.elapsed().as_secs_f64();
            if wait > 0.0 {
                thread::sleep(Duration::from_secs_f64(wait));
            }
            match engine.submit(request(engine, i, frames)) {
                Ok(h) => joins.push(
                    s.spawn(move || h.collect().map(|(_, _, m)| m).map_err(anyhow::Error::from)),
                ),
                Err(gstomnitts::engine::EngineError::Busy { .. }) => refused += 1,
                Err(e) => return Err(e.into()),
            }
        }
        join_all(joins)
    })?;
    Ok((metrics, refused, t0.elapsed().as_secs_f64()))
}

fn open_loop_summary(rate: f64, metrics: &[Metrics], refused: usize, wall_s: f64) -> Value {
    let ttfa: Vec<f64> = metrics.iter().filter_map(|m| m.ttfa_ms).collect();
    let rtf: Vec<f64> = metrics.iter().map(|m| m.rtf).collect();
    let audio_s: f64 = metrics.iter().map(|m| m.audio_ms / 1e3).sum();
    let queue: Vec<f64> = metrics.iter().map(|m| m.queue_ms).collect();
    let prefill: Vec<f64> = metrics.iter().map(|m| m.ar_prefill_ms).collect();
    json!({
        "queue_ms_p50": percentile(queue, 50.0), "prefill_ms_p50": percentile(prefill, 50.0),
        "rate_per_s": rate, "finished": metrics.len(), "refused": refused,
        "faster_than_real_time": rtf.iter().filter(|&&r| r > 0.0 && r < 1.0).count(),
        "ttfa_ms_p50": percentile(ttfa.clone(), 50.0), "ttfa_ms_p95": percentile(ttfa.clone(), 95.0),
        "ttfa_ms_p99": percentile(ttfa, 99.0),
        "rtf_p95": percentile(rtf.clone(), 95.0), "rtf_max": percentile(rtf, 100.0),
        "aggregate_audio_s_per_s": audio_s / wall_s, "wall_s": wall_s,
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        !args.streams.is_empty() || !args.rates.is_empty(),
        "--streams and --rates are both empty"
    );
    let mut rows = Vec::new();
    println!(
        "{:>8} {:>3} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6} {:>8} {:>8} {:>7}",
        "engines",
        "N",
        "audio-s/s",
        "RTF p50",
        "RTF max",
        "1st frame",
        "TTFA p50",
        "TTFA p95",
        "batch",
        "AR ms",
        "dec ms",
        "ratio"
    );
    for &n in &args.streams {
        let shared = SharedEngine::unshared(load(&args, n)?);
        // Warm-up: one short stream (first-touch allocations, thread pools).
        run_streams(std::slice::from_ref(&shared), 1, 4)?;
        let before = shared.batch_stats()[0];
        let streams = run_streams(std::slice::from_ref(&shared), n, args.frames)?;
        let after = shared.batch_stats()[0];
        let mean_batch =
            (after.rows - before.rows) as f64 / (after.steps - before.steps).max(1) as f64;
        let s = summary("shared", n, &streams, mean_batch);
        drop(shared);
        let sep = if args.shared_only {
            None
        } else {
            let engines: Vec<SharedEngine> = (0..n)
                .map(|_| load(&args, 1).map(SharedEngine::unshared))
                .collect::<Result<_>>()?;
            run_streams(&engines[..1], 1, 4)?;
            let streams = run_streams(&engines, n, args.frames)?;
            Some(summary("separate", n, &streams, 1.0))
        };
        let agg = |v: &Value| v["aggregate_audio_s_per_s"].as_f64().unwrap_or(f64::NAN);
        let ratio = sep.as_ref().map(|p| agg(&s) / agg(p));
        for (row, r) in [(Some(&s), ratio), (sep.as_ref(), None)] {
            let Some(row) = row else { continue };
            let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:>8} {:>3} {:>10.2} {:>8.3} {:>8.3} {:>9.1} {:>9.1} {:>9.1} {:>6.2} {:>8.2} {:>8.2} {:>7}",
                row["engines"].as_str().unwrap_or("?"),
                n,
                f("aggregate_audio_s_per_s"),
                f("rtf_p50"),
                f("rtf_max"),
                f("first_frame_ms_p50"),
                f("ttfa_ms_p50"),
                f("ttfa_ms_p95"),
                f("mean_batch_stage0"),
                f("ar_ms_per_step_p50"),
                f("decoder_ms_per_frame_p50"),
                r.map(|r| format!("{r:.2}x")).unwrap_or_default()
            );
        }
        rows.push(json!({ "n": n, "shared": s, "separate": sep, "shared_over_separate": ratio }));
    }
    let mut open = Vec::new();
    if !args.rates.is_empty() {
        let shared = SharedEngine::unshared(load(&args, args.max_batch)?);
        run_streams(std::slice::from_ref(&shared), 1, 4)?;
        println!(
            "{:>6} {:>8} {:>7} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10} {:>10}",
            "rate/s",
            "finished",
            "refused",
            "TTFA p50",
            "TTFA p95",
            "TTFA p99",
            "RTF p95",
            "RTF max",
            "real time",
            "audio-s/s"
        );
        for &rate in &args.rates {
            ensure!(rate > 0.0, "--rates: {rate} is not a rate");
            let (metrics, refused, wall_s) = open_loop(&shared, rate, args.duration, args.frames)?;
            let row = open_loop_summary(rate, &metrics, refused, wall_s);
            let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:>6.1} {:>8} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>8.3} {:>8.3} {:>6}/{:<3} {:>10.2}",
                rate,
                metrics.len(),
                refused,
                f("ttfa_ms_p50"),
                f("ttfa_ms_p95"),
                f("ttfa_ms_p99"),
                f("rtf_p95"),
                f("rtf_max"),
                row["faster_than_real_time"],
                metrics.len(),
                f("aggregate_audio_s_per_s")
            );
            open.push(row);
        }
    }
    let report = json!({
        "model_dir": args.model_dir, "device": args.device, "frames": args.frames,
        "threads": std::env::var("RAYON_NUM_THREADS").ok(), "rows": rows,
        "open_loop": open, "max_batch": args.max_batch,
    });
    println!("{report}");
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
