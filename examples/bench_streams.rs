//! Many streams on one model, two ways.
//!
//! **Closed loop** (`--streams`): N requests started together, on one shared engine (stage 0 and
//! stage 1 batch them) against N engines of their own (one stream each, as every element had
//! before the shared engine), side by side in one run. Every stream asks for the same number of
//! frames (`--frames`; greedy, runaway guard off, `max_new_tokens = frames + 1`, each stream its
//! own seed and text so the batch is not N copies of one row; a stream that ends early by EOS is
//! reported with the frames it made). For each N it prints: aggregate audio-seconds per second
//! of wall time (all audio / time from the first submit to the last `Finished`), per-stream
//! real-time factor (wall time of the stream / its audio; median and worst), the time to stage
//! 0's first frame (p50, from the codes tap) and to first audio (p50 / p95 / p99), the mean batch
//! of stage 0, where the time goes (median over the streams of stage 0's ms per frame, which in
//! a batch is the time of a step of the whole batch, and of stage 1's decode ms per frame), and
//! the shared / separate ratio of the aggregate; under each row, the first audio in parts (p50 /
//! p95): the queue, the prefill, from the prefill's end to the first frame (a prefill budget
//! waited for, the steps before its own; with stage 0's steps from arrival to first frame), and
//! stage 1's part. On a GPU use `--shared-only` (N separate copies of a large model do not fit).
//! `--rounds R` starts the N streams R times on the same engine, each start measured: the first
//! comes after only a one-stream warm-up, the later ones show an engine that has served a burst
//! (the shared / separate ratio is then the last round's).
//!
//! **Open loop** (`--rates`), measured as the serving engines' public benchmark
//! (nari-labs/benchmarks, `tts_bench`) measures them, so that the figures can stand beside
//! theirs. One engine (`--max-batch` streams batched, `--max-waiting` queued; beyond that a
//! request is refused and counted as refused) serves, for each rate and each seed (`--seeds`,
//! default 1,2,3):
//!
//! - Poisson arrivals at the rate, from the seed: a warm-up of `--warmup-s` seconds whose
//!   requests are not counted, then `--duration` seconds whose arrivals are measured; then up to
//!   `--drain-s` seconds for the measured requests to end, after which the rest are cancelled
//!   and counted as timed out (their missing times count as +∞ in the percentiles). The load
//!   generator never drops or delays an arrival: one thread sleeps until each scheduled instant
//!   and submits (the submit call does not block on other requests), one thread per request
//!   follows its events. Every time counts from the request's *scheduled* arrival, so the
//!   generator's own delay (reported as `submit_lag`) is part of it.
//! - Requests like the benchmark's: an English sentence of 10–13 words from a fixed list, picked
//!   by the seeded RNG, with a length drawn uniformly from 30–80 frames (2.4–6.4 s), the
//!   checkpoint's first speaker, and its sampling (`generation_config.json`; `--greedy` for greedy
//!   decoding); every request its own sampling seed from the run's seed. Audio comes in the
//!   stage config's chunks (a first chunk of 1 frame, then each as long as the audio before it
//!   up to 25 frames: 1, 1, 2, 4, 8, 16, 25, …) unless
//!   `--initial-chunk-frames` / `--chunk-frames` say otherwise.
//! - Length (`--fixed-length on|off`): random weights never choose their own end, so with `on`
//!   each request stops after exactly its drawn length (`max_new_tokens = frames + 1`, the engine
//!   loaded with the runaway guard off; a rare chance EOS ends one earlier, counted as
//!   `ended_by_eos`). With `off` the checkpoint ends each sentence itself (EOS, runaway guard, its
//!   `max_new_tokens`). Default: `off` for a checkpoint that ships an `omnitts.json` (omnitts'
//!   trained voices, e.g. models/omnitts-en, which end their sentences), `on` for any other
//!   (the random-weight checkpoints of `bench_gpu --build-only`, the test fixtures).
//!
//! Per request, from the audio it receives (each `EngineEvent::Audio` chunk timed when it
//! arrives), at the sample rate the engine reports: the time to first *audible* audio — an RMS
//! detector (mean removed) over 20 ms windows every 10 ms, audible at ≥ −45 dBFS; the onset is the
//! first of two audible windows in a row, and its time is the arrival of the chunk that holds it
//! — and the time to the first chunk of any audio; the end-to-end time (→ `Finished`); and the
//! underruns of a player without a buffer that starts when the first chunk arrives: chunk k is
//! needed at `t_first + offset_k / sample_rate` (plus the stalls so far); a chunk that arrives later
//! is one underrun, and the timeline then shifts by the wait. The benchmark's own "audible TTFA"
//! is when the onset *plays* on that timeline (its chunk's play start plus the onset's place in
//! the chunk); it is reported too (`ttfa_audible_played_ms`). Percentiles are nearest-rank.
//!
//! Per rate, over all its seeds and per seed: TTFA audible p50 / p95 / p99, first chunk p50 /
//! p95 / p99, underruns (chunks, and requests with at least one; which chunk came late: the
//! second, third, fourth, fifth or a later one, and the longest stall), end-to-end p95, requests
//! finished / refused / timed out, the backlog and, on a CUDA device where `nvidia-smi` runs, the
//! highest GPU memory in use during the run; last, the highest rate whose measured requests all
//! ended by themselves without an underrun or a refusal. The backlog is **bounded** when no
//! measured request was refused or timed out and neither the in-flight count (submitted, not
//! finished) nor the waiting count (submitted, not yet taken by stage 0), sampled every 100 ms over
//! the measured window, grew: the least-squares trend of each over the window (slope × length)
//! is at most `2 + 2·√mean` (a steady queue of mean L wobbles by about √L; one the engine cannot
//! keep up with grows by (arrivals − completions per second) × the window). For reference the
//! table also shows the in-flight count at the end of the measured window beside what a server
//! that keeps up holds (Little's law: rate × mean audio seconds). The window should be much
//! longer than a request for the trend to mean something.
//!
//! A third mode, `--text-rates 20,50`, streams an LLM's reply into one running request through
//! the engine (`bench_streams/text_stream.rs`): first audio after the first fragment and after the
//! one that completes the first frame's text, last audio after the end, underruns.
//!
//! Each mode prints a table and, on stdout's last line, a JSON report (also `--json PATH`).
//!
//! ```sh
//! # closed loop, CPU
//! cargo run --release --example bench_streams -- --model-dir models/omnitts-en --streams 1,2,4,8,16
//! # open loop, CPU (two cores, the bundled voice: it ends its sentences itself)
//! cargo run --release --example bench_streams -- --model-dir models/omnitts-en --rates 1,2,4 --duration 60
//! # both on a GPU (scripts/gpu-run.sh step `streams`), 4 rates × 1 seed in about 3 min
//! bench_streams --model-dir /tmp/ckpt/1.7b --device cuda:0 --shared-only --streams 1,4,16,64 \
//!     --rates 1,10,20,40 --seeds 1 --warmup-s 10 --duration 30
//! ```
//!
//! Without `--streams` the closed loop runs 1,2,4,8,16 streams unless `--rates` or `--text-rates` is given.
//! `cargo test --example bench_streams` runs the detector's, the player's and the scheduler's
//! unit tests (also part of `cargo test`).

