//! Fish S2 Pro on another device against the CPU, greedy, on any checkpoint in the real layout
//! (the CPU path is the one the parity tests hold to the official reference):
//!
//! - stage 0 in f32 on `--device` against the CPU: each text alone, the same frames (codes);
//! - the texts batched in one `next_frames` per step on `--device` (the slow AR's batched rows,
//!   the fast AR over all rows) against each text alone there;
//! - bf16 on `--device` against f32 there: the share of frames that agree (reported; bf16 is
//!   not expected to keep every greedy choice);
//! - the codec's decode of the CPU's codes on `--device` against the CPU (relative L2).
//!
//! Prints one line per check and a JSON summary; exits non-zero when an exact check fails.
//!
//! ```sh
//! fish_check --model-dir /tmp/fish-small --device cuda:0 --frames 40
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use clap::Parser;
use gstomnitts::engine::DeviceSpec;
use gstomnitts::models::fish_speech::FishAr;
use gstomnitts::models::fish_speech::codec::Codec;
use gstomnitts::models::tts::{
    ArStep, SamplingParams, Stage0Model, Stage0Options, Stage0Prefill, VoiceRequest,
};
use gstomnitts::nn::QuantizationSpec;

#[derive(Parser, Debug)]
struct Args {
    /// A Fish S2 Pro checkpoint directory.
    #[arg(long)]
    model_dir: PathBuf,
    /// The device to check against the CPU (`cuda:0`).
    #[arg(long, default_value = "cuda:0")]
    device: String,
    /// Frames per text at most.
    #[arg(long, default_value_t = 40)]
    frames: usize,
}

const TEXTS: [&str; 3] = [
    "The morning train was late again, so we walked to the station together.",
    "A light rain fell over the harbour.",
    "请把水壶放上，再拿两个杯子到窗边的桌子上。",
];

fn greedy(frames: usize) -> SamplingParams {
    SamplingParams::plain_greedy(frames + 1, 1)
}

fn load(dir: &std::path::Path, device: &Device, dtype: DType) -> Result<FishAr> {
    FishAr::load(
        dir,
        device,
        &Stage0Options {
            dtype,
            quantization: QuantizationSpec::Auto,
        },
    )
    .with_context(|| format!("loading {} on {device:?} in {dtype:?}", dir.display()))
}

/// The frames of each text, all texts in one batch per step (one text: alone).
fn frames(ar: &FishAr, texts: &[&str], max: usize) -> Result<Vec<Vec<Vec<u32>>>> {
    let mut sessions = Vec::with_capacity(texts.len());
    for t in texts {
        let voice = VoiceRequest {
            text: t.to_string(),
            ..Default::default()
        };
        let mut p = ar.begin(&voice, &greedy(max))?;
        while !p.step(512)? {}
        sessions.push(p.into_session()?);
    }
    let mut out: Vec<Vec<Vec<u32>>> = vec![Vec::new(); texts.len()];
    let mut live: Vec<usize> = (0..texts.len()).collect();
    while !live.is_empty() {
        let mut rows: Vec<_> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| live.contains(i))
            .map(|(_, s)| s)
            .collect();
        let steps = ar.next_frames(&mut rows);
        let mut still = Vec::with_capacity(live.len());
        for (&i, step) in live.iter().zip(steps) {
            match step? {
                ArStep::Frame(f) => {
                    out[i].push(f);
                    still.push(i);
                }
                ArStep::Finished(_) => {}
            }
        }
        live = still;
    }
    Ok(out)
}

/// Frames of `a` equal to `b` at the same index, and the first that differs.
fn agreement(a: &[Vec<u32>], b: &[Vec<u32>]) -> (usize, Option<usize>) {
    let same = a.iter().zip(b).filter(|(x, y)| x == y).count();
    let first = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i));
    (same, first)
}

