//! Engine benchmark: time to first audio (TTFA) and per-stage ms per frame.
//!
//! ```sh
//! # tiny fixture checkpoints (tests/fixtures), CPU
//! cargo run --release --example bench
//! # the real 0.6B CustomVoice shapes with random weights (written to a temp dir, ~2.5 GB)
//! cargo run --release --example bench -- --random-weights --frames 24 --runs 2
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
//! `--random-weights` builds the real 0.6B CustomVoice layout (qwen3-tts.md §1.3, §1.5, §8): it
//! takes `config.json`, `generation_config.json`, the tokenizer files and
//! `speech_tokenizer/{config,preprocessor_config}.json` of the tiny CustomVoice fixture, replaces
//! the widths/depths by the real values, and writes `model.safetensors` (bf16) and
//! `speech_tokenizer/model.safetensors` (f32, decoder only) with seeded random values. The tensor
//! layout is derived from the configs; it is first checked against the tiny fixture's files.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Parser;
use gstomnitts::engine::{
    DeviceSpec, Engine, EngineOptions, EngineRequest, FinishReason, Metrics, StageConfig,
};
use gstomnitts::models::qwen3_tts::VoiceRequest;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "omnitts engine benchmark: TTFA and per-stage ms/frame")]
struct Args {
    /// Benchmark this checkpoint directory instead of the tiny fixtures.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Also benchmark random weights in the real 0.6B CustomVoice shapes.
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
}

/// Aggregated measurements of one (model, mode) configuration.
struct Row {
    model: String,
    mode: &'static str,
    load_s: f64,
    runs: Vec<Metrics>,
    retries: usize,
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
            "mode": self.mode,
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
    let mut rows = Vec::new();
    for mode in ["async", "batch"] {
        let mut cfg = if mode == "async" {
            StageConfig::default_async()
        } else {
            StageConfig::default_batch()
        };
        cfg.ar.guard.enabled = false;
        cfg.decoder.codec_chunk_frames = args.chunk;
        cfg.decoder.initial_codec_chunk_frames = args.initial_chunk;
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
            "{name} {mode}: loaded in {load_s:.1} s, CUDA graphs: {:?}",
            engine.cuda_graphs()
        );
        let mut voice = voice.clone();
        if voice.speaker.is_some() && engine.speakers().is_empty() {
            voice.speaker = None;
        }
        let mut row = Row {
            model: name.to_string(),
            mode,
            load_s,
            runs: Vec::new(),
            retries: 0,
        };
        let mut seed = 1u64;
        // One warm-up run, then the measured ones.
        for i in 0..=args.runs {
            let metrics = loop {
                let mut sampling = engine.default_sampling_params();
                sampling.do_sample = true;
                sampling.subtalker_do_sample = true;
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
                    FinishReason::Eos if row.retries < 20 => {
                        row.retries += 1;
                        continue;
                    }
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
        rows.push(row);
    }
    Ok(rows)
}

fn print_table(rows: &[Row], frames: usize) {
    println!();
    println!(
        "| model | mode | frames | TTFA ms | prefill ms | AR ms/frame | decoder ms/frame | RTF | load s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} | {:.1} | {:.1} | {:.2} | {:.2} | {:.3} | {:.1} |",
            r.model,
            r.mode,
            r.med(|m| m.frames as f64),
            r.med(|m| m.ttfa_ms.unwrap_or(f64::NAN)),
            r.med(|m| m.ar_prefill_ms),
            r.med(|m| m.ar_ms_per_frame),
            r.med(|m| m.decoder_ms_per_frame),
            r.med(|m| m.rtf),
            r.load_s
        );
    }
    println!(
        "(medians over the measured runs; {frames} frames = {:.2} s of audio; RTF = processing time / audio time)",
        frames as f64 * 0.08
    );
}

// ---------------------------------------------------------------------------------------------
// Random weights in the real layout