#[path = "common/cuda_profiler.rs"]
mod cuda_profiler;
#[path = "common/llm_reply.rs"]
mod llm_reply;
#[path = "bench_streams/open_loop.rs"]
mod open_loop;
#[path = "bench_streams/playback.rs"]
mod playback;
#[path = "common/rate_arg.rs"]
mod rate_arg;
#[path = "bench_streams/text_stream.rs"]
mod text_stream;

use std::path::PathBuf;
use std::thread;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use clap::{Parser, ValueEnum};
use gstomnitts::engine::{
    ChunkPolicy, DTypeSpec, DeviceSpec, Engine, EngineOptions, EngineRequest, Metrics,
    SharedEngine, StageConfig,
};
use gstomnitts::models::qwen3_tts::VoiceRequest;
use serde_json::{Value, json};

use open_loop::RunSpec;
use playback::percentile;

#[derive(Parser, Debug)]
#[command(
    about = "omnitts: many streams on one engine, closed loop (N at once) and open loop (arrivals at a rate)"
)]
struct Args {
    /// Checkpoint directory.
    #[arg(long, default_value = "models/omnitts-en")]
    model_dir: PathBuf,
    /// Closed loop: stream counts to measure, comma separated (default 1,2,4,8,16 unless --rates
    /// is given).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    streams: Option<Vec<u64>>,
    /// Closed loop: frames per stream (80 ms each).
    #[arg(long, default_value_t = 50)]
    frames: usize,
    /// Closed loop: starts of N streams on the same engine, one after another, each measured
    /// (the first comes after only a one-stream warm-up; the later ones show a warm engine).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// Device of both stages: cpu | cuda:N | auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Closed loop: skip the N-separate-engines runs.
    #[arg(long)]
    shared_only: bool,
    /// Open loop: arrival rates (requests per second), comma separated; none by default.
    #[arg(long, value_delimiter = ',', value_parser = rate_arg::positive_rate)]
    rates: Vec<f64>,
    /// Open loop: seeds, one run per seed and rate.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    seeds: Vec<u64>,
    /// Open loop: seconds of warm-up arrivals (not counted) before each measured window.
    #[arg(long, default_value_t = 30.0)]
    warmup_s: f64,
    /// Open loop: seconds of measured arrivals per rate and seed.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Open loop: seconds the measured requests may still run after the window before they are
    /// cancelled (and counted as timed out).
    #[arg(long, default_value_t = 30.0)]
    drain_s: f64,
    /// Open loop: stop each request after exactly its drawn length (default: off for a checkpoint
    /// with an omnitts.json, a trained omnitts voice; on otherwise).
    #[arg(long)]
    fixed_length: Option<Switch>,
    /// Open loop: greedy decoding instead of the checkpoint's sampling settings.
    #[arg(long)]
    greedy: bool,
    /// Open loop: frames in the first audio chunk (0: none apart; default: the stage config's, 1).
    #[arg(long)]
    initial_chunk_frames: Option<usize>,
    /// Open loop: frames in each later audio chunk (default: the stage config's, 25).
    #[arg(long)]
    chunk_frames: Option<usize>,
    /// Open loop: the engine's `max_num_seqs` (streams batched at once).
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Open loop: the engine's `max_waiting` (default: the built-in stage config's).
    #[arg(long)]
    max_waiting: Option<usize>,
    /// Code2Wav's dtype (stage 1 `engine_args.dtype`): float32 (exact) or bfloat16 (CUDA).
    #[arg(long, default_value = "float32")]
    decoder_dtype: String,
    /// Stage 1 `engine_args.allow_tf32`: f32 matrix products on TF32 tensor cores (CUDA).
    #[arg(long)]
    allow_tf32: bool,
    /// Stage 1 `engine_args.max_num_batched_tokens`: most frames a Code2Wav pass takes (0: the
    /// decoder's own, 512 on CUDA).
    #[arg(long, default_value_t = 0)]
    decoder_pass_frames: usize,
    /// Stage 1 `engine_args.first_chunk_lane`: `on`, `off`, or `auto` (the stage config's
    /// default: on for a CUDA decoder).
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    first_chunk_lane: String,
    /// Stage 0 `engine_args.first_frame_alone`: `on`, `off`, or `auto` (the stage config's
    /// default).
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    first_frame_alone: String,
    /// Text streamed into one running request: token rates of the simulated LLM reply, comma
    /// separated; none by default (see `text_stream.rs`).
    #[arg(long, value_delimiter = ',', value_parser = rate_arg::positive_rate)]
    text_rates: Vec<f64>,
    /// Text streamed: rounds per rate (after one warm-up reply, not counted).
    #[arg(long, default_value_t = 3)]
    text_rounds: usize,
    /// Text streamed: most frames of a reply (random weights never end by themselves; 300 = 24 s).
    #[arg(long, default_value_t = 300)]
    text_frames: usize,
    /// Write the JSON report here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Closed loop: each measured run on the shared engine (not the engine's start or the
    /// warm-up stream) is the CUDA profiler's range (`ncu --profile-from-start off`, `nsys
    /// profile --capture-range=cudaProfilerApi`).
    #[arg(long)]
    profile: bool,
}

