//! The 12 Hz codec's encoder (reference audio → codes), used by Base voice cloning
//! (docs/qwen3-tts.md §7.5).
//!
//! Reference: `Qwen3TTSTokenizerV2Encoder` (= transformers `MimiModel` without its decoder parts)
//! and `Qwen3TTSTokenizerV2Model.encode` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`; the Mimi semantics are those
//! of transformers 4.57.3 `models/mimi/modeling_mimi.py` (`MimiConv1d`, `MimiResnetBlock`,
//! `MimiEncoder`, `MimiTransformerModel`, `MimiSplitResidualVectorQuantizer`). Weights at
//! `encoder.*` in `speech_tokenizer/model.safetensors` (f32), config `encoder_config` in
//! `speech_tokenizer/config.json`.
//!
//! Pipeline on `[1, 1, samples]` at 24 kHz:
//! 1. SEANet conv encoder (`encoder.encoder.layers.*`): causal convs (left zero padding
//!    `k_eff − stride`, right zero padding up to a whole number of strides), residual units
//!    (ELU → conv k3 → ELU → conv k1, + input), ELU → strided conv per stage, ELU → last conv;
//!    → `[1, hidden, ceil(samples / 960)]` at 25 Hz.
//! 2. Transformer (`encoder.encoder_transformer.layers.*`): LayerNorm (with bias) → attention
//!    (RoPE half-split, causal) → LayerScale → residual; LayerNorm → fc1 → GELU (erf) → fc2 →
//!    LayerScale → residual. The reference (transformers 4.57.3) builds a plain causal mask here:
//!    `sliding_window` of the config is **not** applied (checked against the package), so neither
//!    is it here.
//! 3. Downsample (`encoder.downsample.conv`, k = 2·(25 Hz / 12.5 Hz), stride 2, no bias, causal
//!    with *replicate* padding) → 12.5 Hz.
//! 4. Split RVQ: semantic (1 quantizer) and acoustic (the rest) each project the *same* embedding
//!    with their `input_proj` (1×1 conv, no bias, when present) and quantise residually against
//!    `embed_sum / max(cluster_usage, 1e-5)` by Euclidean nearest neighbour. The first
//!    `encoder_valid_num_quantizers` (16) codebooks are kept and `ceil(samples / 1920)` frames.

use std::path::Path;

use candle_core::{D, DType, Device, Tensor};
use serde::Deserialize;
use serde_json::Value;

use super::ModelError;
use super::config::{from_json, read_json, without_nulls};
use crate::nn::{RotaryEmbedding, Weights};

/// `encoder_config` of `speech_tokenizer/config.json` (a `MimiConfig`) plus the top-level
/// `encoder_valid_num_quantizers` and `encode_downsample_rate`.
#[derive(Debug, Clone, PartialEq)]
pub struct CodecEncoderConfig {
    pub sampling_rate: u32,
    pub audio_channels: usize,
    pub num_filters: usize,
    pub kernel_size: usize,
    pub last_kernel_size: usize,
    pub residual_kernel_size: usize,
    pub dilation_growth_rate: usize,
    pub compress: usize,
    pub num_residual_layers: usize,
    /// Decoder order (the encoder uses them reversed), e.g. [8, 6, 5, 4].
    pub upsampling_ratios: Vec<usize>,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub num_quantizers: usize,
    pub num_semantic_quantizers: usize,
    pub codebook_size: usize,
    pub codebook_dim: usize,
    pub vector_quantization_hidden_dimension: usize,
    /// 12.5 for the released codec.
    pub frame_rate: f64,
    /// Codebooks kept by `encode` (16).
    pub valid_num_quantizers: usize,
    /// Input samples per output frame (1920).
    pub samples_per_frame: usize,
}

/// The keys of `speech_tokenizer/config.json` that the encoder reads.
#[derive(Deserialize)]
struct TokenizerJson {
    encoder_config: EncoderJson,
    encoder_valid_num_quantizers: usize,
    encode_downsample_rate: usize,
}