/// How a tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    /// Uniform with this standard deviation, mean 0.
    Normalish(f32),
    /// Every value equal.
    Const(f32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dt {
    Bf16,
    F32,
}

struct TensorSpec {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

fn spec(name: String, shape: Vec<usize>) -> TensorSpec {
    // Fan-in of a Linear [out, in] or Conv1d [out, in, k] weight.
    let fan_in: usize = shape.iter().skip(1).product::<usize>().max(1);
    let init = if name.ends_with("norm.weight") || name.ends_with("cluster_usage") {
        Init::Const(1.0)
    } else if name.ends_with(".bias") || name.ends_with(".alpha") || name.ends_with(".beta") {
        Init::Const(0.0)
    } else if name.ends_with("layer_scale.scale") {
        Init::Const(0.01)
    } else if name.ends_with(".gamma") {
        Init::Const(0.1)
    } else if name.ends_with("embedding.weight")
        || name.contains("codec_embedding.")
        || name.ends_with("embedding_sum")
    {
        Init::Normalish(1.0)
    } else {
        Init::Normalish(1.0 / (fan_in as f32).sqrt())
    };
    TensorSpec { name, shape, init }
}

fn get(v: &Value, path: &str) -> Result<usize> {
    let mut cur = v;
    for p in path.split('.') {
        cur = cur
            .get(p)
            .with_context(|| format!("config field {path} missing"))?;
    }
    cur.as_u64()
        .map(|x| x as usize)
        .with_context(|| format!("config field {path}: expected an integer, got {cur}"))
}

/// Widths of one transformer layer, from the config keys shared by the talker, the code
/// predictor and the codec decoder.
#[derive(Clone, Copy)]
struct LayerDims {
    d: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
}

fn layer_dims(c: &Value) -> Result<LayerDims> {
    Ok(LayerDims {
        d: get(c, "hidden_size")?,
        heads: get(c, "num_attention_heads")?,
        kv: get(c, "num_key_value_heads")?,
        hd: get(c, "head_dim")?,
        inter: get(c, "intermediate_size")?,
    })
}

fn push_transformer_layer(out: &mut Vec<TensorSpec>, p: &str, dims: &LayerDims, qk_norm: bool) {
    let LayerDims {
        d,
        heads,
        kv,
        hd,
        inter,
    } = *dims;
    let mut add = |n: &str, s: Vec<usize>| out.push(spec(format!("{p}.{n}"), s));
    add("self_attn.q_proj.weight", vec![heads * hd, d]);
    add("self_attn.k_proj.weight", vec![kv * hd, d]);
    add("self_attn.v_proj.weight", vec![kv * hd, d]);
    add("self_attn.o_proj.weight", vec![d, heads * hd]);
    if qk_norm {
        add("self_attn.q_norm.weight", vec![hd]);
        add("self_attn.k_norm.weight", vec![hd]);
    }
    add("mlp.gate_proj.weight", vec![inter, d]);
    add("mlp.up_proj.weight", vec![inter, d]);
    add("mlp.down_proj.weight", vec![d, inter]);
    add("input_layernorm.weight", vec![d]);
    add("post_attention_layernorm.weight", vec![d]);
}

/// Tensors of `model.safetensors` for a CustomVoice / VoiceDesign checkpoint (no speaker encoder).
fn talker_layout(cfg: &Value) -> Result<Vec<TensorSpec>> {
    let t = cfg.get("talker_config").context("talker_config missing")?;
    let d = get(t, "hidden_size")?;
    let cp = t
        .get("code_predictor_config")
        .context("code_predictor_config missing")?;
    let dc = get(cp, "hidden_size")?;
    let groups = get(t, "num_code_groups")?;
    let text_d = get(t, "text_hidden_size")?;
    let mut out = vec![spec(
        "talker.model.text_embedding.weight".into(),
        vec![get(t, "text_vocab_size")?, text_d],
    )];
    out.push(spec(
        "talker.model.codec_embedding.weight".into(),
        vec![get(t, "vocab_size")?, d],
    ));
    out.push(spec(
        "talker.text_projection.linear_fc1.weight".into(),
        vec![text_d, text_d],
    ));
    out.push(spec(
        "talker.text_projection.linear_fc1.bias".into(),
        vec![text_d],
    ));
    out.push(spec(
        "talker.text_projection.linear_fc2.weight".into(),
        vec![d, text_d],
    ));
    out.push(spec(
        "talker.text_projection.linear_fc2.bias".into(),
        vec![d],
    ));
    for i in 0..get(t, "num_hidden_layers")? {
        push_transformer_layer(
            &mut out,
            &format!("talker.model.layers.{i}"),
            &layer_dims(t)?,
            true,
        );
    }
    out.push(spec("talker.model.norm.weight".into(), vec![d]));
    out.push(spec(
        "talker.codec_head.weight".into(),
        vec![get(t, "vocab_size")?, d],
    ));
    for i in 0..get(cp, "num_hidden_layers")? {
        push_transformer_layer(
            &mut out,
            &format!("talker.code_predictor.model.layers.{i}"),
            &layer_dims(cp)?,
            true,
        );
    }
    out.push(spec(
        "talker.code_predictor.model.norm.weight".into(),
        vec![dc],
    ));
    let cp_vocab = get(cp, "vocab_size")?;
    for i in 0..groups - 1 {
        // The code predictor embeds codes in the talker's width (projected when widths differ).
        out.push(spec(
            format!("talker.code_predictor.model.codec_embedding.{i}.weight"),
            vec![cp_vocab, d],
        ));
        out.push(spec(
            format!("talker.code_predictor.lm_head.{i}.weight"),
            vec![cp_vocab, dc],
        ));
    }
    if dc != d {
        out.push(spec(
            "talker.code_predictor.small_to_mtp_projection.weight".into(),
            vec![dc, d],
        ));
        out.push(spec(
            "talker.code_predictor.small_to_mtp_projection.bias".into(),
            vec![dc],
        ));
    }
    Ok(out)
}

/// Decoder tensors of `speech_tokenizer/model.safetensors` (the encoder is not needed to decode).
fn decoder_layout(st: &Value) -> Result<Vec<TensorSpec>> {
    let c = st.get("decoder_config").context("decoder_config missing")?;
    let cb = get(c, "codebook_dim")? / 2;
    let latent = get(c, "latent_dim")?;
    let h = get(c, "hidden_size")?;
    let q = get(c, "num_quantizers")?;
    let mut out = Vec::new();
    let mut add = |n: String, s: Vec<usize>| out.push(spec(n, s));
    let cbd = get(c, "codebook_dim")?;
    for (group, layers) in [("rvq_first", 1), ("rvq_rest", q - 1)] {
        for i in 0..layers {
            let p = format!("decoder.quantizer.{group}.vq.layers.{i}._codebook");
            add(
                format!("{p}.embedding_sum"),
                vec![get(c, "codebook_size")?, cb],
            );
            add(format!("{p}.cluster_usage"), vec![get(c, "codebook_size")?]);
        }
        add(
            format!("decoder.quantizer.{group}.output_proj.weight"),
            vec![cbd, cb, 1],
        );
        add(
            format!("decoder.quantizer.{group}.input_proj.weight"),
            vec![cb, cbd, 1],
        );
    }
    add("decoder.pre_conv.conv.weight".into(), vec![latent, cbd, 3]);
    add("decoder.pre_conv.conv.bias".into(), vec![latent]);
    add(
        "decoder.pre_transformer.input_proj.weight".into(),
        vec![h, latent],
    );
    add("decoder.pre_transformer.input_proj.bias".into(), vec![h]);
    add(
        "decoder.pre_transformer.output_proj.weight".into(),
        vec![latent, h],
    );
    add(
        "decoder.pre_transformer.output_proj.bias".into(),
        vec![latent],
    );
    add("decoder.pre_transformer.norm.weight".into(), vec![h]);
    let dims = layer_dims(c)?;
    for i in 0..get(c, "num_hidden_layers")? {
        let p = format!("decoder.pre_transformer.layers.{i}");
        push_transformer_layer(&mut out, &p, &dims, false);
        out.push(spec(format!("{p}.self_attn_layer_scale.scale"), vec![h]));
        out.push(spec(format!("{p}.mlp_layer_scale.scale"), vec![h]));
    }
    let mut add = |n: String, s: Vec<usize>| out.push(spec(n, s));
    let ratios: Vec<usize> = serde_json::from_value(
        c.get("upsampling_ratios")
            .cloned()
            .context("upsampling_ratios")?,
    )?;
    for (i, r) in ratios.iter().enumerate() {
        let p = format!("decoder.upsample.{i}");
        add(format!("{p}.0.conv.weight"), vec![latent, latent, *r]);
        add(format!("{p}.0.conv.bias"), vec![latent]);
        add(format!("{p}.1.dwconv.conv.weight"), vec![latent, 1, 7]);
        add(format!("{p}.1.dwconv.conv.bias"), vec![latent]);
        add(format!("{p}.1.norm.weight"), vec![latent]);
        add(format!("{p}.1.norm.bias"), vec![latent]);
        add(format!("{p}.1.gamma"), vec![latent]);
        add(format!("{p}.1.pwconv1.weight"), vec![4 * latent, latent]);
        add(format!("{p}.1.pwconv1.bias"), vec![4 * latent]);
        add(format!("{p}.1.pwconv2.weight"), vec![latent, 4 * latent]);
        add(format!("{p}.1.pwconv2.bias"), vec![latent]);
    }
    let dd = get(c, "decoder_dim")?;
    add("decoder.decoder.0.conv.weight".into(), vec![dd, latent, 7]);
    add("decoder.decoder.0.conv.bias".into(), vec![dd]);
    let rates: Vec<usize> =
        serde_json::from_value(c.get("upsample_rates").cloned().context("upsample_rates")?)?;
    let mut ch = dd;
    for (i, r) in rates.iter().enumerate() {
        let p = format!("decoder.decoder.{}.block", i + 1);
        let o = ch / 2;
        add(format!("{p}.0.alpha"), vec![ch]);
        add(format!("{p}.0.beta"), vec![ch]);
        add(format!("{p}.1.conv.weight"), vec![ch, o, 2 * r]);
        add(format!("{p}.1.conv.bias"), vec![o]);
        for u in 2..5 {
            for a in ["act1", "act2"] {
                add(format!("{p}.{u}.{a}.alpha"), vec![o]);
                add(format!("{p}.{u}.{a}.beta"), vec![o]);
            }
            add(format!("{p}.{u}.conv1.conv.weight"), vec![o, o, 7]);
            add(format!("{p}.{u}.conv1.conv.bias"), vec![o]);
            add(format!("{p}.{u}.conv2.conv.weight"), vec![o, o, 1]);
            add(format!("{p}.{u}.conv2.conv.bias"), vec![o]);
        }
        ch = o;
    }
    let n = rates.len() + 1;
    add(format!("decoder.decoder.{n}.alpha"), vec![ch]);
    add(format!("decoder.decoder.{n}.beta"), vec![ch]);
    add(
        format!("decoder.decoder.{}.conv.weight", n + 1),
        vec![1, ch, 7],
    );
    add(format!("decoder.decoder.{}.conv.bias", n + 1), vec![1]);
    Ok(out)
}

/// Names and shapes in a safetensors file's header.
fn read_header(path: &Path) -> Result<BTreeMap<String, Vec<usize>>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(bytes.len() >= 8, "{}: too short", path.display());
    let n = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let h: Value = serde_json::from_slice(&bytes[8..8 + n])?;
    let mut out = BTreeMap::new();
    for (k, v) in h.as_object().context("header")? {
        if k == "__metadata__" {
            continue;
        }
        let shape: Vec<usize> = serde_json::from_value(v["shape"].clone())?;
        out.insert(k.clone(), shape);
    }
    Ok(out)
}

/// Checks the layout functions against a real-format checkpoint (the tiny fixture).
fn check_layout(dir: &Path) -> Result<()> {
    let cfg: Value = serde_json::from_slice(&fs::read(dir.join("config.json"))?)?;
    let st: Value = serde_json::from_slice(&fs::read(dir.join("speech_tokenizer/config.json"))?)?;
    let cases = [
        (
            talker_layout(&cfg)?,
            read_header(&dir.join("model.safetensors"))?,
            "model.safetensors",
            "",
        ),
        (
            decoder_layout(&st)?,
            read_header(&dir.join("speech_tokenizer/model.safetensors"))?,
            "speech_tokenizer/model.safetensors",
            "decoder.",
        ),
    ];
    for (mine, theirs, file, prefix) in cases {
        let theirs: BTreeMap<_, _> = theirs
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix) && !k.starts_with("speaker_encoder."))
            .collect();
        let mine: BTreeMap<_, _> = mine.into_iter().map(|t| (t.name, t.shape)).collect();
        ensure!(
            mine == theirs,
            "layout of {file} differs from {}: mine {} tensors, fixture {}; first difference {:?}",
            dir.display(),
            mine.len(),
            theirs.len(),
            mine.iter().zip(theirs.iter()).find(|(a, b)| a != b)
        );
    }
    Ok(())
}