/// `on` / `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
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

/// The checkpoint family's built-in stage config (`configs/qwen3_tts.yaml`,
/// `configs/fish_speech.yaml`) for an engine batching up to `max_seqs` streams; `guard`: the
/// runaway guard on (else only `max_new_tokens` ends a request that EOS does not);
/// `max_waiting`: the queue beyond them (default: the built-in config's).
fn config(
    args: &Args,
    max_seqs: usize,
    guard: bool,
    max_waiting: Option<usize>,
) -> Result<StageConfig> {
    let mut c = StageConfig::default_for_model(&args.model_dir)?;
    c.decoder.dtype = DTypeSpec::parse(&args.decoder_dtype).unwrap_or(DTypeSpec::F32);
    c.decoder.allow_tf32 = args.allow_tf32;
    c.decoder.max_num_batched_tokens = args.decoder_pass_frames;
    c.decoder.first_chunk_lane = match args.first_chunk_lane.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    };
    c.ar.first_frame_alone = match args.first_frame_alone.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    };
    c.ar.guard.enabled = guard;
    c.ar.max_num_seqs = max_seqs.max(1);
    c.decoder.max_num_seqs = max_seqs.max(1);
    if let Some(w) = max_waiting {
        c.ar.max_waiting = w;
    }
    Ok(c)
}