/// The keys of its `encoder_config` (a `MimiConfig`) that the encoder reads.
#[derive(Deserialize)]
struct EncoderJson {
    sampling_rate: u32,
    audio_channels: usize,
    num_filters: usize,
    kernel_size: usize,
    last_kernel_size: usize,
    /// An integer; `MimiConfig` also allows a list, which the encoder does not implement.
    residual_kernel_size: Value,
    dilation_growth_rate: usize,
    compress: usize,
    num_residual_layers: usize,
    upsampling_ratios: Vec<usize>,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    /// Default `hidden_size / num_attention_heads`.
    head_dim: Option<usize>,
    intermediate_size: usize,
    norm_eps: f64,
    rope_theta: f64,
    num_quantizers: usize,
    num_semantic_quantizers: usize,
    codebook_size: usize,
    codebook_dim: usize,
    vector_quantization_hidden_dimension: usize,
    /// The released files write `_frame_rate`; `frame_rate` is read when it is absent.
    #[serde(rename = "_frame_rate")]
    private_frame_rate: Option<f64>,
    frame_rate: Option<f64>,
    #[serde(default = "yes")]
    use_causal_conv: bool,
    #[serde(default)]
    use_conv_shortcut: bool,
    pad_mode: Option<String>,
    hidden_act: Option<String>,
}

fn yes() -> bool {
    true
}