/// Writes a safetensors file tensor by tensor (no full copy in memory).
fn write_safetensors(path: &Path, tensors: &[TensorSpec], dt: Dt, seed: u64) -> Result<u64> {
    let esize = match dt {
        Dt::Bf16 => 2,
        Dt::F32 => 4,
    };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        let n: usize = t.shape.iter().product();
        header.insert(
            t.name.clone(),
            json!({
                "dtype": if dt == Dt::Bf16 { "BF16" } else { "F32" },
                "shape": t.shape,
                "data_offsets": [off, off + n * esize],
            }),
        );
        off += n * esize;
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut f = BufWriter::with_capacity(
        1 << 22,
        File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    f.write_all(&(h.len() as u64).to_le_bytes())?;
    f.write_all(&h)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut buf: Vec<u8> = Vec::new();
    for t in tensors {
        let n: usize = t.shape.iter().product();
        buf.clear();
        buf.reserve(n * esize);
        // Uniform in [-a, a] has standard deviation a / sqrt(3).
        let draw = |rng: &mut ChaCha8Rng| -> f32 {
            match t.init {
                Init::Const(c) => c,
                Init::Normalish(std) => (rng.random::<f32>() * 2.0 - 1.0) * std * 3f32.sqrt(),
            }
        };
        for _ in 0..n {
            let x = draw(&mut rng);
            match dt {
                Dt::Bf16 => buf.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
                Dt::F32 => buf.extend_from_slice(&x.to_le_bytes()),
            }
        }
        f.write_all(&buf)?;
    }
    f.flush()?;
    Ok(off as u64)
}

fn set(v: &mut Value, path: &str, x: Value) -> Result<()> {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = cur
            .get_mut(*p)
            .with_context(|| format!("config field {path}"))?;
    }
    let obj = cur
        .as_object_mut()
        .with_context(|| format!("config field {path}"))?;
    obj.insert(parts[parts.len() - 1].to_string(), x);
    Ok(())
}

