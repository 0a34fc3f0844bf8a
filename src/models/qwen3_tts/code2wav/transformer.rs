//! `decoder.pre_transformer`: the codec's 8-layer causal sliding-window transformer, with an explicit
//! per-layer KV window so that it can run on chunks of frames.
//!
//! Reference: `Qwen3TTSTokenizerV2DecoderTransformerModel` and its layer/attention/MLP classes in
//! `modeling_qwen3_tts_tokenizer_v2.py`. Per layer: RMSNorm → attention (no q/k norm, RoPE
//! half-split, causal sliding window: a query at frame `t` sees frames `t - window + 1 ..= t`) →
//! LayerScale → residual; RMSNorm → SwiGLU MLP → LayerScale → residual. Around the layers:
//! `input_proj` (latent → hidden), final RMSNorm, `output_proj` (hidden → latent).
//!
//! Streaming: each layer keeps the RoPE-rotated keys and the values of the last `window - 1` frames;
//! positions count frames since the start of the stream, so a chunked run sees exactly the same
//! keys, values and relative positions as a single pass.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Linear, Module};

use super::ModelError;
use super::config::DecoderConfig;
use super::weights::Weights;

fn linear(w: &Weights, out: usize, inp: usize, bias: bool) -> Result<Linear, ModelError> {
    let weight = w.get(&[out, inp], "weight")?;
    let bias = if bias {
        Some(w.get(&[out], "bias")?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

/// RMSNorm over the last dim (`Qwen3TTSTokenizerV2DecoderRMSNorm`).
struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    fn new(size: usize, eps: f64, w: &Weights) -> Result<Self, ModelError> {
        Ok(Self {
            weight: w.get(&[size], "weight")?,
            eps: eps as f32,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if x.dtype() == DType::F64 {
            // The fused kernel has no f64 version (f64 is the verification mode).
            candle_nn::ops::rms_norm_slow(x, &self.weight, self.eps)
        } else {
            candle_nn::ops::rms_norm(&x.contiguous()?, &self.weight, self.eps)
        }
    }
}

/// `*_layer_scale`: per-channel scale `[hidden]`.
struct LayerScale {
    scale: Tensor,
}

impl LayerScale {
    fn new(size: usize, w: &Weights) -> Result<Self, ModelError> {
        Ok(Self {
            scale: w.get(&[size], "scale")?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.broadcast_mul(&self.scale)
    }
}

/// `mlp`: `down(act(gate(x)) * up(x))`.
struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
    act: candle_nn::Activation,
}

impl Mlp {
    fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let act = match cfg.hidden_act.as_str() {
            "silu" | "swish" => candle_nn::Activation::Silu,
            // transformers' ACT2FN["gelu"] is the exact (erf) GELU.
            "gelu" => candle_nn::Activation::Gelu,
            "relu" => candle_nn::Activation::Relu,
            // `SpeechTokenizerConfig::from_file` rejects every other value.
            other => {
                return Err(ModelError::Candle(candle_core::Error::Msg(format!(
                    "decoder_config.hidden_act {other:?} is not supported"
                ))));
            }
        };
        Ok(Self {
            gate_proj: linear(&w.pp("gate_proj"), i, h, false)?,
            up_proj: linear(&w.pp("up_proj"), i, h, false)?,
            down_proj: linear(&w.pp("down_proj"), h, i, false)?,
            act,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let gate = self.gate_proj.forward(x)?.apply(&self.act)?;
        self.down_proj.forward(&(gate * self.up_proj.forward(x)?)?)
    }
}

/// Streaming state of one attention layer: RoPE-rotated keys and values of up to `window - 1` past
/// frames, each `[1, kv_heads, past, head_dim]`.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvWindow {
    kv: Option<(Tensor, Tensor)>,
}

impl KvWindow {
    fn past_len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dims()[2])
    }
}

/// `self_attn`: multi-head attention over the sliding window.
struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    /// Frames a query sees, itself included.
    window: usize,
}

impl Attention {
    fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let hd = cfg.head_dim();
        let (h, nh, nkv) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
        );
        let b = cfg.attention_bias;
        Ok(Self {
            q_proj: linear(&w.pp("q_proj"), nh * hd, h, b)?,
            k_proj: linear(&w.pp("k_proj"), nkv * hd, h, b)?,
            v_proj: linear(&w.pp("v_proj"), nkv * hd, h, b)?,
            o_proj: linear(&w.pp("o_proj"), h, nh * hd, b)?,
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            window: cfg.sliding_window,
        })
    }

    /// `x` `[1, n, hidden]` → `[1, n, hidden]`; `mask` `[n, past + n]` additive or `None` (all visible).
    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeSlice,
        mask: Option<&Tensor>,
        state: &mut KvWindow,
    ) -> candle_core::Result<Tensor> {
        let (b, n, _) = x.dims3()?;
        let split = |t: Tensor, heads: usize| -> candle_core::Result<Tensor> {
            t.reshape((b, n, heads, self.head_dim))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q_proj.forward(x)?, self.num_heads)?;
        let k = split(self.k_proj.forward(x)?, self.num_kv_heads)?;
        let v = split(self.v_proj.forward(x)?, self.num_kv_heads)?;
        let q = candle_nn::rotary_emb::rope(&q, &rope.cos, &rope.sin)?;
        let k = candle_nn::rotary_emb::rope(&k, &rope.cos, &rope.sin)?;
        let (k, v) = match state.kv.take() {
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
            None => (k, v),
        };
        let total = k.dim(2)?;
        let keep = total.min(self.window - 1);
        if keep > 0 {
            state.kv = Some((
                k.narrow(2, total - keep, keep)?.contiguous()?,
                v.narrow(2, total - keep, keep)?.contiguous()?,
            ));
        }
        let rep = self.num_heads / self.num_kv_heads;
        let (k, v) = if rep > 1 {
            (repeat_kv(&k, rep)?, repeat_kv(&v, rep)?)
        } else {
            (k, v)
        };
        let scale = 1.0 / (self.head_dim as f64).sqrt();
        let mut scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&v.contiguous()?)?; // [b, heads, n, head_dim]
        let out = out
            .transpose(1, 2)?
            .reshape((b, n, self.num_heads * self.head_dim))?;
        self.o_proj.forward(&out)
    }
}

