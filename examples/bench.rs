//! Engine benchmark: time to first audio (TTFA) and per-stage ms per frame.
//!
//! ```sh
//! # tiny fixture checkpoints (tests/fixtures), CPU
//! cargo run --release --example bench
//! # the real 0.6B CustomVoice shapes with random weights (written to a temp dir, ~2.5 GB)
//! cargo run --release --example bench -- --random-weights --frames 24 --runs 2
//! # weight forms side by side (docs/cpu.md), 1.7B shapes, greedy
//! cargo run --release --example bench -- --only-random --size 1.7b --greedy \
//!     --quantization none,q8_0,q4_k --modes batch
//! # a real checkpoint
//! cargo run --release --example bench -- --model-dir /path/to/Qwen3-TTS-12Hz-0.6B-CustomVoice
//! ```
//!
//! Every run asks for a fixed number of frames: sampling with a per-run seed, the runaway guard
//! off, `max_new_tokens = frames + 1` (the reference drops the last sampled token). A run that
//! ends early by EOS is retried with the next seed (random weights rarely pick EOS). Each
//! configuration is run in async-chunk mode (exact streaming) and in batch mode. Prints a table and
//! a JSON document (also written to `--json PATH`).
//!
//! `--random-weights` builds the real 0.6B (or `--size 1.7b`) CustomVoice layout (docs/qwen3-tts.md §1.3, §1.5, §8):
//! it takes `config.json`, `generation_config.json`, the tokenizer files and
//! `speech_tokenizer/{config,preprocessor_config}.json` of the tiny CustomVoice fixture, replaces
//! the widths/depths by the real values, and writes `model.safetensors` (bf16) and
//! `speech_tokenizer/model.safetensors` (f32, decoder only) with seeded random values. The tensor
//! layout is derived from the configs; it is first checked against the tiny fixture's files.

mod random_checkpoint;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use candle_core::DType;
use clap::Parser;
use gstomnitts::engine::{
    DTypeSpec, DeviceSpec, Engine, EngineOptions, EngineRequest, FinishReason, Metrics, StageConfig,
};
use gstomnitts::models::qwen3_tts::{VoiceRequest, WeightForm};
use gstomnitts::nn::QuantizationSpec;
use random_checkpoint::{check_layout, decoder_layout, talker_layout, write_configs, write_seeded};
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "omnitts engine benchmark: TTFA and per-stage ms/frame")]
struct Args {
    /// Benchmark this checkpoint directory instead of the tiny fixtures.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Also benchmark random weights in the real CustomVoice shapes of `--size`.
    #[arg(long)]
    random_weights: bool,
    /// Only the random-weight model (skip the tiny fixtures).
    #[arg(long)]
    only_random: bool,
    /// Frames per utterance (80 ms each).
    #[arg(long, default_value_t = 50)]
    frames: usize,
    /// Measured runs per configuration (after one warm-up run).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Device of stage 0: cpu | cuda:N | auto.
    #[arg(long, default_value = "cpu")]
    ar_device: String,
    /// Device of stage 1: cpu | cuda:N | auto.
    #[arg(long, default_value = "cpu")]
    decoder_device: String,
    /// codec_chunk_frames for the async mode.
    #[arg(long, default_value_t = 25)]
    chunk: usize,
    /// initial_codec_chunk_frames for the async mode.
    #[arg(long, default_value_t = 1)]
    initial_chunk: usize,
    /// Text to synthesize.
    #[arg(
        long,
        default_value = "The quick brown fox jumps over the lazy dog, again and again."
    )]
    text: String,
    /// Where to write the random checkpoint (default: a temp dir, removed afterwards).
    #[arg(long)]
    random_dir: Option<PathBuf>,
    /// Keep the random checkpoint.
    #[arg(long)]
    keep: bool,
    /// Directory holding the tiny fixture checkpoints (default: the crate's tests/fixtures).
    #[arg(long)]
    fixtures: Option<PathBuf>,
    /// Only check the random-weight layout generator against the tiny fixtures' files, then exit.
    #[arg(long)]
    check_layout: bool,
    /// Write the JSON report here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Shapes of the random-weight checkpoint: 0.6b | 1.7b.
    #[arg(long, default_value = "0.6b")]
    size: String,
    /// Stored forms of stage 0's linear weights to compare, comma-separated
    /// (auto, none, q8_0, q4_k; `engine_args.quantization`), each loaded in turn.
    #[arg(long, default_value = "auto")]
    quantization: String,
    /// Stage 0's activation dtype (`engine_args.dtype`: auto, float32, bfloat16).
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Modes to run, comma-separated: async (exact streaming) and/or batch.
    #[arg(long, default_value = "async,batch")]
    modes: String,
    /// Greedy decoding (talker and code predictor) instead of seeded sampling.
    #[arg(long)]
    greedy: bool,
}