impl CodecEncoderConfig {
    /// Parses `speech_tokenizer/config.json`.
    ///
    /// Errors: [`ModelError::Config`] naming the file and the key path
    /// (`encoder_config.num_key_value_heads`) of a missing, mistyped or unsupported value.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let root: TokenizerJson = from_json(path, &without_nulls(&read_json(path)?), "")?;
        let err = |field: &str, msg: String| ModelError::Config {
            file: path.to_path_buf(),
            field: field.to_string(),
            msg,
        };
        let e = root.encoder_config;
        let enc_err = |field: &str, msg: String| err(&format!("encoder_config.{field}"), msg);
        let residual_kernel_size = match &e.residual_kernel_size {
            Value::Array(_) => {
                return Err(enc_err(
                    "residual_kernel_size",
                    "a list of residual kernel sizes is not supported".into(),
                ));
            }
            v => v.as_u64().map(|k| k as usize).ok_or_else(|| {
                enc_err(
                    "residual_kernel_size",
                    format!("expected a non-negative integer, got {v}"),
                )
            })?,
        };
        let frame_rate = e
            .private_frame_rate
            .or(e.frame_rate)
            .ok_or_else(|| enc_err("_frame_rate", "missing".into()))?;
        let cfg = Self {
            sampling_rate: e.sampling_rate,
            audio_channels: e.audio_channels,
            num_filters: e.num_filters,
            kernel_size: e.kernel_size,
            last_kernel_size: e.last_kernel_size,
            residual_kernel_size,
            dilation_growth_rate: e.dilation_growth_rate,
            compress: e.compress,
            num_residual_layers: e.num_residual_layers,
            upsampling_ratios: e.upsampling_ratios,
            hidden_size: e.hidden_size,
            num_hidden_layers: e.num_hidden_layers,
            num_attention_heads: e.num_attention_heads,
            num_key_value_heads: e.num_key_value_heads,
            head_dim: e
                .head_dim
                .unwrap_or(e.hidden_size / e.num_attention_heads.max(1)),
            intermediate_size: e.intermediate_size,
            norm_eps: e.norm_eps,
            rope_theta: e.rope_theta,
            num_quantizers: e.num_quantizers,
            num_semantic_quantizers: e.num_semantic_quantizers,
            codebook_size: e.codebook_size,
            codebook_dim: e.codebook_dim,
            vector_quantization_hidden_dimension: e.vector_quantization_hidden_dimension,
            frame_rate,
            valid_num_quantizers: root.encoder_valid_num_quantizers,
            samples_per_frame: root.encode_downsample_rate,
        };
        // Only the released Mimi setup is implemented: check the switches that would change it.
        if !e.use_causal_conv {
            return Err(enc_err(
                "use_causal_conv",
                "only causal convolutions are supported".into(),
            ));
        }
        if e.use_conv_shortcut {
            return Err(enc_err(
                "use_conv_shortcut",
                "conv shortcuts are not supported".into(),
            ));
        }
        let pad_mode = e.pad_mode.as_deref().unwrap_or("constant");
        if pad_mode != "constant" {
            return Err(enc_err(
                "pad_mode",
                format!("{pad_mode:?}: only \"constant\" is supported"),
            ));
        }
        let act = e.hidden_act.as_deref().unwrap_or("gelu");
        if act != "gelu" {
            return Err(enc_err(
                "hidden_act",
                format!("{act:?}: only \"gelu\" is supported"),
            ));
        }
        if cfg.audio_channels != 1 {
            return Err(enc_err(
                "audio_channels",
                format!("{}: only mono", cfg.audio_channels),
            ));
        }
        if cfg.num_attention_heads == 0
            || cfg.num_key_value_heads == 0
            || !cfg
                .num_attention_heads
                .is_multiple_of(cfg.num_key_value_heads)
        {
            return Err(enc_err(
                "num_key_value_heads",
                format!(
                    "{} must divide num_attention_heads {}",
                    cfg.num_key_value_heads, cfg.num_attention_heads
                ),
            ));
        }
        if cfg.valid_num_quantizers == 0
            || cfg.valid_num_quantizers > cfg.num_quantizers
            || cfg.valid_num_quantizers < cfg.num_semantic_quantizers
        {
            return Err(err(
                "encoder_valid_num_quantizers",
                format!(
                    "{} must be in [{}, {}]",
                    cfg.valid_num_quantizers, cfg.num_semantic_quantizers, cfg.num_quantizers
                ),
            ));
        }
        if cfg.vector_quantization_hidden_dimension != cfg.codebook_dim {
            return Err(enc_err(
                "codebook_dim",
                format!(
                    "{} must equal vector_quantization_hidden_dimension {}",
                    cfg.codebook_dim, cfg.vector_quantization_hidden_dimension
                ),
            ));
        }
        let hop: usize = cfg.upsampling_ratios.iter().product();
        if cfg.samples_per_frame != hop * cfg.downsample_stride() {
            return Err(err(
                "encode_downsample_rate",
                format!(
                    "{} ≠ {} (product of upsampling_ratios) × 2 (downsample stride)",
                    cfg.samples_per_frame, hop
                ),
            ));
        }
        Ok(cfg)
    }

    /// `MimiConfig.encodec_frame_rate`: `ceil(sampling_rate / prod(upsampling_ratios))` (25 Hz).
    pub fn encodec_frame_rate(&self) -> f64 {
        let hop: usize = self.upsampling_ratios.iter().product();
        (self.sampling_rate as f64 / hop as f64).ceil()
    }

    /// Downsample conv kernel: `2 · int(encodec_frame_rate / frame_rate)`.
    pub fn downsample_kernel(&self) -> usize {
        2 * (self.encodec_frame_rate() / self.frame_rate) as usize
    }

    fn downsample_stride(&self) -> usize {
        2
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PadMode {
    Zeros,
    Replicate,
}

/// `MimiConv1d` (causal): weights `<prefix>.conv.{weight,bias}`, weight `[out, in, k]`.
#[derive(Debug, Clone)]
struct CausalConv {
    weight: Tensor,
    bias: Option<Tensor>,
    stride: usize,
    dilation: usize,
    /// Effective kernel `(k − 1)·dilation + 1`.
    k_eff: usize,
    pad: PadMode,
}

impl CausalConv {
    #[allow(clippy::too_many_arguments)]
    fn new(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        k: usize,
        stride: usize,
        dilation: usize,
        bias: bool,
        pad: PadMode,
    ) -> Result<Self, ModelError> {
        let w = w.pp("conv");
        Ok(Self {
            weight: w.get(&[c_out, c_in, k], "weight")?,
            bias: if bias {
                Some(w.get(&[c_out], "bias")?)
            } else {
                None
            },
            stride,
            dilation,
            k_eff: (k - 1) * dilation + 1,
            pad,
        })
    }

    /// `[B, C, T]` → `[B, C_out, ceil(T / stride)]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let len = x.dim(D::Minus1)?;
        let padding_total = self.k_eff - self.stride;
        // MimiConv1d._get_extra_padding_for_conv1d (real division, then ceil).
        let n_frames =
            ((len + padding_total) as f64 - self.k_eff as f64) / self.stride as f64 + 1.0;
        let n_frames = n_frames.ceil() as i64 - 1;
        let ideal = n_frames * self.stride as i64 + self.k_eff as i64 - padding_total as i64;
        let extra = (ideal - len as i64).max(0) as usize;
        let x = match self.pad {
            PadMode::Zeros => x.pad_with_zeros(D::Minus1, padding_total, extra)?,
            PadMode::Replicate => x.pad_with_same(D::Minus1, padding_total, extra)?,
        };
        let y = x.conv1d(&self.weight, 0, self.stride, self.dilation, 1)?;
        match &self.bias {
            Some(b) => y.broadcast_add(&b.reshape((1, (), 1))?),
            None => Ok(y),
        }
    }
}

