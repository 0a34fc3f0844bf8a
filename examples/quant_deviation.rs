//! How far the quantized forms of stage 0's weights (`engine_args.quantization`, docs/cpu.md)
//! move the model from its dense f32 self: for each checkpoint, form and text, greedy decoding
//! with both, then
//! - the prefill logits' error (codebook 0's logits before the first frame, same input):
//!   relative L2 and largest absolute difference;
//! - the first frame whose 16 codes differ, and the code match rate over the frames both made
//!   (after a first difference the two utterances go their own ways, so this rate mostly measures
//!   how late the first difference comes);
//! - whether the first frame's codebook-0 code (the prefill argmax) is the same.
//!
//! ```sh
//! cargo run --release --example quant_deviation -- --model-dir tests/fixtures/tiny-customvoice \
//!     --model-dir models/omnitts-en --forms q8_0,q4_k --frames 40 --json /tmp/dev.json
//! ```

use std::path::PathBuf;

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use clap::Parser;
use gstomnitts::models::qwen3_tts::{
    ArModel, Checkpoint, SamplingParams, VoiceRequest, WeightForm,
};
use gstomnitts::nn::QuantizationSpec;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(about = "deviation of quantized stage-0 weights from dense f32")]
struct Args {
    /// Checkpoint directories (repeatable).
    #[arg(long, required = true)]
    model_dir: Vec<PathBuf>,
    /// Forms compared with dense, comma-separated (q8_0, q4_k, auto).
    #[arg(long, default_value = "q8_0,q4_k")]
    forms: String,
    /// Frames per utterance at most (greedy; EOS may end it earlier).
    #[arg(long, default_value_t = 40)]
    frames: usize,
    /// Texts (repeatable); default: four everyday sentences.
    #[arg(long)]
    text: Vec<String>,
    /// Write the results as JSON here too.
    #[arg(long)]
    json: Option<PathBuf>,
}

const TEXTS: [&str; 4] = [
    "The train to the coast leaves from platform four at ten past nine.",
    "Please put the olive oil back in the cupboard when you are done.",
    "It will be cloudy in the morning, with some sun in the afternoon.",
    "Could you send me the report before the meeting on Thursday?",
];

/// The prefill logits and the greedy frames of one text.
fn generate(
    m: &ArModel,
    ckpt: &Checkpoint,
    text: &str,
    frames: usize,
) -> Result<(Vec<f32>, Vec<Vec<u32>>)> {
    let speaker = m.speakers().into_iter().next();
    let voice = VoiceRequest {
        text: text.to_string(),
        speaker,
        language: Some("english".to_string()),
        instruct: None,
        prompt_mode: None,
        voice_clone: None,
    };
    let mut sampling = SamplingParams::from_generation_config(&ckpt.generation).greedy();
    sampling.max_new_tokens = frames + 1;
    let mut s = m.start(&voice, &sampling)?;
    let logits = s.pending_logits().to_vec();
    let (codes, _) = s.run_to_end()?;
    Ok((logits, codes))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let texts: Vec<String> = if args.text.is_empty() {
        TEXTS.iter().map(|t| t.to_string()).collect()
    } else {
        args.text.clone()
    };
    let mut results = Vec::new();
    println!(
        "| checkpoint | form | text | prefill logits rel L2 | max abs | first differing frame | code match | frame-0 code 0 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for dir in &args.model_dir {
        let ckpt = Checkpoint::open(dir).with_context(|| dir.display().to_string())?;
        let dense = ArModel::load(&ckpt, &Device::Cpu, DType::F32)?;
        let want: Vec<_> = texts
            .iter()
            .map(|t| generate(&dense, &ckpt, t, args.frames))
            .collect::<Result<_>>()?;
        for form in args.forms.split(',').map(str::trim) {
            let spec = QuantizationSpec::parse(form).with_context(|| format!("--forms {form}"))?;
            let m = ArModel::load_with(&ckpt, &Device::Cpu, DType::F32, spec)?;
            let weights = WeightForm::summary(&m.weight_forms());
            for (text, (want_logits, want_codes)) in texts.iter().zip(&want) {
                let (logits, codes) = generate(&m, &ckpt, text, args.frames)?;
                let diff: f64 = logits
                    .iter()
                    .zip(want_logits)
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum();
                let norm: f64 = want_logits.iter().map(|b| f64::from(*b).powi(2)).sum();
                let rel = (diff / norm).sqrt();
                let max_abs = logits
                    .iter()
                    .zip(want_logits)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                let n = codes.len().min(want_codes.len());
                let first_diff = (0..n).find(|&i| codes[i] != want_codes[i]);
                let groups = want_codes.first().map_or(0, Vec::len);
                let same: usize = (0..n)
                    .map(|i| {
                        codes[i]
                            .iter()
                            .zip(&want_codes[i])
                            .filter(|(a, b)| a == b)
                            .count()
                    })
                    .sum();
                let rate = same as f64 / (n * groups).max(1) as f64;
                let first_code = n > 0 && codes[0][0] == want_codes[0][0];
                let name = dir
                    .file_name()
                    .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into());
                println!(
                    "| {name} | {form} | {:.30} | {rel:.2e} | {max_abs:.3} | {} of {n} | {:.1} % | {} |",
                    text,
                    first_diff.map_or("none".to_string(), |f| f.to_string()),
                    rate * 100.0,
                    if first_code { "same" } else { "differs" }
                );
                results.push(json!({
                    "checkpoint": dir.display().to_string(),
                    "form": form,
                    "weights": weights,
                    "text": text,
                    "prefill_logits_rel_l2": rel,
                    "prefill_logits_max_abs": max_abs,
                    "frames": n,
                    "dense_frames": want_codes.len(),
                    "first_differing_frame": first_diff,
                    "code_match_rate": rate,
                    "frame0_code0_same": first_code,
                }));
            }
        }
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&results)?)?;
    }
    Ok(())
}
