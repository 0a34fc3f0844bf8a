//! Stage-0 parity on a GPU: greedy codes of the tiny fixture checkpoints on CUDA against the CPU and
//! the official reference, in f32 (must be identical) and bf16 (divergence measured).
//!
//! ```sh
//! cargo run --release --features cuda --example gpu_parity -- --device cuda:0 --json parity.json
//! ```
//!
//! For every `tests/fixtures/reference/<name>.json` and every case in it (voice-clone cases are
//! skipped here; their parity is tested on the CPU by tests/voice_clone.rs), greedy with the case's
//! `max_new_tokens`:
//! - CPU f32 → codes, which must equal the reference `codes` (a sanity check of the run itself);
//! - `--device` f32 → codes must equal the CPU f32 codes frame for frame, and the finish reason too;
//!   the talker's prefill logits are compared (max abs difference);
//! - `--device` bf16 (and CPU bf16 with `--cpu-bf16`) → measured against CPU f32: frames until the first differing
//!   frame, the fraction of equal codes (position by position over the common frames), the
//!   fraction of equal codebook-0 tokens, and the prefill logits' max abs difference relative to the
//!   largest |logit|.
//!
//! - `--device` f32 and bf16 with the code predictor replayed from CUDA graphs
//!   (`ArModel::enable_cuda_graphs`) → codes must equal the eager run of the same dtype.
//!   Also f32 graphs vs f32 eager with sampling on (seed 1234), reported as
//!   `cuda_graphs_f32_sampled_vs_eager` (not a failure). With the default whole-frame
//!   code-predictor graph it exercises the device sampler: equal up to rare CDF-boundary roundings;
//!   `OMNITTS_CP_FRAME_GRAPH=0` (`scripts/gpu-run.sh` step `perstep-parity`) checks the per-step
//!   graphs instead, where the host picks every code.
//!
//! `--checkpoints tiny-customvoice --max-cases 3` restricts the run (short device sessions).
//!
//! `--batch-parity DIR` instead checks batched frames of 1 … 64 streams joining and leaving, on the
//! batched frame graphs and eagerly, against each stream run alone (`batch_parity/mod.rs`).
//!
//! `--check-kernels` instead checks each fused CUDA decode kernel against the unfused candle ops on
//! random tensors (`kernel_check/mod.rs`; tolerances stated there) and exits 0 / 1.
//!
//! Prints a table and a JSON document. Exit code 0 when every f32 device run equals the CPU, every
//! CPU f32 run equals the reference and every graph run equals eager, 1 otherwise, 2 on an error.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use clap::Parser;
use gstomnitts::engine::DeviceSpec;
use gstomnitts::models::qwen3_tts::{
    ArModel, ArStep, Checkpoint, FinishReason, PromptMode, SamplingParams, VoiceRequest,
};
use serde_json::{Value, json};

#[cfg(feature = "cuda")]
#[path = "kernel_check/mod.rs"]
mod kernel_check;

#[path = "batch_parity/mod.rs"]
mod batch_parity;