/// Loads the checkpoint with `config` on `--device`.
fn load(args: &Args, config: StageConfig) -> Result<Engine> {
    let device: DeviceSpec = args.device.parse()?;
    let n = config.ar.max_num_seqs;
    let t = Instant::now();
    let e = Engine::load(EngineOptions {
        model_dir: args.model_dir.clone(),
        stage_config: config,
        ar_device: device,
        decoder_device: device,
    })
    .with_context(|| format!("loading {}", args.model_dir.display()))?;
    eprintln!(
        "engine for {n} streams loaded in {:.1} s; CUDA graphs {:?}, batched {:?}, first-chunk lane {:?}, decoder graphs {:?}",
        t.elapsed().as_secs_f64(),
        e.cuda_graphs(),
        e.batch_graphs(),
        e.first_chunk_lane(),
        e.decoder_graphs()
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

/// The closed-loop figures of one run of `n` streams (see the crate doc).
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
    // The first audio in parts: from the prefill's end (queue + prefill) to the first frame
    // (waiting for a prefill budget, the steps before its own), and from the first frame to the
    // first audio (stage 1).
    let to_first_frame: Vec<f64> = streams
        .iter()
        .map(|s| (s.first_frame_ms - s.metrics.queue_ms - s.metrics.ar_prefill_ms).max(0.0))
        .collect();
    let first_frame_steps: Vec<f64> = streams
        .iter()
        .map(|s| s.metrics.first_frame_steps.map_or(f64::NAN, |n| n as f64))
        .collect();
    let stage1_first: Vec<f64> = streams
        .iter()
        .map(|s| {
            s.metrics
                .ttfa_ms
                .map_or(f64::NAN, |t| (t - s.first_frame_ms).max(0.0))
        })
        .collect();
    json!({
        "engines": label, "streams": n,
        "aggregate_audio_s_per_s": audio_s / wall_s,
        "audio_s": audio_s, "wall_s": wall_s,
        "rtf_p50": percentile(&rtf, 50.0), "rtf_max": percentile(&rtf, 100.0),
        "ttfa_ms_p50": percentile(&ttfa, 50.0), "ttfa_ms_p95": percentile(&ttfa, 95.0),
        "ttfa_ms_p99": percentile(&ttfa, 99.0),
        "frames_min": percentile(&frames, 0.0),
        "queue_ms_p50": percentile(&queue, 50.0), "prefill_ms_p50": percentile(&prefill, 50.0),
        "first_frame_ms_p50": percentile(&first_frame, 50.0),
        "queue_ms_p95": percentile(&queue, 95.0), "prefill_ms_p95": percentile(&prefill, 95.0),
        "to_first_frame_ms_p50": percentile(&to_first_frame, 50.0),
        "to_first_frame_ms_p95": percentile(&to_first_frame, 95.0),
        "first_frame_steps_p50": percentile(&first_frame_steps, 50.0),
        "first_frame_steps_p95": percentile(&first_frame_steps, 95.0),
        "stage1_first_ms_p50": percentile(&stage1_first, 50.0),
        "stage1_first_ms_p95": percentile(&stage1_first, 95.0),
        "mean_batch_stage0": mean_batch,
        "ar_ms_per_step_p50": percentile(&ar, 50.0),
        "decoder_ms_per_frame_p50": percentile(&dec, 50.0),
    })
}

/// The closed-loop runs: for each N of `counts`, N streams on one engine and, unless
/// `--shared-only`, on N engines; prints the table, returns the JSON rows.
fn closed_loop(args: &Args, counts: &[usize]) -> Result<Vec<Value>> {
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
    for &n in counts {
        let shared = SharedEngine::unshared(load(args, config(args, n, false, None)?)?);
        // Warm-up: one short stream (first-touch allocations, thread pools).
        run_streams(std::slice::from_ref(&shared), 1, 4)?;
        // The last round's aggregate, for the shared / separate ratio.
        let mut shared_agg = f64::NAN;
        for round in 1..=args.rounds {
            let before = shared.batch_stats()[0];
            if args.profile {
                cuda_profiler::profiler_range(true);
            }
            let streams = run_streams(std::slice::from_ref(&shared), n, args.frames);
            if args.profile {
                cuda_profiler::profiler_range(false);
            }
            let streams = streams?;
            let after = shared.batch_stats()[0];
            let mean_batch =
                (after.rows - before.rows) as f64 / (after.steps - before.steps).max(1) as f64;
            let s = summary("shared", n, &streams, mean_batch);
            if args.rounds > 1 {
                println!("round {round} of {}", args.rounds);
            }
            print_closed_row(&s, n, None);
            shared_agg = aggregate(&s);
            rows.push(json!({ "n": n, "round": round, "shared": s }));
        }
        drop(shared);
        if !args.shared_only {
            let engines: Vec<SharedEngine> = (0..n)
                .map(|_| {
                    config(args, 1, false, None)
                        .and_then(|c| load(args, c))
                        .map(SharedEngine::unshared)
                })
                .collect::<Result<_>>()?;
            run_streams(&engines[..1], 1, 4)?;
            let streams = run_streams(&engines, n, args.frames)?;
            let sep = summary("separate", n, &streams, 1.0);
            let ratio = shared_agg / aggregate(&sep);
            print_closed_row(&sep, n, Some(ratio));
            rows.push(json!({ "n": n, "separate": sep, "shared_over_separate": ratio }));
        }
    }
    Ok(rows)
}

/// A [`summary`]'s aggregate audio-seconds per second.
fn aggregate(summary: &Value) -> f64 {
    summary["aggregate_audio_s_per_s"]
        .as_f64()
        .unwrap_or(f64::NAN)
}

/// Prints one closed-loop row of [`summary`] and the first audio in parts under it; `ratio`: the
/// shared engine's aggregate over this row's (separate engines).
fn print_closed_row(row: &Value, n: usize, ratio: Option<f64>) {
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
        ratio.map(|r| format!("{r:.2}x")).unwrap_or_default()
    );
    let pair = |k: &str| {
        format!(
            "{:.1} / {:.1}",
            f(&format!("{k}_p50")),
            f(&format!("{k}_p95"))
        )
    };
    println!(
        "           first audio, p50 / p95 ms: queue {} | prefill {} | to first frame {} ({} steps) | stage 1 {}",
        pair("queue_ms"),
        pair("prefill_ms"),
        pair("to_first_frame_ms"),
        pair("first_frame_steps"),
        pair("stage1_first_ms")
    );
}