/// `MimiResnetBlock`: ELU → `block.1` (k = residual_kernel_size, dilation) → ELU → `block.3`
/// (k 1) → + input.
#[derive(Debug, Clone)]
struct ResnetBlock {
    conv1: CausalConv,
    conv2: CausalConv,
}

impl ResnetBlock {
    fn new(
        w: &Weights,
        cfg: &CodecEncoderConfig,
        dim: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        let hidden = dim / cfg.compress;
        Ok(Self {
            conv1: CausalConv::new(
                &w.pp("block.1"),
                dim,
                hidden,
                cfg.residual_kernel_size,
                1,
                dilation,
                true,
                PadMode::Zeros,
            )?,
            conv2: CausalConv::new(&w.pp("block.3"), hidden, dim, 1, 1, 1, true, PadMode::Zeros)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.conv1.forward(&x.elu(1.0)?)?;
        let h = self.conv2.forward(&h.elu(1.0)?)?;
        x + h
    }
}

#[derive(Debug, Clone)]
enum SeanetLayer {
    Conv(CausalConv),
    Resnet(ResnetBlock),
    Elu,
}

/// `MimiEncoder` (SEANet) at `encoder.encoder.layers.*`.
#[derive(Debug, Clone)]
struct Seanet {
    layers: Vec<SeanetLayer>,
}

impl Seanet {
    fn new(w: &Weights, cfg: &CodecEncoderConfig) -> Result<Self, ModelError> {
        let w = w.pp("layers");
        let mut layers = vec![SeanetLayer::Conv(CausalConv::new(
            &w.pp("0"),
            cfg.audio_channels,
            cfg.num_filters,
            cfg.kernel_size,
            1,
            1,
            true,
            PadMode::Zeros,
        )?)];
        let mut scaling = 1;
        for &ratio in cfg.upsampling_ratios.iter().rev() {
            let dim = scaling * cfg.num_filters;
            for j in 0..cfg.num_residual_layers {
                let i = layers.len();
                layers.push(SeanetLayer::Resnet(ResnetBlock::new(
                    &w.pp(i.to_string()),
                    cfg,
                    dim,
                    cfg.dilation_growth_rate.pow(j as u32),
                )?));
            }
            layers.push(SeanetLayer::Elu);
            let i = layers.len();
            layers.push(SeanetLayer::Conv(CausalConv::new(
                &w.pp(i.to_string()),
                dim,
                dim * 2,
                ratio * 2,
                ratio,
                1,
                true,
                PadMode::Zeros,
            )?));
            scaling *= 2;
        }
        layers.push(SeanetLayer::Elu);
        let i = layers.len();
        layers.push(SeanetLayer::Conv(CausalConv::new(
            &w.pp(i.to_string()),
            scaling * cfg.num_filters,
            cfg.hidden_size,
            cfg.last_kernel_size,
            1,
            1,
            true,
            PadMode::Zeros,
        )?));
        Ok(Self { layers })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = match l {
                SeanetLayer::Conv(c) => c.forward(&h)?,
                SeanetLayer::Resnet(r) => r.forward(&h)?,
                SeanetLayer::Elu => h.elu(1.0)?,
            };
        }
        Ok(h)
    }
}

/// `MimiTransformerLayer` at `encoder.encoder_transformer.layers.{i}`.
#[derive(Debug, Clone)]
struct TransformerLayer {
    input_layernorm: candle_nn::LayerNorm,
    post_attention_layernorm: candle_nn::LayerNorm,
    q_proj: crate::nn::Linear,
    k_proj: crate::nn::Linear,
    v_proj: crate::nn::Linear,
    o_proj: crate::nn::Linear,
    fc1: crate::nn::Linear,
    fc2: crate::nn::Linear,
    attn_scale: Tensor,
    mlp_scale: Tensor,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

fn layer_norm(w: &Weights, dim: usize, eps: f64) -> Result<candle_nn::LayerNorm, ModelError> {
    Ok(candle_nn::LayerNorm::new(
        w.get(&[dim], "weight")?,
        w.get(&[dim], "bias")?,
        eps,
    ))
}

impl TransformerLayer {
    fn new(w: &Weights, cfg: &CodecEncoderConfig) -> Result<Self, ModelError> {
        let h = cfg.hidden_size;
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let a = w.pp("self_attn");
        Ok(Self {
            input_layernorm: layer_norm(&w.pp("input_layernorm"), h, cfg.norm_eps)?,
            post_attention_layernorm: layer_norm(
                &w.pp("post_attention_layernorm"),
                h,
                cfg.norm_eps,
            )?,
            q_proj: a.linear(h, nh * hd, false, "q_proj")?,
            k_proj: a.linear(h, nkv * hd, false, "k_proj")?,
            v_proj: a.linear(h, nkv * hd, false, "v_proj")?,
            o_proj: a.linear(nh * hd, h, false, "o_proj")?,
            fc1: w.pp("mlp").linear(h, cfg.intermediate_size, false, "fc1")?,
            fc2: w.pp("mlp").linear(cfg.intermediate_size, h, false, "fc2")?,
            attn_scale: w.pp("self_attn_layer_scale").get(&[h], "scale")?,
            mlp_scale: w.pp("mlp_layer_scale").get(&[h], "scale")?,
            heads: nh,
            kv_heads: nkv,
            head_dim: hd,
        })
    }