fn repeat_kv(x: &Tensor, rep: usize) -> candle_core::Result<Tensor> {
    let (b, h, t, d) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((b, h, rep, t, d))?
        .reshape((b, h * rep, t, d))
}

/// One `layers.{i}`.
struct TransformerLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    self_attn_layer_scale: LayerScale,
    mlp_layer_scale: LayerScale,
}

impl TransformerLayer {
    fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let h = cfg.hidden_size;
        Ok(Self {
            self_attn: Attention::new(cfg, &w.pp("self_attn"))?,
            mlp: Mlp::new(cfg, &w.pp("mlp"))?,
            input_layernorm: RmsNorm::new(h, cfg.rms_norm_eps, &w.pp("input_layernorm"))?,
            post_attention_layernorm: RmsNorm::new(
                h,
                cfg.rms_norm_eps,
                &w.pp("post_attention_layernorm"),
            )?,
            self_attn_layer_scale: LayerScale::new(h, &w.pp("self_attn_layer_scale"))?,
            mlp_layer_scale: LayerScale::new(h, &w.pp("mlp_layer_scale"))?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: &RopeSlice,
        mask: Option<&Tensor>,
        state: &mut KvWindow,
    ) -> candle_core::Result<Tensor> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, rope, mask, state)?;
        let x = (x + self.self_attn_layer_scale.forward(&h)?)?;
        let h = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        &x + self.mlp_layer_scale.forward(&h)?
    }
}

/// cos/sin `[n, head_dim / 2]` for the frames of one chunk.
struct RopeSlice {
    cos: Tensor,
    sin: Tensor,
}

