//! `decoder.pre_transformer`: the codec's 8-layer causal sliding-window transformer, with an explicit
//! per-layer KV window so that it can run on chunks of frames, for one stream or several at once.
//!
//! Reference: `Qwen3TTSTokenizerV2DecoderTransformerModel` and its layer/attention/MLP classes in
//! `modeling_qwen3_tts_tokenizer_v2.py`. Per layer: RMSNorm → attention (no q/k norm, RoPE
//! half-split, causal sliding window: a query at frame `t` sees frames `t - window + 1 ..= t`) →
//! LayerScale → residual; RMSNorm → gated MLP → LayerScale → residual. Around the layers:
//! `input_proj` (latent → hidden), final RMSNorm, `output_proj` (hidden → latent).
//!
//! Streaming: each layer keeps the RoPE-rotated keys and the values of the last `window - 1` frames;
//! positions count frames since the start of the stream, so a chunked run sees exactly the same
//! keys, values and relative positions as a single pass. A batched state holds several streams
//! (rows), each with its own windows and position: the projections, norms and MLPs run over all
//! rows at once, each row gets its own RoPE positions, and the attention runs once per group of
//! rows with windows of the same length (in steady state, past the first `window - 1` frames, all
//! rows), with the mask a lone stream would use. No row is padded, so a batched row computes
//! exactly what the stream computes alone.
//!
//! The layers are [`crate::nn`]'s where the numbers agree ([`RmsNorm`], [`RotaryEmbedding`],
//! [`Weights::linear`]). The MLP is this file's own: `nn::Mlp` is SiLU only and folds a batch into
//! one matrix product, which the CPU kernels round differently from the rows alone, so a batched
//! stream would no longer be bit-identical to its solo decode; here every projection runs row by
//! row ([`RowLinear`]). The attention is this file's own: the codec's has no q/k norm, keeps a
//! bounded window (`nn::KvCache` keeps every position, so a long utterance would grow its memory
//! and its attention width without bound) with per-row positions and window lengths in one batch
//! (`nn::KvCache` has one length for all rows), and computes its softmax in the activation dtype
//! (`nn::Attention` rounds scores to f32, which would void the f64 verification mode).

use candle_core::{DType, Device, Tensor};
use candle_nn::Module;

use super::ModelError;
use super::batch::{BatchState, RowLinear};
use super::config::DecoderConfig;
use crate::nn::{RmsNorm, RotaryEmbedding, Weights};

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

/// `mlp`: `down(act(gate(x)) * up(x))`, with the configured activation and row-by-row
/// projections (see the module docs for why not `nn::Mlp`).
struct Mlp {
    gate_proj: RowLinear,
    up_proj: RowLinear,
    down_proj: RowLinear,
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
            gate_proj: RowLinear(w.linear(h, i, false, "gate_proj")?),
            up_proj: RowLinear(w.linear(h, i, false, "up_proj")?),
            down_proj: RowLinear(w.linear(i, h, false, "down_proj")?),
            act,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let gate = self.gate_proj.forward(x)?.apply(&self.act)?;
        self.down_proj.forward(&(gate * self.up_proj.forward(x)?)?)
    }
}

/// Streaming state of one attention layer of one stream: RoPE-rotated keys and values of the last
/// `min(position, window - 1)` frames, each `[1, kv_heads, frames, head_dim]`; `None` before any
/// frame.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvWindow {
    kv: Option<(Tensor, Tensor)>,
}

/// The rows of a batched pass whose windows hold the same number of past frames: they attend
/// alike, in one batched attention with one mask.
struct WindowGroup {
    /// Past frames in each row's window.
    past: usize,
    /// The rows, ascending.
    rows: Vec<usize>,
    /// Additive mask `[n, past + n]` of this pass, `None` when every key is visible.
    mask: Option<Tensor>,
}