    /// `x`: `[1, T, hidden]`; `mask`: `[T, T]` additive causal mask; `cos`/`sin`: `[T, hd/2]`.
    fn forward(
        &self,
        x: &Tensor,
        mask: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
    ) -> candle_core::Result<Tensor> {
        use candle_core::Module;
        let (b, t, _) = x.dims3()?;
        let h = self.input_layernorm.forward(x)?;
        let q = self
            .q_proj
            .forward(&h)?
            .reshape((b, t, self.heads, self.head_dim))?
            .transpose(1, 2)?;
        let k = self
            .k_proj
            .forward(&h)?
            .reshape((b, t, self.kv_heads, self.head_dim))?
            .transpose(1, 2)?;
        let v = self
            .v_proj
            .forward(&h)?
            .reshape((b, t, self.kv_heads, self.head_dim))?
            .transpose(1, 2)?;
        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = RotaryEmbedding::apply(&k, cos, sin)?;
        let rep = self.heads / self.kv_heads;
        let (k, v) = if rep > 1 {
            // repeat_kv: head g of the queries uses kv head g / rep.
            let rk = |x: Tensor| -> candle_core::Result<Tensor> {
                x.unsqueeze(2)?.repeat((1, 1, rep, 1, 1))?.reshape((
                    b,
                    self.heads,
                    t,
                    self.head_dim,
                ))
            };
            (rk(k)?, rk(v.contiguous()?)?)
        } else {
            (k, v.contiguous()?)
        };
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let o = att
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, self.heads * self.head_dim))?;
        let o = self.o_proj.forward(&o)?;
        let x = (x + o.broadcast_mul(&self.attn_scale)?)?;
        let h = self.post_attention_layernorm.forward(&x)?;
        let h = self.fc2.forward(&self.fc1.forward(&h)?.gelu_erf()?)?;
        x + h.broadcast_mul(&self.mlp_scale)?
    }
}

