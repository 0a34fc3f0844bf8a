//! A random-weight Qwen3-TTS CustomVoice checkpoint in the real layout (0.6B / 1.7B shapes,
//! docs/qwen3-tts.md
//! §1.3, §1.5), for the benchmarks: configs and tokenizer files from the tiny CustomVoice fixture with the
//! real widths and depths, and the tensor list (names and shapes) derived from the configs, checked against
//! the tiny fixture's files before use. Random values as the reference's `init_random_`: N(0, 0.02²),
//! norm weights and codebook `cluster_usage` 1. Shared by `bench.rs` (values written on the CPU,
//! [`write_seeded`]) and `bench_gpu.rs` (values made on the GPU).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use candle_core::DType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

/// How a tensor is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Every value equal.
    Const(f32),
    /// Mean 0, this standard deviation.
    Normal(f32),
}

/// One tensor of a checkpoint file.
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub init: Init,
}

pub fn spec(name: String, shape: Vec<usize>) -> TensorSpec {
    let init = if name.ends_with("norm.weight") || name.ends_with("cluster_usage") {
        Init::Const(1.0)
    } else {
        Init::Normal(0.02)
    };
    TensorSpec { name, shape, init }
}

pub fn get(v: &Value, path: &str) -> Result<usize> {
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

pub fn set(v: &mut Value, path: &str, x: Value) -> Result<()> {
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for p in &parts[..parts.len() - 1] {
        cur = cur
            .get_mut(*p)
            .with_context(|| format!("config field {path}"))?;
    }
    cur.as_object_mut()
        .with_context(|| format!("config field {path}"))?
        .insert(parts[parts.len() - 1].to_string(), x);
    Ok(())
}

/// One Qwen3 decoder layer: `(d, heads, kv heads, head_dim, intermediate, q/k norm)`.
pub fn layer(out: &mut Vec<TensorSpec>, p: &str, dims: (usize, usize, usize, usize, usize, bool)) {
    let (d, h, kv, hd, inter, qk_norm) = dims;
    let mut add = |n: &str, s: Vec<usize>| out.push(spec(format!("{p}.{n}"), s));
    add("self_attn.q_proj.weight", vec![h * hd, d]);
    add("self_attn.k_proj.weight", vec![kv * hd, d]);
    add("self_attn.v_proj.weight", vec![kv * hd, d]);
    add("self_attn.o_proj.weight", vec![d, h * hd]);
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

pub fn stack_dims(c: &Value, qk_norm: bool) -> Result<(usize, usize, usize, usize, usize, bool)> {
    Ok((
        get(c, "hidden_size")?,
        get(c, "num_attention_heads")?,
        get(c, "num_key_value_heads")?,
        get(c, "head_dim")?,
        get(c, "intermediate_size")?,
        qk_norm,
    ))
}

/// `model.safetensors` of a CustomVoice checkpoint (talker + code predictor; no speaker encoder).
pub fn talker_layout(cfg: &Value) -> Result<Vec<TensorSpec>> {
    let t = cfg.get("talker_config").context("talker_config")?;
    let cp = t
        .get("code_predictor_config")
        .context("code_predictor_config")?;
    let (d, dc) = (get(t, "hidden_size")?, get(cp, "hidden_size")?);
    let td = get(t, "text_hidden_size")?;
    let vocab = get(t, "vocab_size")?;
    let mut out = vec![
        spec(
            "talker.model.text_embedding.weight".into(),
            vec![get(t, "text_vocab_size")?, td],
        ),
        spec("talker.model.codec_embedding.weight".into(), vec![vocab, d]),
        spec(
            "talker.text_projection.linear_fc1.weight".into(),
            vec![td, td],
        ),
        spec("talker.text_projection.linear_fc1.bias".into(), vec![td]),
        spec(
            "talker.text_projection.linear_fc2.weight".into(),
            vec![d, td],
        ),
        spec("talker.text_projection.linear_fc2.bias".into(), vec![d]),
    ];
    for i in 0..get(t, "num_hidden_layers")? {
        layer(
            &mut out,
            &format!("talker.model.layers.{i}"),
            stack_dims(t, true)?,
        );
    }
    out.push(spec("talker.model.norm.weight".into(), vec![d]));
    out.push(spec("talker.codec_head.weight".into(), vec![vocab, d]));
    for i in 0..get(cp, "num_hidden_layers")? {
        layer(
            &mut out,
            &format!("talker.code_predictor.model.layers.{i}"),
            stack_dims(cp, true)?,
        );
    }
    out.push(spec(
        "talker.code_predictor.model.norm.weight".into(),
        vec![dc],
    ));
    let cpv = get(cp, "vocab_size")?;
    for i in 0..get(t, "num_code_groups")? - 1 {
        out.push(spec(
            format!("talker.code_predictor.model.codec_embedding.{i}.weight"),
            vec![cpv, d],
        ));
        out.push(spec(
            format!("talker.code_predictor.lm_head.{i}.weight"),
            vec![cpv, dc],
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

/// The decoder tensors of `speech_tokenizer/model.safetensors` (the encoder is not needed).
pub fn decoder_layout(st: &Value) -> Result<Vec<TensorSpec>> {
    let c = st.get("decoder_config").context("decoder_config")?;
    let cbd = get(c, "codebook_dim")?;
    let cb = cbd / 2;
    let (latent, h, q) = (
        get(c, "latent_dim")?,
        get(c, "hidden_size")?,
        get(c, "num_quantizers")?,
    );
    let size = get(c, "codebook_size")?;
    let mut out = Vec::new();
    let add = |out: &mut Vec<TensorSpec>, n: String, s: Vec<usize>| out.push(spec(n, s));
    for (group, layers) in [("rvq_first", 1), ("rvq_rest", q - 1)] {
        for i in 0..layers {
            let p = format!("decoder.quantizer.{group}.vq.layers.{i}._codebook");
            add(&mut out, format!("{p}.embedding_sum"), vec![size, cb]);
            add(&mut out, format!("{p}.cluster_usage"), vec![size]);
        }
        add(
            &mut out,
            format!("decoder.quantizer.{group}.output_proj.weight"),
            vec![cbd, cb, 1],
        );
        add(
            &mut out,
            format!("decoder.quantizer.{group}.input_proj.weight"),
            vec![cb, cbd, 1],
        );
    }
    add(
        &mut out,
        "decoder.pre_conv.conv.weight".into(),
        vec![latent, cbd, 3],
    );
    add(&mut out, "decoder.pre_conv.conv.bias".into(), vec![latent]);
    let pt = "decoder.pre_transformer";
    add(&mut out, format!("{pt}.input_proj.weight"), vec![h, latent]);
    add(&mut out, format!("{pt}.input_proj.bias"), vec![h]);
    add(
        &mut out,
        format!("{pt}.output_proj.weight"),
        vec![latent, h],
    );
    add(&mut out, format!("{pt}.output_proj.bias"), vec![latent]);
    add(&mut out, format!("{pt}.norm.weight"), vec![h]);
    for i in 0..get(c, "num_hidden_layers")? {
        let p = format!("{pt}.layers.{i}");
        layer(&mut out, &p, stack_dims(c, false)?);
        add(
            &mut out,
            format!("{p}.self_attn_layer_scale.scale"),
            vec![h],
        );
        add(&mut out, format!("{p}.mlp_layer_scale.scale"), vec![h]);
    }
    let ratios: Vec<usize> = serde_json::from_value(
        c.get("upsampling_ratios")
            .cloned()
            .context("upsampling_ratios")?,
    )?;
    for (i, r) in ratios.iter().enumerate() {
        let p = format!("decoder.upsample.{i}");
        add(
            &mut out,
            format!("{p}.0.conv.weight"),
            vec![latent, latent, *r],
        );
        add(&mut out, format!("{p}.0.conv.bias"), vec![latent]);
        add(
            &mut out,
            format!("{p}.1.dwconv.conv.weight"),
            vec![latent, 1, 7],
        );
        add(&mut out, format!("{p}.1.dwconv.conv.bias"), vec![latent]);
        add(&mut out, format!("{p}.1.norm.weight"), vec![latent]);
        add(&mut out, format!("{p}.1.norm.bias"), vec![latent]);
        add(&mut out, format!("{p}.1.gamma"), vec![latent]);
        add(
            &mut out,
            format!("{p}.1.pwconv1.weight"),
            vec![4 * latent, latent],
        );
        add(&mut out, format!("{p}.1.pwconv1.bias"), vec![4 * latent]);
        add(
            &mut out,
            format!("{p}.1.pwconv2.weight"),
            vec![latent, 4 * latent],
        );
        add(&mut out, format!("{p}.1.pwconv2.bias"), vec![latent]);
    }
    let dd = get(c, "decoder_dim")?;
    add(
        &mut out,
        "decoder.decoder.0.conv.weight".into(),
        vec![dd, latent, 7],
    );
    add(&mut out, "decoder.decoder.0.conv.bias".into(), vec![dd]);
    let rates: Vec<usize> =
        serde_json::from_value(c.get("upsample_rates").cloned().context("upsample_rates")?)?;
    let mut ch = dd;
    for (i, r) in rates.iter().enumerate() {
        let p = format!("decoder.decoder.{}.block", i + 1);
        let o = ch / 2;
        add(&mut out, format!("{p}.0.alpha"), vec![ch]);
        add(&mut out, format!("{p}.0.beta"), vec![ch]);
        add(&mut out, format!("{p}.1.conv.weight"), vec![ch, o, 2 * r]);
        add(&mut out, format!("{p}.1.conv.bias"), vec![o]);
        for u in 2..5 {
            for a in ["act1", "act2"] {
                add(&mut out, format!("{p}.{u}.{a}.alpha"), vec![o]);
                add(&mut out, format!("{p}.{u}.{a}.beta"), vec![o]);
            }
            add(
                &mut out,
                format!("{p}.{u}.conv1.conv.weight"),
                vec![o, o, 7],
            );
            add(&mut out, format!("{p}.{u}.conv1.conv.bias"), vec![o]);
            add(
                &mut out,
                format!("{p}.{u}.conv2.conv.weight"),
                vec![o, o, 1],
            );
            add(&mut out, format!("{p}.{u}.conv2.conv.bias"), vec![o]);
        }
        ch = o;
    }
    let n = rates.len() + 1;
    add(&mut out, format!("decoder.decoder.{n}.alpha"), vec![ch]);
    add(&mut out, format!("decoder.decoder.{n}.beta"), vec![ch]);
    add(
        &mut out,
        format!("decoder.decoder.{}.conv.weight", n + 1),
        vec![1, ch, 7],
    );
    add(
        &mut out,
        format!("decoder.decoder.{}.conv.bias", n + 1),
        vec![1],
    );
    Ok(out)
}

pub fn read_header(path: &Path) -> Result<BTreeMap<String, Vec<usize>>> {
    let bytes = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(bytes.len() >= 8, "{}: too short", path.display());
    let n = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let h: Value = serde_json::from_slice(bytes.get(8..8 + n).context("header length")?)?;
    let mut out = BTreeMap::new();
    for (k, v) in h.as_object().context("header")? {
        if k != "__metadata__" {
            out.insert(k.clone(), serde_json::from_value(v["shape"].clone())?);
        }
    }
    Ok(out)
}

/// The layout functions must reproduce the tiny fixture's files exactly (names and shapes).
pub fn check_layout(dir: &Path) -> Result<()> {
    let cfg: Value = serde_json::from_slice(&fs::read(dir.join("config.json"))?)?;
    let st: Value = serde_json::from_slice(&fs::read(dir.join("speech_tokenizer/config.json"))?)?;
    for (mine, file, prefix) in [
        (talker_layout(&cfg)?, "model.safetensors", "talker."),
        (
            decoder_layout(&st)?,
            "speech_tokenizer/model.safetensors",
            "decoder.",
        ),
    ] {
        let theirs: BTreeMap<_, _> = read_header(&dir.join(file))?
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .collect();
        let mine: BTreeMap<_, _> = mine.into_iter().map(|t| (t.name, t.shape)).collect();
        ensure!(
            mine == theirs,
            "layout of {file} differs from {}: {} vs {} tensors, first difference {:?}",
            dir.display(),
            mine.len(),
            theirs.len(),
            mine.iter().zip(theirs.iter()).find(|(a, b)| a != b)
        );
    }
    Ok(())
}

/// Writes everything of a CustomVoice checkpoint of `size` (`0.6b` | `1.7b`, docs/qwen3-tts.md
/// §1.3, §1.5)
/// into `dir` but the weights: `config.json` and `speech_tokenizer/config.json` with the real widths and
/// depths, and the tokenizer, generation and preprocessor files of `template` (the tiny CustomVoice
/// fixture), after checking the layout functions against the template's files. Returns the two
/// configs (main, speech tokenizer) for [`talker_layout`] and [`decoder_layout`].
pub fn write_configs(size: &str, template: &Path, dir: &Path) -> Result<(Value, Value)> {
    check_layout(template).context("layout self-check against the tiny fixture")?;
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
    // docs/qwen3-tts.md §1.3.
    let (d, inter, tag) = match size {
        "0.6b" => (1024, 3072, "0b6"),
        "1.7b" => (2048, 6144, "1b7"),
        other => bail!("unknown size {other:?} (0.6b | 1.7b)"),
    };
    let mut cfg: Value = serde_json::from_slice(&fs::read(template.join("config.json"))?)?;
    let tc = "talker_config";
    let cp = "talker_config.code_predictor_config";
    for (k, v) in [
        (format!("{tc}.hidden_size"), json!(d)),
        (format!("{tc}.intermediate_size"), json!(inter)),
        (format!("{tc}.num_hidden_layers"), json!(28)),
        (format!("{tc}.num_attention_heads"), json!(16)),
        (format!("{tc}.num_key_value_heads"), json!(8)),
        (format!("{tc}.head_dim"), json!(128)),
        (format!("{tc}.text_hidden_size"), json!(2048)),
        (
            format!("{tc}.rope_scaling.mrope_section"),
            json!([24, 20, 20]),
        ),
        (format!("{cp}.hidden_size"), json!(1024)),
        (format!("{cp}.intermediate_size"), json!(3072)),
        (format!("{cp}.num_hidden_layers"), json!(5)),
        (format!("{cp}.num_attention_heads"), json!(16)),
        (format!("{cp}.num_key_value_heads"), json!(8)),
        (format!("{cp}.head_dim"), json!(128)),
        ("speaker_encoder_config.enc_dim".into(), json!(d)),
        ("tts_model_size".into(), json!(tag)),
        ("tts_model_type".into(), json!("custom_voice")),
    ] {
        set(&mut cfg, &k, v)?;
    }
    fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&cfg)?)?;
    // §1.5 (identical for both sizes).
    let mut st: Value =
        serde_json::from_slice(&fs::read(template.join("speech_tokenizer/config.json"))?)?;
    for (k, v) in [
        ("codebook_dim", 512),
        ("latent_dim", 1024),
        ("hidden_size", 512),
        ("intermediate_size", 1024),
        ("num_hidden_layers", 8),
        ("num_attention_heads", 16),
        ("num_key_value_heads", 16),
        ("head_dim", 64),
        ("decoder_dim", 1536),
    ] {
        set(&mut st, &format!("decoder_config.{k}"), json!(v))?;
    }
    fs::write(
        dir.join("speech_tokenizer/config.json"),
        serde_json::to_vec_pretty(&st)?,
    )?;
    Ok((cfg, st))
}

/// Writes a safetensors file tensor by tensor (no full copy in memory).
/// Writes `tensors` with seeded random values (ChaCha8, CPU) as a safetensors file in `dtype`
/// (bf16 or f32), tensor by tensor (no full copy in memory). [`Init::Normal`] draws uniformly with
/// that standard deviation. Returns the bytes of tensor data written.
pub fn write_seeded(path: &Path, tensors: &[TensorSpec], dtype: DType, seed: u64) -> Result<u64> {
    let bf16 = match dtype {
        DType::BF16 => true,
        DType::F32 => false,
        other => bail!("write_seeded: dtype {other:?} (bf16 | f32)"),
    };
    let esize = if bf16 { 2 } else { 4 };
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        let n: usize = t.shape.iter().product();
        header.insert(
            t.name.clone(),
            json!({
                "dtype": if bf16 { "BF16" } else { "F32" },
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
                Init::Normal(std) => (rng.random::<f32>() * 2.0 - 1.0) * std * 3f32.sqrt(),
            }
        };
        for _ in 0..n {
            let x = draw(&mut rng);
            if bf16 {
                buf.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes());
            } else {
                buf.extend_from_slice(&x.to_le_bytes());
            }
        }
        f.write_all(&buf)?;
    }
    f.flush()?;
    Ok(off as u64)
}