#[derive(Parser, Debug)]
#[command(about = "stage-0 greedy parity: CUDA f32/bf16 vs CPU vs the reference fixtures")]
struct Args {
    /// The fixtures folder (holds reference/ and the tiny checkpoints).
    #[arg(long, default_value = "tests/fixtures")]
    fixtures: PathBuf,
    /// Device under test: cuda:N (or cpu, to check this program itself).
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Also run CPU bf16 (slow: candle's CPU bf16 matmul converts) to compare its divergence.
    #[arg(long)]
    cpu_bf16: bool,
    /// Also write the JSON document here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only check the fused CUDA decode kernels against the unfused ops (random tensors) and exit.
    #[arg(long)]
    check_kernels: bool,
    /// Only these checkpoints (comma separated, e.g. tiny-customvoice); default: all.
    #[arg(long, value_delimiter = ',')]
    checkpoints: Vec<String>,
    /// At most this many (non-voice-clone) cases per checkpoint; default: all.
    #[arg(long)]
    max_cases: Option<usize>,
    /// Only check batched frames (graphs and eager) against solo streams, B = 1 … 64, on the
    /// checkpoint in this folder, and exit (`batch_parity/mod.rs`).
    #[arg(long)]
    batch_parity: Option<PathBuf>,
    /// The batch parity's modes, comma separated: f32 (greedy), bf16 (greedy), sampled (f32);
    /// default: all.
    #[arg(long, value_delimiter = ',')]
    batch_modes: Vec<String>,
}

/// `cpu`, `cuda:N` or `auto`, opened as the engine opens a stage's device
/// ([`DeviceSpec::open`]).
fn open_device(spec: &str) -> Result<Device> {
    let spec: DeviceSpec = spec.parse()?;
    Ok(spec.open()?)
}

/// One greedy run: frames, finish reason, prefill logits, wall time.
struct Run {
    codes: Vec<Vec<u32>>,
    finish: FinishReason,
    logits0: Vec<f32>,
    ms: f64,
}

fn request(case: &Value) -> Result<VoiceRequest> {
    let s = |k: &str| case.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(VoiceRequest {
        text: s("text").context("case without text")?,
        speaker: s("speaker"),
        language: s("language"),
        instruct: s("instruct"),
        prompt_mode: Some(match case["prompt_mode"].as_str() {
            Some("streaming") => PromptMode::Streaming,
            Some("non_streaming") => PromptMode::NonStreaming,
            other => bail!("case prompt_mode {other:?}"),
        }),
        voice_clone: None,
    })
}

fn sampling(suite: &Value, ckpt: &Checkpoint, case: &Value) -> Result<SamplingParams> {
    let g = &suite["generation"];
    let f = |k: &str| g[k].as_f64().with_context(|| format!("generation.{k}"));
    let mut p = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    if g["do_sample"].as_bool() != Some(false) || g["subtalker_dosample"].as_bool() != Some(false) {
        bail!("reference cases are expected to be greedy");
    }
    p.repetition_penalty = f("repetition_penalty")?;
    p.max_new_tokens = case["max_new_tokens"]
        .as_u64()
        .context("case max_new_tokens")? as usize;
    Ok(p)
}

fn run(model: &ArModel, req: &VoiceRequest, sp: &SamplingParams) -> Result<Run> {
    let t = Instant::now();
    let mut s = model.start(req, sp)?;
    let logits0 = s.pending_logits().to_vec();
    let mut codes = Vec::new();
    let finish = loop {
        match s.next_frame()? {
            ArStep::Frame(f) => codes.push(f),
            ArStep::Finished(r) => break r,
        }
    };
    Ok(Run {
        codes,
        finish,
        logits0,
        ms: t.elapsed().as_secs_f64() * 1e3,
    })
}

/// Divergence of `b` from the f32 CPU run `a`.
fn compare(a: &Run, b: &Run) -> Value {
    let common = a.codes.len().min(b.codes.len());
    let first_diff = (0..common).find(|&i| a.codes[i] != b.codes[i]);
    let (mut eq, mut tot, mut eq0) = (0usize, 0usize, 0usize);
    for i in 0..common {
        for (x, y) in a.codes[i].iter().zip(&b.codes[i]) {
            eq += usize::from(x == y);
            tot += 1;
        }
        eq0 += usize::from(a.codes[i][0] == b.codes[i][0]);
    }
    let max_ref = a.logits0.iter().fold(0f32, |m, x| m.max(x.abs()));
    let max_diff = a
        .logits0
        .iter()
        .zip(&b.logits0)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
                if x > bv { (i, x) } else { (bi, bv) }
            })
            .0
    };
    json!({
        "identical": a.codes == b.codes && a.finish == b.finish,
        "frames": [a.codes.len(), b.codes.len()],
        "finish": [format!("{:?}", a.finish), format!("{:?}", b.finish)],
        "frames_before_first_diff": first_diff.unwrap_or(common),
        "diverged": first_diff.is_some() || a.codes.len() != b.codes.len(),
        "code_match_fraction": if tot > 0 { eq as f64 / tot as f64 } else { 1.0 },
        "code0_match_fraction": if common > 0 { eq0 as f64 / common as f64 } else { 1.0 },
        "logits0_max_abs_diff": max_diff,
        "logits0_max_abs": max_ref,
        "logits0_rel_diff": if max_ref > 0.0 { max_diff / max_ref } else { 0.0 },
        "logits0_same_argmax": argmax(&a.logits0) == argmax(&b.logits0),
        "ms": b.ms,
    })
}

fn ids2(v: &Value) -> Option<Vec<Vec<u32>>> {
    v.as_array()?
        .iter()
        .map(|f| {
            f.as_array()?
                .iter()
                .map(|x| x.as_u64().map(|x| x as u32))
                .collect()
        })
        .collect()
}