/// The streamed-text runs (`--text-rates`): one warm-up reply, then `--text-rounds` replies per
/// rate, one at a time on one engine; prints a line per reply, returns the JSON report of the mode.
fn text_stream_runs(args: &Args) -> Result<Value> {
    for &rate in &args.text_rates {
        ensure!(
            rate.is_finite() && rate > 0.0,
            "--text-rates: {rate} is not a rate"
        );
    }
    let shared = SharedEngine::unshared(load(args, config(args, 1, false, None)?)?);
    text_stream::run(&shared, 50.0, args.greedy, 1, args.text_frames)?;
    eprintln!(
        "text streamed into one request: {} tokens at each rate, {} decoding, at most {} frames",
        llm_reply::tokens().len(),
        if args.greedy {
            "greedy"
        } else {
            "the checkpoint's"
        },
        args.text_frames
    );
    println!("{}", text_stream::header());
    let mut runs = Vec::new();
    for &rate in &args.text_rates {
        for round in 0..args.text_rounds {
            let r = text_stream::run(
                &shared,
                rate,
                args.greedy,
                round as u64 + 1,
                args.text_frames,
            )?;
            println!("{}", text_stream::line(&r));
            runs.push(r);
        }
    }
    Ok(json!({ "greedy": args.greedy, "max_frames": args.text_frames, "runs": runs }))
}