/// Aggregated measurements of one (model, weight form, mode) configuration.
struct Row {
    model: String,
    form: String,
    mode: String,
    load_s: f64,
    runs: Vec<Metrics>,
    retries: usize,
    /// The process's peak resident set from this configuration's load to its last run (MiB).
    peak_rss_mib: f64,
}

/// Resets the kernel's peak-RSS mark of this process (`/proc/self/clear_refs`, Linux ≥ 4.0).
fn reset_peak_rss() {
    let _ = fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident set since the last [`reset_peak_rss`] (MiB; NaN off Linux).
fn peak_rss_mib() -> f64 {
    rss_mib("VmHWM:")
}

/// A memory line of `/proc/self/status` (`VmRSS:`, `VmHWM:`) in MiB; NaN off Linux.
fn rss_mib(key: &str) -> f64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Row {
    fn med(&self, f: impl Fn(&Metrics) -> f64) -> f64 {
        median(self.runs.iter().map(f).collect())
    }

    fn json(&self) -> Value {
        json!({
            "model": self.model,
            "quantization": self.form,
            "mode": self.mode,
            "peak_rss_mib": self.peak_rss_mib,
            "runs": self.runs.len(),
            "retries_after_eos": self.retries,
            "load_s": self.load_s,
            "frames": self.med(|m| m.frames as f64),
            "ttfa_ms": self.med(|m| m.ttfa_ms.unwrap_or(f64::NAN)),
            "ar_prefill_ms": self.med(|m| m.ar_prefill_ms),
            "ar_ms_per_frame": self.med(|m| m.ar_ms_per_frame),
            "decoder_ms_per_frame": self.med(|m| m.decoder_ms_per_frame),
            "rtf": self.med(|m| m.rtf),
            "wall_ms": self.med(|m| m.wall_ms),
            "per_run": self.runs.iter().map(|m| json!({
                "frames": m.frames, "ttfa_ms": m.ttfa_ms, "ar_prefill_ms": m.ar_prefill_ms,
                "ar_ms_per_frame": m.ar_ms_per_frame, "decoder_ms_per_frame": m.decoder_ms_per_frame,
                "rtf": m.rtf, "wall_ms": m.wall_ms,
            })).collect::<Vec<_>>(),
        })
    }
}

fn bench_model(args: &Args, name: &str, dir: &Path, voice: &VoiceRequest) -> Result<Vec<Row>> {
    let ar_device: DeviceSpec = args.ar_device.parse()?;
    let decoder_device: DeviceSpec = args.decoder_device.parse()?;
    let dtype = DTypeSpec::parse(&args.dtype).with_context(|| format!("--dtype {}", args.dtype))?;
    let mut rows = Vec::new();
    for form in args.quantization.split(',').map(str::trim) {
        let quantization =
            QuantizationSpec::parse(form).with_context(|| format!("--quantization {form}"))?;
        for mode in args
            .modes
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            rows.push(bench_config(
                args,
                name,
                dir,
                voice,
                (ar_device, decoder_device),
                (dtype, quantization),
                mode,
            )?);
        }
    }
    Ok(rows)
}