/// `self_attn`: multi-head attention over the sliding window.
struct Attention {
    q_proj: RowLinear,
    k_proj: RowLinear,
    v_proj: RowLinear,
    o_proj: RowLinear,
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
            q_proj: RowLinear(w.linear(h, nh * hd, b, "q_proj")?),
            k_proj: RowLinear(w.linear(h, nkv * hd, b, "k_proj")?),
            v_proj: RowLinear(w.linear(h, nkv * hd, b, "v_proj")?),
            o_proj: RowLinear(w.linear(nh * hd, h, b, "o_proj")?),
            num_heads: nh,
            num_kv_heads: nkv,
            head_dim: hd,
            window: cfg.sliding_window,
        })
    }

    /// `x` `[rows, n, hidden]` → `[rows, n, hidden]`; `cos`/`sin` `[n, head_dim / 2]` (one row) or
    /// `[rows, n, head_dim / 2]`; `groups` partition the rows; `windows[r]` is row `r`'s state.
    fn forward(
        &self,
        x: &Tensor,
        (cos, sin): (&Tensor, &Tensor),
        groups: &[WindowGroup],
        windows: &mut [&mut KvWindow],
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
        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = RotaryEmbedding::apply(&k, cos, sin)?;
        if let [group] = groups {
            let out = self.attend(&q, &k, &v, group, windows)?;
            return self.o_proj.forward(&out);
        }
        let mut outs: Vec<Option<Tensor>> = vec![None; b];
        for group in groups {
            let ids: Vec<u32> = group.rows.iter().map(|&r| r as u32).collect();
            let ids = Tensor::new(ids.as_slice(), x.device())?;
            let pick = |t: &Tensor| t.index_select(&ids, 0);
            let out = self.attend(&pick(&q)?, &pick(&k)?, &pick(&v)?, group, windows)?;
            for (j, &r) in group.rows.iter().enumerate() {
                outs[r] = Some(out.narrow(0, j, 1)?);
            }
        }
        let outs = outs
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| candle_core::Error::Msg("code2wav: a row in no window group".into()))?;
        self.o_proj.forward(&Tensor::cat(&outs, 0)?)
    }

    /// Attention of one group's rows: `q` `[g, heads, n, hd]`, new `k`/`v` `[g, kv_heads, n, hd]`
    /// after the rows' windows, which then keep their last `window - 1` frames. Returns
    /// `[g, n, heads · hd]`, before `o_proj`.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        group: &WindowGroup,
        windows: &mut [&mut KvWindow],
    ) -> candle_core::Result<Tensor> {
        let (g, _, n, hd) = q.dims4()?;
        let (k, v) = if group.past == 0 {
            (k.clone(), v.clone())
        } else {
            let mut ks = Vec::with_capacity(g);
            let mut vs = Vec::with_capacity(g);
            for &r in &group.rows {
                let Some((pk, pv)) = &windows[r].kv else {
                    candle_core::bail!("code2wav: row {r} has no window of {} frames", group.past)
                };
                ks.push(pk);
                vs.push(pv);
            }
            let (pk, pv) = (Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?);
            (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?)
        };
        let total = k.dim(2)?;
        let keep = total.min(self.window - 1);
        for (j, &r) in group.rows.iter().enumerate() {
            windows[r].kv = if keep > 0 {
                let row = |t: &Tensor| t.narrow(0, j, 1)?.narrow(2, total - keep, keep);
                Some((row(&k)?, row(&v)?))
            } else {
                None
            };
        }
        // Grouped-query attention without repeating k/v: query heads g·rep .. g·rep + rep - 1
        // share kv head g (the reference's `repeat_kv`), so they are folded into the rows.
        let (nkv, rep) = (self.num_kv_heads, self.num_heads / self.num_kv_heads);
        let q = q.reshape((g, nkv, rep * n, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let scores = match &group.mask {
            Some(mask) => scores
                .reshape((g, nkv, rep, n, total))?
                .broadcast_add(mask)?
                .reshape((g, nkv, rep * n, total))?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?;
        let out = probs.matmul(&v.contiguous()?)?; // [g, nkv, rep·n, hd]
        out.reshape((g, self.num_heads, n, hd))?
            .transpose(1, 2)?
            .reshape((g, n, self.num_heads * hd))
    }
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
        let (h, eps) = (cfg.hidden_size, cfg.rms_norm_eps);
        Ok(Self {
            self_attn: Attention::new(cfg, &w.pp("self_attn"))?,
            mlp: Mlp::new(cfg, &w.pp("mlp"))?,
            input_layernorm: RmsNorm::new(h, eps, &w.pp("input_layernorm"))?,
            post_attention_layernorm: RmsNorm::new(h, eps, &w.pp("post_attention_layernorm"))?,
            self_attn_layer_scale: LayerScale::new(h, &w.pp("self_attn_layer_scale"))?,
            mlp_layer_scale: LayerScale::new(h, &w.pp("mlp_layer_scale"))?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        rope: (&Tensor, &Tensor),
        groups: &[WindowGroup],
        windows: &mut [&mut KvWindow],
    ) -> candle_core::Result<Tensor> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, rope, groups, windows)?;
        let x = (x + self.self_attn_layer_scale.forward(&h)?)?;
        let h = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&x)?)?;
        &x + self.mlp_layer_scale.forward(&h)?
    }
}

/// One stream's part of a [`PreTransformerState`]: a [`KvWindow`] per layer and the position
/// (frames processed so far).
#[derive(Debug, Clone)]
struct StreamWindows {
    layers: Vec<KvWindow>,
    position: usize,
}

/// Streaming state of [`PreTransformer`] for one stream, or for several (rows) stacked for a
/// batched pass.
#[derive(Debug, Clone)]
pub(crate) struct PreTransformerState {
    rows: Vec<StreamWindows>,
}