/// One residual vector quantizer (`semantic_residual_vector_quantizer` or
/// `acoustic_residual_vector_quantizer`).
#[derive(Debug, Clone)]
struct Rvq {
    input_proj: Option<Tensor>,
    /// Per codebook: `embed = embed_sum / max(cluster_usage, 1e-5)` `[size, dim]` and its squared
    /// row norms `[size]`.
    codebooks: Vec<(Tensor, Tensor)>,
}

impl Rvq {
    fn new(w: &Weights, cfg: &CodecEncoderConfig, n: usize) -> Result<Self, ModelError> {
        let (h, d, size) = (
            cfg.hidden_size,
            cfg.vector_quantization_hidden_dimension,
            cfg.codebook_size,
        );
        let input_proj = if d != h {
            Some(w.pp("input_proj").get(&[d, h, 1], "weight")?)
        } else {
            None
        };
        let mut codebooks = Vec::with_capacity(n);
        for i in 0..n {
            let c = w.pp(format!("layers.{i}.codebook"));
            let sum = c.get(&[size, cfg.codebook_dim], "embed_sum")?;
            let usage = c.get(&[size], "cluster_usage")?;
            let embed = sum.broadcast_div(&usage.clamp(1e-5, f64::MAX)?.unsqueeze(1)?)?;
            let norms = embed.sqr()?.sum(1)?;
            codebooks.push((embed, norms));
        }
        Ok(Self {
            input_proj,
            codebooks,
        })
    }

    /// `x`: `[1, hidden, T]` → codes `[n][T]` of the first `n` codebooks.
    fn encode(&self, x: &Tensor, n: usize) -> candle_core::Result<Vec<Vec<u32>>> {
        let x = match &self.input_proj {
            Some(p) => x.conv1d(p, 0, 1, 1, 1)?,
            None => x.clone(),
        };
        // [T, dim]
        let mut residual = x.squeeze(0)?.t()?.contiguous()?;
        let mut out = Vec::with_capacity(n);
        for (embed, norms) in self.codebooks.iter().take(n) {
            // argmin_j |r − e_j|² = argmin_j (|e_j|² − 2 r·e_j); |r|² is constant per row.
            let dots = residual.matmul(&embed.t()?)?;
            let d = norms.unsqueeze(0)?.broadcast_sub(&(dots * 2.0)?)?;
            let idx = d.argmin(1)?;
            let q = embed.index_select(&idx, 0)?;
            residual = (residual - q)?;
            out.push(idx.to_vec1::<u32>()?);
        }
        Ok(out)
    }
}

/// The codec encoder (`encoder.*` of `speech_tokenizer/model.safetensors`), f32.
#[derive(Debug, Clone)]
pub struct CodecEncoder {
    cfg: CodecEncoderConfig,
    seanet: Seanet,
    layers: Vec<TransformerLayer>,
    rope: RotaryEmbedding,
    downsample: CausalConv,
    semantic: Rvq,
    acoustic: Rvq,
    device: Device,
}