fn main() -> Result<()> {
    let args = Args::parse();
    // `cpu` checks the CPU against itself (a smoke test of this program).
    let dev = args.device.parse::<DeviceSpec>()?.open()?;
    let dir = &args.model_dir;
    let mut failed = Vec::new();
    let mut report = serde_json::Map::new();

    let cpu = load(dir, &Device::Cpu, DType::F32)?;
    let want: Vec<Vec<Vec<u32>>> = TEXTS
        .iter()
        .map(|t| frames(&cpu, &[t], args.frames).map(|mut f| f.remove(0)))
        .collect::<Result<_>>()?;
    drop(cpu);

    let gpu = load(dir, &dev, DType::F32)?;
    for (i, t) in TEXTS.iter().enumerate() {
        let got = frames(&gpu, &[t], args.frames)?.remove(0);
        let (same, first) = agreement(&got, &want[i]);
        println!(
            "f32 {} vs cpu, text {i}: {same}/{} frames equal, first difference {first:?}",
            args.device,
            want[i].len()
        );
        if first.is_some() {
            failed.push(format!("f32 text {i}"));
        }
        report.insert(format!("f32_text{i}_first_difference"), first.into());
    }
    let batched = frames(&gpu, &TEXTS, args.frames)?;
    for (i, b) in batched.iter().enumerate() {
        let solo = frames(&gpu, &[TEXTS[i]], args.frames)?.remove(0);
        let (same, first) = agreement(b, &solo);
        println!(
            "batched {} vs alone, text {i}: {same}/{} frames equal, first difference {first:?}",
            TEXTS.len(),
            solo.len()
        );
        if first.is_some() {
            failed.push(format!("batched text {i}"));
        }
        report.insert(format!("batched_text{i}_first_difference"), first.into());
    }
    drop(gpu);

    // With OMNITTS_FISH_GRAPHS=1: the frame on its CUDA graphs (graphs.rs: the slow AR's step
    // and the fast AR's positions) against the eager frames, alone (bucket 1: the same
    // products, so the same frames) and batched (a padded bucket: GEMMs over more rows,
    // reported).
    if std::env::var("OMNITTS_FISH_GRAPHS").as_deref() == Ok("1") {
        let mut graphed = load(dir, &dev, DType::F32)?;
        match graphed.enable_batch_graphs(TEXTS.len()) {
            Ok(buckets) => {
                let (slow, fast) = graphed.graphs();
                println!(
                    "frame graphs captured (slow AR step {slow}, fast AR {fast}), batch buckets {buckets:?}"
                );
                report.insert("graphs_slow_ar".into(), slow.into());
                for (i, t) in TEXTS.iter().enumerate() {
                    let got = frames(&graphed, &[t], args.frames)?.remove(0);
                    let (same, first) = agreement(&got, &want[i]);
                    println!(
                        "graphs alone vs cpu, text {i}: {same}/{} frames equal, first difference {first:?}",
                        want[i].len()
                    );
                    if first.is_some() {
                        failed.push(format!("graphs text {i}"));
                    }
                    report.insert(format!("graphs_text{i}_first_difference"), first.into());
                }
                let on_graphs = frames(&graphed, &TEXTS, args.frames)?;
                for (i, (g, b)) in on_graphs.iter().zip(&batched).enumerate() {
                    let (same, first) = agreement(g, b);
                    println!(
                        "graphs batched vs eager batched, text {i}: {same}/{} frames equal, first difference {first:?}",
                        b.len()
                    );
                    report.insert(format!("graphs_batched_text{i}_equal"), same.into());
                }
            }
            Err(e) => {
                println!("fast AR graphs: {e}");
                failed.push("graphs capture".into());
            }
        }
    }

    let bf16 = load(dir, &dev, DType::BF16)?;
    let mut agree = 0;
    let mut total = 0;
    for (i, t) in TEXTS.iter().enumerate() {
        let got = frames(&bf16, &[t], args.frames)?.remove(0);
        let (same, first) = agreement(&got, &want[i]);
        println!(
            "bf16 vs f32 cpu, text {i}: {same}/{} frames equal, first difference {first:?}",
            want[i].len()
        );
        agree += same;
        total += want[i].len();
    }
    report.insert("bf16_frames_equal".into(), agree.into());
    report.insert("bf16_frames".into(), total.into());
    drop(bf16);

    let codes: Vec<Vec<u32>> = (0..want[0].first().map_or(0, Vec::len))
        .map(|c| want[0].iter().map(|f| f[c]).collect())
        .collect();
    let cpu_codec = Codec::load(dir, &Device::Cpu)?;
    let gpu_codec = Codec::load(dir, &dev)?;
    let a = cpu_codec.decode(&codes)?;
    let b = gpu_codec.decode(&codes)?;
    let err: f64 = a
        .iter()
        .zip(&b)
        .map(|(x, y)| ((x - y) as f64).powi(2))
        .sum::<f64>()
        .sqrt()
        / a.iter()
            .map(|x| (*x as f64).powi(2))
            .sum::<f64>()
            .sqrt()
            .max(1e-30);
    println!(
        "codec decode {} vs cpu: {} vs {} samples, relative L2 {err:.3e}",
        args.device,
        b.len(),
        a.len()
    );
    if a.len() != b.len() || err.is_nan() || err >= 1e-4 {
        failed.push("codec".into());
    }
    report.insert("codec_rel_l2".into(), err.into());
    report.insert("failed".into(), failed.clone().into());
    println!("{}", serde_json::Value::Object(report));
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