impl PreTransformerState {
    /// Frames processed since the start of the stream (row 0 of a batched state).
    pub(crate) fn position(&self) -> usize {
        self.rows.first().map_or(0, |r| r.position)
    }
}

/// Stacking and splitting move the rows' windows (no tensor is copied).
impl BatchState for PreTransformerState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        let layers = states
            .first()
            .and_then(|s| s.rows.first())
            .map(|r| r.layers.len());
        let rows: Vec<StreamWindows> = states.iter().flat_map(|s| s.rows.clone()).collect();
        if rows.iter().any(|r| Some(r.layers.len()) != layers) {
            candle_core::bail!("code2wav: stacking transformer states of different layer counts")
        }
        Ok(Self { rows })
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        if rows != self.rows.len() {
            candle_core::bail!(
                "code2wav: a transformer state of {} rows cannot be split into {rows}",
                self.rows.len()
            )
        }
        Ok(self
            .rows
            .into_iter()
            .map(|r| Self { rows: vec![r] })
            .collect())
    }
}

/// `decoder.pre_transformer`.
pub(crate) struct PreTransformer {
    input_proj: RowLinear,
    layers: Vec<TransformerLayer>,
    norm: RmsNorm,
    output_proj: RowLinear,
    rope: RotaryEmbedding,
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
        let (h, latent) = (cfg.hidden_size, cfg.latent_dim);
        Ok(Self {
            input_proj: RowLinear(w.linear(latent, h, true, "input_proj")?),
            layers,
            norm: RmsNorm::new(h, cfg.rms_norm_eps, &w.pp("norm"))?,
            output_proj: RowLinear(w.linear(h, latent, true, "output_proj")?),
            rope: RotaryEmbedding::new(cfg.head_dim(), cfg.rope_theta, w.device()),
            window: cfg.sliding_window,
            device: w.device().clone(),
            dtype: w.dtype(),
        })
    }

    /// A fresh single-stream state (no past frames, position 0).
    pub(crate) fn init_state(&self) -> PreTransformerState {
        PreTransformerState {
            rows: vec![StreamWindows {
                layers: vec![KvWindow::default(); self.layers.len()],
                position: 0,
            }],
        }
    }

    /// RoPE tables for the `n` frames after each row's position: `[n, head_dim / 2]` for one
    /// row, `[rows, n, head_dim / 2]` for several.
    fn rope(&self, positions: &[usize], n: usize) -> candle_core::Result<(Tensor, Tensor)> {
        if let [p] = positions {
            return self.rope.cos_sin(*p, n);
        }
        let (cos, sin): (Vec<Tensor>, Vec<Tensor>) = positions
            .iter()
            .map(|&p| self.rope.cos_sin(p, n))
            .collect::<candle_core::Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        Ok((Tensor::stack(&cos, 0)?, Tensor::stack(&sin, 0)?))
    }

    /// Additive mask `[n, past + n]` for `n` queries after `past` frames in the window, or `None`
    /// when every key is visible to every query.
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

    /// The rows of `state` grouped by the frames in their windows (`min(position, window - 1)`),
    /// in order of their first row, each with its mask for `n` new frames.
    fn groups(
        &self,
        state: &PreTransformerState,
        n: usize,
    ) -> candle_core::Result<Vec<WindowGroup>> {
        let mut groups: Vec<WindowGroup> = Vec::new();
        for (r, row) in state.rows.iter().enumerate() {
            let past = row.position.min(self.window - 1);
            match groups.iter_mut().find(|g| g.past == past) {
                Some(g) => g.rows.push(r),
                None => groups.push(WindowGroup {
                    past,
                    rows: vec![r],
                    mask: self.mask(past, n)?,
                }),
            }
        }
        Ok(groups)
    }

    /// Runs the next `n` frames of every row: `x` `[rows, n, latent]` → `[rows, n, latent]`,
    /// updating `state` (of `rows` rows).
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        state: &mut PreTransformerState,
    ) -> candle_core::Result<Tensor> {
        let (rows, n, _) = x.dims3()?;
        if rows != state.rows.len() {
            candle_core::bail!(
                "code2wav: {rows} input rows for a transformer state of {} rows",
                state.rows.len()
            )
        }
        let groups = self.groups(state, n)?;
        let positions: Vec<usize> = state.rows.iter().map(|r| r.position).collect();
        let (cos, sin) = self.rope(&positions, n)?;
        let mut h = self.input_proj.forward(x)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut windows = state
                .rows
                .iter_mut()
                .map(|r| r.layers.get_mut(l))
                .collect::<Option<Vec<&mut KvWindow>>>()
                .ok_or_else(|| candle_core::Error::Msg(format!("code2wav: no layer {l} state")))?;
            h = layer.forward(&h, (&cos, &sin), &groups, &mut windows)?;
        }
        state.rows.iter_mut().for_each(|r| r.position += n);
        let h = self.norm.forward(&h)?;
        self.output_proj.forward(&h)
    }
}