/// Whether open-loop requests stop at their drawn length: `--fixed-length`, else off for a
/// checkpoint with an `omnitts.json` (a trained omnitts voice) and on for any other.
fn fixed_length(args: &Args) -> bool {
    match args.fixed_length {
        Some(s) => s == Switch::On,
        None => !args.model_dir.join("omnitts.json").is_file(),
    }
}

/// The open-loop runs: every rate × seed on one engine; prints a line per run and one per rate
/// (all its seeds), returns the JSON report of the mode.
fn open_loop_runs(args: &Args) -> Result<Value> {
    for &rate in &args.rates {
        ensure!(
            rate.is_finite() && rate > 0.0,
            "--rates: {rate} is not a rate"
        );
    }
    ensure!(!args.seeds.is_empty(), "--seeds is empty");
    ensure!(
        args.warmup_s >= 0.0 && args.duration > 0.0 && args.drain_s >= 0.0,
        "--warmup-s, --duration and --drain-s must be ≥ 0 (--duration > 0)"
    );
    let fixed = fixed_length(args);
    let shared = SharedEngine::unshared(load(
        args,
        config(args, args.max_batch, !fixed, args.max_waiting)?,
    )?);
    // First-touch allocations and thread pools before any timing.
    run_streams(std::slice::from_ref(&shared), 1, 4)?;
    let gpu = match shared.devices().0 {
        DeviceSpec::Cuda(i) => Some(i),
        _ => None,
    };
    let chunks = chunk_sizes(
        shared
            .stage_config()
            .chunk_policy(args.initial_chunk_frames, args.chunk_frames),
    );
    eprintln!(
        "open loop: {} Hz, speaker {:?}, {} decoding, length {}, chunks of {chunks} frames, \
         warm-up {} s, measured {} s, drain {} s",
        shared.sample_rate(),
        shared.speakers().first(),
        if args.greedy {
            "greedy"
        } else {
            "the checkpoint's"
        },
        if fixed {
            "fixed (30-80 frames)"
        } else {
            "the checkpoint's"
        },
        args.warmup_s,
        args.duration,
        args.drain_s
    );
    println!("{}", open_loop::table_header());
    let mut per_rate = Vec::new();
    let mut highest_clean = None;
    for &rate in &args.rates {
        let mut runs = Vec::new();
        let mut per_seed = Vec::new();
        for &seed in &args.seeds {
            let spec = RunSpec {
                rate,
                seed,
                warmup_s: args.warmup_s,
                duration_s: args.duration,
                drain_s: args.drain_s,
                fixed_length: fixed,
                greedy: args.greedy,
                initial_chunk_frames: args.initial_chunk_frames,
                chunk_frames: args.chunk_frames,
            };
            let run = open_loop::run(&shared, &spec, gpu)?;
            let s = open_loop::summarize(std::slice::from_ref(&run));
            println!("{}", open_loop::table_row(&s, &seed.to_string()));
            println!("{}", s.first_audio_parts.line());
            println!("{}", open_loop::second_chunk_line(&s));
            let underruns = open_loop::underrun_line(&s);
            if !underruns.is_empty() {
                println!("{underruns}");
            }
            per_seed.push(s);
            runs.push(run);
        }
        let all = open_loop::summarize(&runs);
        if args.seeds.len() > 1 {
            println!("{}", open_loop::table_row(&all, "all"));
        }
        if all.clean() {
            highest_clean = Some(highest_clean.map_or(rate, |r: f64| r.max(rate)));
        }
        per_rate.push(json!({ "all": all, "per_seed": per_seed }));
    }
    match highest_clean {
        Some(r) => println!("highest rate without underruns, refusals or timeouts: {r}/s"),
        None => println!("every rate had underruns, refusals or timeouts"),
    }
    Ok(json!({
        "fixed_length": fixed, "greedy": args.greedy, "seeds": args.seeds,
        "warmup_s": args.warmup_s, "duration_s": args.duration, "drain_s": args.drain_s,
        "max_batch": args.max_batch, "max_waiting": shared.stage_config().ar.max_waiting,
        "initial_chunk_frames": args.initial_chunk_frames
            .unwrap_or(shared.stage_config().decoder.initial_codec_chunk_frames),
        "chunk_frames": args.chunk_frames.unwrap_or(shared.stage_config().decoder.codec_chunk_frames),
        "chunks": chunks,
        "sample_rate": shared.sample_rate(),
        "decoder_dtype": args.decoder_dtype, "allow_tf32": args.allow_tf32,
        "decoder_pass_frames": args.decoder_pass_frames,
        "first_chunk_lane": format!("{:?}", shared.first_chunk_lane()),
        "first_frame_alone": shared.stage_config().first_frame_alone_on(shared.devices().0),
        "stream_priority": format!("{:?}", shared.stage_config().stream_priority()),
        "decoder_graphs": format!("{:?}", shared.decoder_graphs()),
        "alone_arrivals": std::env::var("OMNITTS_ALONE_ARRIVALS").unwrap_or_else(|_| "default".into()),
        "rates": per_rate, "highest_rate_without_underruns": highest_clean,
    }))
}