/// Loads one engine (weight form, mode) and measures its runs.
fn bench_config(
    args: &Args,
    name: &str,
    dir: &Path,
    voice: &VoiceRequest,
    (ar_device, decoder_device): (DeviceSpec, DeviceSpec),
    (dtype, quantization): (DTypeSpec, QuantizationSpec),
    mode: &str,
) -> Result<Row> {
    let mut cfg = match mode {
        "async" => StageConfig::default_async(),
        "batch" => StageConfig::default_batch(),
        other => bail!("--modes: unknown mode {other:?} (async | batch)"),
    };
    cfg.ar.guard.enabled = false;
    cfg.ar.dtype = dtype;
    cfg.ar.quantization = quantization;
    cfg.decoder.codec_chunk_frames = args.chunk;
    cfg.decoder.initial_codec_chunk_frames = args.initial_chunk;
    reset_peak_rss();
    let t = Instant::now();
    let engine = Engine::load(EngineOptions {
        model_dir: dir.to_path_buf(),
        stage_config: cfg,
        ar_device,
        decoder_device,
    })
    .with_context(|| format!("loading {}", dir.display()))?;
    let load_s = t.elapsed().as_secs_f64();
    eprintln!(
        "{name} {quantization} {mode}: loaded in {load_s:.1} s ({:.0} MiB resident), CUDA graphs: {:?}, weights: {}",
        rss_mib("VmRSS:"),
        engine.cuda_graphs(),
        WeightForm::summary(engine.weight_forms())
    );
    let mut voice = voice.clone();
    let speakers = engine.speakers();
    if let Some(s) = &voice.speaker
        && !speakers.iter().any(|k| k.eq_ignore_ascii_case(s))
    {
        // A checkpoint without this preset speaker (e.g. the bundled voice through
        // --model-dir): its first preset, or none.
        voice.speaker = speakers.first().cloned();
    }
    let mut row = Row {
        model: name.to_string(),
        form: quantization.to_string(),
        mode: mode.to_string(),
        load_s,
        runs: Vec::new(),
        retries: 0,
        peak_rss_mib: f64::NAN,
    };
    let mut seed = 1u64;
    // One warm-up run, then the measured ones.
    for i in 0..=args.runs {
        let metrics = loop {
            let mut sampling = engine.default_sampling_params();
            sampling.do_sample = !args.greedy;
            sampling.subtalker_do_sample = !args.greedy;
            sampling.max_new_tokens = args.frames + 1;
            sampling.seed = seed;
            seed += 1;
            let h = engine.submit(EngineRequest::new(voice.clone(), sampling))?;
            let (audio, reason, metrics) = h.collect()?;
            ensure!(
                audio.len() == metrics.frames * engine.samples_per_frame(),
                "{name}: {} samples for {} frames",
                audio.len(),
                metrics.frames
            );
            match reason {
                FinishReason::Length => break metrics,
                // Random weights stop at random: retry a short run with the next seed. A
                // trained voice ends its sentence where it ends (--model-dir): measure that.
                FinishReason::Eos
                    if !args.greedy && row.retries < 20 && metrics.frames < args.frames / 2 =>
                {
                    row.retries += 1;
                    continue;
                }
                FinishReason::Eos if metrics.frames > 0 => break metrics,
                other => bail!("{name} {mode}: run ended with {other}"),
            }
        };
        eprintln!(
            "{name:>18} {mode:>5} run {i}{}: {} frames, TTFA {:.1} ms, AR {:.2} ms/frame, \
             decoder {:.2} ms/frame, RTF {:.3}",
            if i == 0 { " (warm-up)" } else { "" },
            metrics.frames,
            metrics.ttfa_ms.unwrap_or(f64::NAN),
            metrics.ar_ms_per_frame,
            metrics.decoder_ms_per_frame,
            metrics.rtf
        );
        if i > 0 {
            row.runs.push(metrics);
        }
    }
    row.peak_rss_mib = peak_rss_mib();
    Ok(row)
}