impl CodecEncoder {
    /// Loads `<checkpoint>/speech_tokenizer/{config.json, model.safetensors}` (the `encoder.*`
    /// tensors) onto `device` in f32.
    pub fn load(checkpoint_dir: &Path, device: &Device) -> Result<Self, ModelError> {
        let dir = checkpoint_dir.join("speech_tokenizer");
        let cfg = CodecEncoderConfig::from_file(&dir.join("config.json"))?;
        let file = dir.join("model.safetensors");
        if !file.is_file() {
            return Err(ModelError::Io {
                path: file,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "codec weights (needed by the voice-clone encoder)",
                ),
            });
        }
        let w = Weights::from_files(std::slice::from_ref(&file), &file, device, DType::F32)?;
        Self::new(&cfg, &w.pp("encoder"))
    }

    /// Builds the encoder from the weights at `w` (the `encoder` prefix).
    pub fn new(cfg: &CodecEncoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let seanet = Seanet::new(&w.pp("encoder"), cfg)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| TransformerLayer::new(&w.pp(format!("encoder_transformer.layers.{i}")), cfg))
            .collect::<Result<_, _>>()?;
        let downsample = CausalConv::new(
            &w.pp("downsample"),
            cfg.hidden_size,
            cfg.hidden_size,
            cfg.downsample_kernel(),
            cfg.downsample_stride(),
            1,
            false,
            PadMode::Replicate,
        )?;
        let q = w.pp("quantizer");
        let semantic = Rvq::new(
            &q.pp("semantic_residual_vector_quantizer"),
            cfg,
            cfg.num_semantic_quantizers,
        )?;
        let acoustic = Rvq::new(
            &q.pp("acoustic_residual_vector_quantizer"),
            cfg,
            cfg.valid_num_quantizers - cfg.num_semantic_quantizers,
        )?;
        Ok(Self {
            cfg: cfg.clone(),
            seanet,
            layers,
            rope: RotaryEmbedding::new(cfg.head_dim, cfg.rope_theta, w.device()),
            downsample,
            semantic,
            acoustic,
            device: w.device().clone(),
        })
    }

    pub fn config(&self) -> &CodecEncoderConfig {
        &self.cfg
    }

    /// Samples per output frame (1920).
    pub fn samples_per_frame(&self) -> usize {
        self.cfg.samples_per_frame
    }

    /// Input sample rate (24000 Hz).
    pub fn sample_rate(&self) -> u32 {
        self.cfg.sampling_rate
    }

    /// Codebooks per output frame (16, `encoder_valid_num_quantizers`).
    pub fn valid_num_quantizers(&self) -> usize {
        self.cfg.valid_num_quantizers
    }

    /// The pre-quantizer embedding at 12.5 Hz, `[1, hidden, frames]` (for tests/diagnostics).
    pub fn embed(&self, audio: &[f32]) -> Result<Tensor, ModelError> {
        if audio.is_empty() {
            return Err(ModelError::InvalidRequest {
                field: "ref_audio".into(),
                value: "0 samples".into(),
                msg: "empty reference audio".into(),
            });
        }
        let x = Tensor::from_slice(audio, (1, 1, audio.len()), &self.device)?;
        let h = self.seanet.forward(&x)?; // [1, hidden, T25]
        let t = h.dim(2)?;
        let mut h = h.transpose(1, 2)?.contiguous()?; // [1, T25, hidden]
        let (cos, sin) = self.rope.cos_sin(0, t)?;
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| (0..t).map(move |j| if j <= i { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &self.device)?;
        for l in &self.layers {
            h = l.forward(&h, &mask, &cos, &sin)?;
        }
        let h = h.transpose(1, 2)?.contiguous()?;
        Ok(self.downsample.forward(&h)?)
    }

    /// `Qwen3TTSTokenizerV2Model.encode` of one mono waveform at [`Self::sample_rate`]:
    /// returns `ceil(samples / 1920)` frames of [`Self::num_quantizers`] codes, each in
    /// `[0, codebook_size)`.
    pub fn encode(&self, audio: &[f32]) -> Result<Vec<Vec<u32>>, ModelError> {
        let emb = self.embed(audio)?;
        let frames = audio.len().div_ceil(self.cfg.samples_per_frame);
        let have = emb.dim(2)?;
        if have < frames {
            return Err(candle_core::Error::Msg(format!(
                "codec encoder produced {have} frames for {} samples, expected ≥ {frames}",
                audio.len()
            ))
            .into());
        }
        let sem = self
            .semantic
            .encode(&emb, self.cfg.num_semantic_quantizers)?;
        let ac = self.acoustic.encode(
            &emb,
            self.cfg.valid_num_quantizers - self.cfg.num_semantic_quantizers,
        )?;
        let books: Vec<&Vec<u32>> = sem.iter().chain(ac.iter()).collect();
        Ok((0..frames)
            .map(|f| books.iter().map(|b| b[f]).collect())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use serde_json::{Value, json};

    use super::CodecEncoderConfig;
    use crate::models::qwen3_tts::ModelError;

    fn fixture_config() -> Value {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiny-base/speech_tokenizer/config.json");
        serde_json::from_str(&std::fs::read_to_string(p).expect("fixture config")).expect("json")
    }

    /// Parses `v` written to a file of its own; the error's (field, message) on failure.
    fn parse(name: &str, v: &Value) -> Result<CodecEncoderConfig, (String, String)> {
        let dir = std::env::temp_dir().join(format!(
            "omnitts-codec-encoder-{}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("config.json");
        std::fs::write(&path, v.to_string()).expect("write");
        let r = CodecEncoderConfig::from_file(&path);
        let _ = std::fs::remove_dir_all(&dir);
        r.map_err(|e| match e {
            ModelError::Config { field, msg, .. } => (field, msg),
            other => (String::new(), other.to_string()),
        })
    }

    #[test]
    fn the_fixture_parses_with_its_values() {
        let v = fixture_config();
        let cfg = parse("fixture", &v).expect("fixture parses");
        let enc = &v["encoder_config"];
        assert_eq!(cfg.hidden_size as u64, enc["hidden_size"].as_u64().unwrap());
        assert_eq!(cfg.frame_rate, enc["_frame_rate"].as_f64().unwrap());
        assert_eq!(
            cfg.valid_num_quantizers as u64,
            v["encoder_valid_num_quantizers"].as_u64().unwrap()
        );
        assert_eq!(
            cfg.samples_per_frame as u64,
            v["encode_downsample_rate"].as_u64().unwrap()
        );
    }

    #[test]
    fn errors_name_the_key_path() {
        let mut v = fixture_config();
        v["encoder_config"]["num_key_value_heads"] = json!("two");
        let (field, _) = parse("mistyped", &v).expect_err("a string head count");
        assert_eq!(field, "encoder_config.num_key_value_heads");

        let mut v = fixture_config();
        v["encoder_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
        let (field, msg) = parse("missing", &v).expect_err("no hidden_size");
        assert_eq!(
            (field.as_str(), msg.as_str()),
            ("encoder_config.hidden_size", "missing field")
        );

        let mut v = fixture_config();
        v["encoder_config"]["residual_kernel_size"] = json!([3, 3]);
        let (field, msg) = parse("list", &v).expect_err("a list of kernel sizes");
        assert_eq!(field, "encoder_config.residual_kernel_size");
        assert!(msg.contains("list"), "{msg}");

        let mut v = fixture_config();
        v["encoder_config"]["pad_mode"] = json!("reflect");
        let (field, msg) = parse("pad", &v).expect_err("reflect padding");
        assert_eq!(field, "encoder_config.pad_mode");
        assert!(msg.contains("reflect"), "{msg}");

        let mut v = fixture_config();
        v["encoder_valid_num_quantizers"] = json!(0);
        let (field, _) = parse("valid", &v).expect_err("no codebooks kept");
        assert_eq!(field, "encoder_valid_num_quantizers");
    }

    /// `_frame_rate` is the released key; `frame_rate` stands in when it is absent, and a null
    /// value counts as absent.
    #[test]
    fn frame_rate_key_and_null_values() {
        let mut v = fixture_config();
        let enc = v["encoder_config"].as_object_mut().unwrap();
        let rate = enc.remove("_frame_rate").unwrap();
        enc.insert("frame_rate".into(), rate.clone());
        enc.insert("head_dim".into(), Value::Null);
        let cfg = parse("frame-rate", &v).expect("frame_rate alone");
        assert_eq!(cfg.frame_rate, rate.as_f64().unwrap());
        assert_eq!(cfg.head_dim, cfg.hidden_size / cfg.num_attention_heads);

        v["encoder_config"]
            .as_object_mut()
            .unwrap()
            .remove("frame_rate");
        let (field, msg) = parse("no-rate", &v).expect_err("no frame rate");
        assert_eq!(
            (field.as_str(), msg.as_str()),
            ("encoder_config._frame_rate", "missing")
        );
    }
}