/// Builds the random 0.6B CustomVoice checkpoint in `dir` from the tiny fixture's files.
fn build_random_0b6(template: &Path, dir: &Path) -> Result<()> {
    check_layout(template).context("layout generator self-check against the tiny fixture")?;
    fs::create_dir_all(dir.join("speech_tokenizer"))?;
    for f in [
        "generation_config.json",
        "vocab.json",
        "merges.txt",
        "tokenizer_config.json",
        "speech_tokenizer/preprocessor_config.json",
    ] {
        fs::copy(template.join(f), dir.join(f)).with_context(|| format!("copying {f}"))?;
    }
    // config.json: qwen3-tts.md §1.3, 0.6B column.
    let mut cfg: Value = serde_json::from_slice(&fs::read(template.join("config.json"))?)?;
    for (k, v) in [
        ("talker_config.hidden_size", json!(1024)),
        ("talker_config.intermediate_size", json!(3072)),
        ("talker_config.num_hidden_layers", json!(28)),
        ("talker_config.num_attention_heads", json!(16)),
        ("talker_config.num_key_value_heads", json!(8)),
        ("talker_config.head_dim", json!(128)),
        ("talker_config.text_hidden_size", json!(2048)),
        (
            "talker_config.rope_scaling.mrope_section",
            json!([24, 20, 20]),
        ),
        (
            "talker_config.code_predictor_config.hidden_size",
            json!(1024),
        ),
        (
            "talker_config.code_predictor_config.intermediate_size",
            json!(3072),
        ),
        (
            "talker_config.code_predictor_config.num_hidden_layers",
            json!(5),
        ),
        (
            "talker_config.code_predictor_config.num_attention_heads",
            json!(16),
        ),
        (
            "talker_config.code_predictor_config.num_key_value_heads",
            json!(8),
        ),
        ("talker_config.code_predictor_config.head_dim", json!(128)),
        ("speaker_encoder_config.enc_dim", json!(1024)),
        ("tts_model_size", json!("0b6")),
        ("tts_model_type", json!("custom_voice")),
    ] {
        set(&mut cfg, k, v)?;
    }
    fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg)?)?;
    // speech_tokenizer/config.json: §1.5.
    let mut st: Value =
        serde_json::from_slice(&fs::read(template.join("speech_tokenizer/config.json"))?)?;
    for (k, v) in [
        ("decoder_config.codebook_dim", json!(512)),
        ("decoder_config.latent_dim", json!(1024)),
        ("decoder_config.hidden_size", json!(512)),
        ("decoder_config.intermediate_size", json!(1024)),
        ("decoder_config.num_hidden_layers", json!(8)),
        ("decoder_config.num_attention_heads", json!(16)),
        ("decoder_config.num_key_value_heads", json!(16)),
        ("decoder_config.head_dim", json!(64)),
        ("decoder_config.decoder_dim", json!(1536)),
    ] {
        set(&mut st, k, v)?;
    }
    fs::write(
        dir.join("speech_tokenizer/config.json"),
        serde_json::to_vec_pretty(&st)?,
    )?;
    let t = Instant::now();
    let talker = talker_layout(&cfg)?;
    let params: usize = talker
        .iter()
        .map(|t| t.shape.iter().product::<usize>())
        .sum();
    let bytes = write_safetensors(&dir.join("model.safetensors"), &talker, Dt::Bf16, 1)?;
    let dec = decoder_layout(&st)?;
    let dparams: usize = dec.iter().map(|t| t.shape.iter().product::<usize>()).sum();
    let dbytes = write_safetensors(
        &dir.join("speech_tokenizer/model.safetensors"),
        &dec,
        Dt::F32,
        2,
    )?;
    eprintln!(
        "random 0.6B CustomVoice in {}: talker+code predictor {:.1} M params ({:.2} GB bf16), decoder {:.1} M params ({:.2} GB f32), written in {:.1} s",
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
            std::env::temp_dir().join(format!("omnitts-bench-0b6-{}", std::process::id()))
        });
        build_random_0b6(&fixtures.join("tiny-customvoice"), &dir)?;
        let r = bench_model(
            &args,
            "random-0.6B-CustomVoice",
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