/// Streaming state of [`PreTransformer`]: one [`KvWindow`] per layer and the stream position
/// (frames processed so far).
#[derive(Debug, Clone, Default)]
pub(crate) struct PreTransformerState {
    layers: Vec<KvWindow>,
    position: usize,
}

impl PreTransformerState {
    /// Frames processed since the start of the stream.
    pub(crate) fn position(&self) -> usize {
        self.position
    }
}

/// `decoder.pre_transformer`.
pub(crate) struct PreTransformer {
    input_proj: Linear,
    layers: Vec<TransformerLayer>,
    norm: RmsNorm,
    output_proj: Linear,
    /// RoPE inverse frequencies, f32 as in the reference, `head_dim / 2` entries.
    inv_freq: Vec<f32>,
    window: usize,
    device: Device,
    dtype: DType,
}

impl PreTransformer {
    /// Loads the transformer at `w` = `decoder.pre_transformer`.
    pub(crate) fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| TransformerLayer::new(cfg, &w.pp(format!("layers.{i}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let hd = cfg.head_dim();
        // transformers' default RoPE init: 1 / theta^(arange(0, d, 2) / d), computed in f32.
        let inv_freq = (0..hd / 2)
            .map(|i| 1.0f32 / (cfg.rope_theta as f32).powf((2 * i) as f32 / hd as f32))
            .collect();
        Ok(Self {
            input_proj: linear(&w.pp("input_proj"), cfg.hidden_size, cfg.latent_dim, true)?,
            layers,
            norm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps, &w.pp("norm"))?,
            output_proj: linear(&w.pp("output_proj"), cfg.latent_dim, cfg.hidden_size, true)?,
            inv_freq,
            window: cfg.sliding_window,
            device: w.device().clone(),
            dtype: w.dtype(),
        })
    }

    /// A fresh state (no past frames, position 0).
    pub(crate) fn init_state(&self) -> PreTransformerState {
        PreTransformerState {
            layers: vec![KvWindow::default(); self.layers.len()],
            position: 0,
        }
    }

    fn rope(&self, start: usize, n: usize) -> candle_core::Result<RopeSlice> {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for p in start..start + n {
            for &f in &self.inv_freq {
                // f32 product as in the reference (`inv_freq @ position_ids` in float32).
                let angle = (f * p as f32) as f64;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(RopeSlice {
            cos: Tensor::from_vec(cos, (n, half), &self.device)?.to_dtype(self.dtype)?,
            sin: Tensor::from_vec(sin, (n, half), &self.device)?.to_dtype(self.dtype)?,
        })
    }

    /// Additive mask `[n, past + n]` for queries at `past..past + n` (relative to the first kept
    /// key), or `None` when every key is visible to every query.
    fn mask(&self, past: usize, n: usize) -> candle_core::Result<Option<Tensor>> {
        let total = past + n;
        let visible = |i: usize, j: usize| {
            let q = past + i;
            j <= q && q - j < self.window
        };
        if (0..n).all(|i| (0..total).all(|j| visible(i, j))) {
            return Ok(None);
        }
        let data: Vec<f32> = (0..n)
            .flat_map(|i| {
                (0..total).map(move |j| {
                    if visible(i, j) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        Ok(Some(
            Tensor::from_vec(data, (n, total), &self.device)?.to_dtype(self.dtype)?,
        ))
    }

    /// Runs the next `n` frames: `x` `[1, n, latent]` → `[1, n, latent]`, updating `state`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        state: &mut PreTransformerState,
    ) -> candle_core::Result<Tensor> {
        let n = x.dim(1)?;
        let past = state.layers.first().map_or(0, KvWindow::past_len);
        let rope = self.rope(state.position, n)?;
        let mask = self.mask(past, n)?;
        let mut h = self.input_proj.forward(x)?;
        for (layer, kv) in self.layers.iter().zip(state.layers.iter_mut()) {
            h = layer.forward(&h, &rope, mask.as_ref(), kv)?;
        }
        state.position += n;
        let h = self.norm.forward(&h)?;
        self.output_proj.forward(&h)
    }
}