/// The first chunk sizes of `policy`, as a list ("1, 1, 2, 4, 8, 16, 25, 25, …"), or "whole".
fn chunk_sizes(policy: ChunkPolicy) -> String {
    if policy == ChunkPolicy::Whole {
        return "whole".to_string();
    }
    let mut taken = 0;
    let sizes: Vec<String> = policy
        .boundaries()
        .take(8)
        .map(|b| (b - std::mem::replace(&mut taken, b)).to_string())
        .collect();
    format!("{}, …", sizes.join(", "))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let counts = match &args.streams {
        Some(c) => c.iter().map(|&n| n as usize).collect(),
        None if args.rates.is_empty() && args.text_rates.is_empty() => vec![1, 2, 4, 8, 16],
        None => Vec::new(),
    };
    ensure!(
        !counts.is_empty() || !args.rates.is_empty() || !args.text_rates.is_empty(),
        "--streams, --rates and --text-rates are all empty"
    );
    let rows = if counts.is_empty() {
        Vec::new()
    } else {
        closed_loop(&args, &counts)?
    };
    let open = if args.rates.is_empty() {
        Value::Null
    } else {
        open_loop_runs(&args)?
    };
    let text = if args.text_rates.is_empty() {
        Value::Null
    } else {
        text_stream_runs(&args)?
    };
    let report = json!({
        "model_dir": args.model_dir, "device": args.device, "frames": args.frames,
        "threads": std::env::var("RAYON_NUM_THREADS").ok(), "rows": rows,
        "open_loop": open, "text_stream": text,
    });
    println!("{report}");
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