fn main() {
    match real_main() {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}

fn real_main() -> Result<bool> {
    let args = Args::parse();
    let dev = open_device(&args.device)?;
    if args.check_kernels {
        #[cfg(feature = "cuda")]
        return kernel_check::run(&dev);
        #[cfg(not(feature = "cuda"))]
        bail!("--check-kernels needs a build with the `cuda` feature");
    }
    if let Some(dir) = &args.batch_parity {
        let (ok, report) = batch_parity::run(dir, &dev, &args.batch_modes)?;
        println!("{report}");
        if let Some(p) = &args.json {
            std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
        }
        return Ok(ok);
    }
    let refdir = args.fixtures.join("reference");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&refdir)
        .with_context(|| refdir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut all_ok = true;
    let mut results = Vec::new();
    println!(
        "{:<18} {:<28} {:>6} {:>9} {:>9} {:>11} {:>11} {:>9} {:>9} {:>7}",
        "checkpoint",
        "case",
        "frames",
        "f32==cpu",
        "cpu==ref",
        "bf16 match",
        "bf16 1stdif",
        "bf16 rel",
        "cpubf16",
        "graphs"
    );
    for p in files {
        let suite: Value = serde_json::from_str(
            &std::fs::read_to_string(&p).with_context(|| p.display().to_string())?,
        )
        .with_context(|| p.display().to_string())?;
        let (Some(name), Some(cases)) = (suite["checkpoint"].as_str(), suite["cases"].as_array())
        else {
            continue; // reference/tokenizer.json
        };
        if !args.checkpoints.is_empty() && !args.checkpoints.iter().any(|c| c == name) {
            continue;
        }
        let dir: PathBuf = args.fixtures.join(name);
        let ckpt = Checkpoint::open(Path::new(&dir))?;
        let t = Instant::now();
        let cpu32 = ArModel::load(&ckpt, &Device::Cpu, DType::F32)?;
        let cpu16 = if args.cpu_bf16 {
            Some(ArModel::load(&ckpt, &Device::Cpu, DType::BF16)?)
        } else {
            None
        };
        let dev32 = ArModel::load(&ckpt, &dev, DType::F32)?;
        let dev16 = ArModel::load(&ckpt, &dev, DType::BF16)?;
        // The same models with the code predictor replayed from CUDA graphs.
        let mut graphed = Vec::new();
        for dt in [DType::F32, DType::BF16] {
            let mut m = ArModel::load(&ckpt, &dev, dt)?;
            let r = m.enable_cuda_graphs();
            // First line only: candle appends a backtrace when RUST_BACKTRACE is set.
            let err = r
                .err()
                .map(|e| e.to_string().lines().next().unwrap_or("").to_string());
            graphed.push((m, err));
        }
        eprintln!(
            "{name}: 4 models loaded in {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        let cases = cases
            .iter()
            .filter(|c| c["api"] != "generate_voice_clone")
            .take(args.max_cases.unwrap_or(usize::MAX));
        for case in cases {
            let id = case["id"].as_str().unwrap_or("?");
            let req = request(case).with_context(|| format!("{name}/{id}"))?;
            let sp = sampling(&suite, &ckpt, case).with_context(|| format!("{name}/{id}"))?;
            let a = run(&cpu32, &req, &sp).with_context(|| format!("{name}/{id} cpu f32"))?;
            let d32 = run(&dev32, &req, &sp).with_context(|| format!("{name}/{id} dev f32"))?;
            let d16 = run(&dev16, &req, &sp).with_context(|| format!("{name}/{id} dev bf16"))?;
            let c16 = match &cpu16 {
                Some(m) => {
                    Some(run(m, &req, &sp).with_context(|| format!("{name}/{id} cpu bf16"))?)
                }
                None => None,
            };
            let mut graph_json = Vec::new();
            for ((gm, err), eager) in graphed.iter().zip([&d32, &d16]) {
                let v = match err {
                    Some(e) => json!({"dtype": format!("{:?}", gm.dtype()), "error": e}),
                    None => {
                        let g = run(gm, &req, &sp)
                            .with_context(|| format!("{name}/{id} graphs {:?}", gm.dtype()))?;
                        let same = g.codes == eager.codes && g.finish == eager.finish;
                        json!({"dtype": format!("{:?}", gm.dtype()), "identical_to_eager": same,
                               "ms": g.ms, "eager_ms": eager.ms})
                    }
                };
                all_ok &= v["identical_to_eager"] == true;
                graph_json.push(v);
            }
            // Sampling (talker and code predictor, fixed seed), f32. The whole-frame graphs (the
            // default) choose the code predictor's codes on the device from the host's uniforms,
            // the eager path on the host: equal except where rounding moves a CDF boundary
            // (reported, not failed); with OMNITTS_CP_FRAME_GRAPH=0 both pick on the host.
            let sampled = match &graphed[0] {
                (gm, None) => {
                    let mut ss = sp.clone();
                    ss.do_sample = true;
                    ss.subtalker_do_sample = true;
                    ss.seed = 1234;
                    let e = run(&dev32, &req, &ss)
                        .with_context(|| format!("{name}/{id} dev f32 sampled"))?;
                    let g = run(gm, &req, &ss)
                        .with_context(|| format!("{name}/{id} graphs f32 sampled"))?;
                    compare(&e, &g)
                }
                (_, Some(e)) => json!({"error": e}),
            };
            let graphs_ok = graph_json.iter().all(|v| v["identical_to_eager"] == true);
            let reference = ids2(&case["codes"]);
            let cpu_eq_ref = reference.as_ref() == Some(&a.codes);
            let f32c = compare(&a, &d32);
            let b16 = compare(&a, &d16);
            let cb16 = c16.as_ref().map_or(Value::Null, |c| compare(&a, c));
            let f32_ok = f32c["identical"] == true;
            all_ok &= f32_ok && cpu_eq_ref;
            println!(
                "{:<18} {:<28} {:>6} {:>9} {:>9} {:>11.4} {:>11} {:>9.2e} {:>9.4} {:>7}",
                name,
                id,
                a.codes.len(),
                f32_ok,
                cpu_eq_ref,
                b16["code_match_fraction"].as_f64().unwrap_or(f64::NAN),
                b16["frames_before_first_diff"],
                b16["logits0_rel_diff"].as_f64().unwrap_or(f64::NAN),
                cb16["code_match_fraction"].as_f64().unwrap_or(f64::NAN),
                graphs_ok,
            );
            results.push(json!({
                "checkpoint": name, "case": id, "frames": a.codes.len(),
                "min_margin_code0": case.get("min_margin_code0"),
                "cpu_f32_equals_reference": cpu_eq_ref,
                "cpu_f32_ms": a.ms,
                "device_f32_vs_cpu_f32": f32c,
                "device_bf16_vs_cpu_f32": b16,
                "cpu_bf16_vs_cpu_f32": cb16,
                "cuda_graphs": graph_json,
                "cuda_graphs_f32_sampled_vs_eager": sampled,
            }));
        }
    }
    let n = results.len();
    let mean = |key: &str, field: &str| {
        let v: Vec<f64> = results
            .iter()
            .filter_map(|r| r[key][field].as_f64())
            .collect();
        if v.is_empty() {
            Value::Null
        } else {
            json!(v.iter().sum::<f64>() / v.len() as f64)
        }
    };
    let summary = json!({
        "cases": n,
        "device_f32_identical": results.iter().filter(|r| r["device_f32_vs_cpu_f32"]["identical"] == true).count(),
        "cpu_f32_equals_reference": results.iter().filter(|r| r["cpu_f32_equals_reference"] == true).count(),
        "device_bf16_identical": results.iter().filter(|r| r["device_bf16_vs_cpu_f32"]["identical"] == true).count(),
        "device_bf16_mean_code_match": mean("device_bf16_vs_cpu_f32", "code_match_fraction"),
        "device_bf16_mean_code0_match": mean("device_bf16_vs_cpu_f32", "code0_match_fraction"),
        "device_bf16_mean_frames_before_first_diff": mean("device_bf16_vs_cpu_f32", "frames_before_first_diff"),
        "device_bf16_max_logits0_rel_diff": results.iter().filter_map(|r| r["device_bf16_vs_cpu_f32"]["logits0_rel_diff"].as_f64()).fold(0f64, f64::max),
        "device_f32_max_logits0_abs_diff": results.iter().filter_map(|r| r["device_f32_vs_cpu_f32"]["logits0_max_abs_diff"].as_f64()).fold(0f64, f64::max),
        "cuda_graphs_identical_to_eager": results.iter().filter(|r| r["cuda_graphs"].as_array().is_some_and(|a| a.iter().all(|v| v["identical_to_eager"] == true))).count(),
        "cuda_graphs_f32_sampled_identical_to_eager": results.iter().filter(|r| r["cuda_graphs_f32_sampled_vs_eager"]["identical"] == true).count(),
        "cuda_graphs_f32_sampled_mean_code_match": mean("cuda_graphs_f32_sampled_vs_eager", "code_match_fraction"),
        "cuda_graph_errors": results.iter().flat_map(|r| r["cuda_graphs"].as_array().cloned().unwrap_or_default()).filter_map(|v| v.get("error").and_then(Value::as_str).map(str::to_string)).collect::<std::collections::BTreeSet<_>>(),
        "cpu_bf16_identical": results.iter().filter(|r| r["cpu_bf16_vs_cpu_f32"]["identical"] == true).count(),
        "cpu_bf16_mean_code_match": mean("cpu_bf16_vs_cpu_f32", "code_match_fraction"),
    });
    println!("summary: {summary}");
    let doc = json!({"bench": "omnitts-gpu-parity", "device": args.device, "summary": summary, "cases": results});
    match &args.json {
        Some(p) => std::fs::write(p, serde_json::to_string_pretty(&doc)?)
            .with_context(|| p.display().to_string())?,
        None => println!("{doc}"),
    }
    Ok(all_ok)
}