fn print_table(rows: &[Row], frames: usize) {
    println!();
    println!(
        "| model | quantization | mode | frames | TTFA ms | prefill ms | AR ms/frame | decoder ms/frame | RTF | load s | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} | {:.3} | {:.1} | {:.0} |",
            r.model,
            r.form,
            r.mode,
            r.med(|m| m.frames as f64),
            r.med(|m| m.ttfa_ms.unwrap_or(f64::NAN)),
            r.med(|m| m.ar_prefill_ms),
            r.med(|m| m.ar_ms_per_frame),
            r.med(|m| m.decoder_ms_per_frame),
            r.med(|m| m.rtf),
            r.load_s,
            r.peak_rss_mib
        );
    }
    println!(
        "(medians over the measured runs; {frames} frames = {:.2} s of audio; RTF = processing time / audio time)",
        frames as f64 * 0.08
    );
}

/// Builds a random CustomVoice checkpoint of `size` (0.6b | 1.7b) in `dir` from the tiny
/// fixture's files (`random_checkpoint.rs`), its values drawn on the CPU from fixed seeds.
fn build_random(size: &str, template: &Path, dir: &Path) -> Result<()> {
    let (cfg, st) = write_configs(size, template, dir)?;
    let t = Instant::now();
    let talker = talker_layout(&cfg)?;
    let params: usize = talker
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    let bytes = write_seeded(&dir.join("model.safetensors"), &talker, DType::BF16, 1)?;
    let dec = decoder_layout(&st)?;
    let dparams: usize = dec.iter().map(|t| t.shape.iter().product::<usize>()).sum();
    let dbytes = write_seeded(
        &dir.join("speech_tokenizer/model.safetensors"),
        &dec,
        DType::F32,
        2,
    )?;
    eprintln!(
        "random {size} CustomVoice in {}: talker+code predictor {:.1} M params ({:.2} GB bf16), decoder {:.1} M params ({:.2} GB f32), written in {:.1} s",
        dir.display(),
        params as f64 / 1e6,
        bytes as f64 / 1e9,
        dparams as f64 / 1e6,
        dbytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let fixtures = args
        .fixtures
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"));
    if args.check_layout {
        for name in ["tiny-customvoice", "tiny-voicedesign"] {
            check_layout(&fixtures.join(name))?;
            println!("{name}: layout generator matches model.safetensors and the decoder tensors");
        }
        return Ok(());
    }
    let mut rows = Vec::new();
    let voice = |speaker: Option<&str>| VoiceRequest {
        text: args.text.clone(),
        speaker: speaker.map(str::to_string),
        language: Some("english".to_string()),
        instruct: None,
        prompt_mode: None,
        voice_clone: None,
    };
    if let Some(dir) = &args.model_dir {
        rows.extend(bench_model(
            &args,
            &dir.display().to_string(),
            dir,
            &voice(Some("vivian")),
        )?);
    } else if !args.only_random {
        for (name, speaker) in [
            ("tiny-customvoice", Some("vivian")),
            ("tiny-voicedesign", None),
        ] {
            rows.extend(bench_model(
                &args,
                name,
                &fixtures.join(name),
                &voice(speaker),
            )?);
        }
    }
    if args.random_weights || args.only_random {
        let dir = args.random_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!(
                "omnitts-bench-{}-{}",
                args.size,
                std::process::id()
            ))
        });
        build_random(&args.size, &fixtures.join("tiny-customvoice"), &dir)?;
        let r = bench_model(
            &args,
            &format!("random-{}-CustomVoice", args.size),
            &dir,
            &voice(Some("vivian")),
        );
        if !args.keep && args.random_dir.is_none() {
            let _ = fs::remove_dir_all(&dir);
        }
        rows.extend(r?);
    }
    print_table(&rows, args.frames);
    let report = json!({
        "bench": "omnitts engine",
        "frames": args.frames,
        "runs": args.runs,
        "ar_device": args.ar_device,
        "decoder_device": args.decoder_device,
        "chunk": args.chunk,
        "initial_chunk": args.initial_chunk,
        "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    let text = serde_json::to_string_pretty(&report)?;
    println!("{text}");
    if let Some(p) = &args.json {
        fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
