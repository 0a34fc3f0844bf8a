//! The codec's causal windowed transformer (`WindowLimitedTransformer`): channels-first in and
//! out, an optional input/output projection, pre-norm blocks with `LayerScale` on both branches
//! (`h = x + γ_a · attn(attention_norm(x))`, `y = h + γ_f · ffn(ffn_norm(h))`), a final RMSNorm.
//! Position p attends to positions `p − window + 1 ..= p` with interleaved bf16-table RoPE at
//! absolute positions, so a stream that keeps the last `window − 1` keys and values
//! ([`WindowCache`]) gives what the whole signal gives.

use candle_core::{DType, Module, Tensor};

use super::config::TransformerConfig;
use super::weights::CodecWeights;
use crate::models::fish_speech::error::{FishError, Result};
use crate::models::fish_speech::rope::RopeTable;
use crate::nn::conv::per_row_on_cpu;
use crate::nn::{Linear, RmsNorm};

/// Past keys/values of each layer (at most `window − 1` positions) and the next position.
#[derive(Debug, Clone, Default)]
pub struct WindowCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    position: usize,
}

impl WindowCache {
    /// Positions seen so far.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Past positions the next chunk attends to: the last `window − 1` at most (all without a
    /// window). Streams with equal fill share [`WindowTransformer::forward_rows`].
    pub fn fill(&self, window: Option<usize>) -> usize {
        match window {
            Some(w) => self.position.min(w.saturating_sub(1)),
            None => self.position,
        }
    }
}

/// `layer.forward(x)` over `[rows, t, in]`, row by row on the CPU (each row then rounds as its
/// stream alone), one product on CUDA.
fn rows(layer: &Linear, x: &Tensor) -> Result<Tensor> {
    Ok(per_row_on_cpu(x, |r| layer.forward(r))?)
}

#[derive(Debug, Clone)]
struct Layer {
    wqkv: Linear,
    wo: Linear,
    w1: Linear,
    w3: Linear,
    w2: Linear,
    attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
    attention_scale: Tensor,
    ffn_scale: Tensor,
}

/// The transformer's weights.
#[derive(Debug, Clone)]
pub struct WindowTransformer {
    layers: Vec<Layer>,
    norm: RmsNorm,
    input_proj: Option<Linear>,
    output_proj: Option<Linear>,
    window: Option<usize>,
    n_head: usize,
    head_dim: usize,
    rope_base: f64,
}

fn rms(w: &CodecWeights, name: &str, dim: usize, eps: f64) -> Result<RmsNorm> {
    let weight = w.get(&format!("{name}.weight"), &[dim])?;
    Ok(RmsNorm::from_weight(weight, eps))
}

fn linear(w: &CodecWeights, name: &str, i: usize, o: usize, bias: bool) -> Result<Linear> {
    let b = if bias {
        Some(w.get(&format!("{name}.bias"), &[o])?)
    } else {
        None
    };
    Ok(Linear::new(w.get(&format!("{name}.weight"), &[o, i])?, b))
}

impl WindowTransformer {
    /// The module at `prefix` over `input_dim` channels.
    pub fn new(
        w: &CodecWeights,
        prefix: &str,
        c: &TransformerConfig,
        input_dim: usize,
        window: Option<usize>,
    ) -> Result<Self> {
        if c.n_local_heads >= 0 && c.n_local_heads as usize != c.n_head {
            return Err(FishError::Checkpoint {
                file: "codec_config.yaml".into(),
                msg: format!("{prefix}: grouped key/value heads are not supported in the codec"),
            });
        }
        let (d, hd, nh) = (c.dim, c.head_dim, c.n_head);
        let layers = (0..c.n_layer)
            .map(|i| {
                let p = format!("{prefix}.layers.{i}");
                Ok(Layer {
                    wqkv: linear(w, &format!("{p}.attention.wqkv"), d, 3 * nh * hd, false)?,
                    wo: linear(w, &format!("{p}.attention.wo"), nh * hd, d, false)?,
                    w1: linear(
                        w,
                        &format!("{p}.feed_forward.w1"),
                        d,
                        c.intermediate_size,
                        false,
                    )?,
                    w3: linear(
                        w,
                        &format!("{p}.feed_forward.w3"),
                        d,
                        c.intermediate_size,
                        false,
                    )?,
                    w2: linear(
                        w,
                        &format!("{p}.feed_forward.w2"),
                        c.intermediate_size,
                        d,
                        false,
                    )?,
                    attention_norm: rms(w, &format!("{p}.attention_norm"), d, c.norm_eps)?,
                    ffn_norm: rms(w, &format!("{p}.ffn_norm"), d, c.norm_eps)?,
                    attention_scale: w.get(&format!("{p}.attention_layer_scale.gamma"), &[d])?,
                    ffn_scale: w.get(&format!("{p}.ffn_layer_scale.gamma"), &[d])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let (input_proj, output_proj) = if input_dim != d {
            (
                Some(linear(
                    w,
                    &format!("{prefix}.input_proj"),
                    input_dim,
                    d,
                    true,
                )?),
                Some(linear(
                    w,
                    &format!("{prefix}.output_proj"),
                    d,
                    input_dim,
                    true,
                )?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            layers,
            norm: rms(w, &format!("{prefix}.norm"), d, c.norm_eps)?,
            input_proj,
            output_proj,
            window,
            n_head: nh,
            head_dim: hd,
            rope_base: c.rope_base,
        })
    }

    /// The attention window (`None`: every past position).
    pub fn window(&self) -> Option<usize> {
        self.window
    }

    /// `x` `[b, input_dim, t]` → `[b, input_dim, t]`, continuing `cache`'s stream.
    pub fn forward(&self, x: &Tensor, cache: &mut WindowCache) -> Result<Tensor> {
        self.forward_rows(x, &mut [cache])
    }

    /// `x` `[rows, input_dim, t]` → `[rows, input_dim, t]`, row `r` continuing `caches[r]`'s
    /// stream, each at its own positions; the rows' caches must have the same
    /// [`WindowCache::fill`] (one mask serves them all). Each row computes what its stream
    /// computes alone (on the CPU to the bit: the products run row by row).
    ///
    /// Errors: `caches.len()` is not `rows`, the fills differ, or some rows hold past keys and
    /// some none (a window of 1); after an error in a layer the caches are undefined.
    pub fn forward_rows(&self, x: &Tensor, caches: &mut [&mut WindowCache]) -> Result<Tensor> {
        let b = x.dim(0)?;
        if caches.len() != b {
            return Err(FishError::Candle(candle_core::Error::Msg(format!(
                "codec transformer: {b} rows for {} caches",
                caches.len()
            ))));
        }
        let past = caches.first().map_or(0, |c| c.fill(self.window));
        if caches.iter().any(|c| c.fill(self.window) != past) {
            return Err(FishError::Candle(candle_core::Error::Msg(
                "codec transformer: rows of different window fills in one pass".into(),
            )));
        }
        let mut h = x.transpose(1, 2)?.contiguous()?;
        if let Some(p) = &self.input_proj {
            h = rows(p, &h)?;
        }
        for c in caches.iter_mut() {
            if c.layers.len() != self.layers.len() {
                c.layers = vec![None; self.layers.len()];
            }
        }
        let starts: Vec<usize> = caches.iter().map(|c| c.position).collect();
        let rope = self.rope_tables(&starts, h.dim(1)?, h.device(), h.dtype())?;
        for (l, layer) in self.layers.iter().enumerate() {
            let mut past_kv: Vec<Option<(Tensor, Tensor)>> =
                caches.iter_mut().map(|c| c.layers[l].take()).collect();
            let a = self.attention(
                layer,
                &layer.attention_norm.forward(&h)?,
                &rope,
                &mut past_kv,
            )?;
            for (c, kv) in caches.iter_mut().zip(past_kv) {
                c.layers[l] = kv;
            }
            h = (&h + a.broadcast_mul(&layer.attention_scale)?)?;
            let n = layer.ffn_norm.forward(&h)?;
            let f = rows(
                &layer.w2,
                &(candle_nn::ops::silu(&rows(&layer.w1, &n)?)? * rows(&layer.w3, &n)?)?,
            )?;
            h = (&h + f.broadcast_mul(&layer.ffn_scale)?)?;
        }
        let t = h.dim(1)?;
        caches.iter_mut().for_each(|c| c.position += t);
        let mut h = self.norm.forward(&h)?;
        if let Some(p) = &self.output_proj {
            h = rows(p, &h)?;
        }
        Ok(h.transpose(1, 2)?.contiguous()?)
    }

    /// The RoPE tables `(cos, sin)` `[t, head_dim/2]` of rows at `starts`: one for all rows
    /// when they start together, else one per row (computed once per pass, used by every layer).
    fn rope_tables(
        &self,
        starts: &[usize],
        t: usize,
        device: &candle_core::Device,
        dtype: DType,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        let distinct = if starts.iter().all(|&s| s == starts[0]) {
            &starts[..1]
        } else {
            starts
        };
        distinct
            .iter()
            .map(|&s| {
                Ok(RopeTable::values_at(
                    s,
                    t,
                    self.head_dim,
                    self.rope_base,
                    device,
                    dtype,
                )?)
            })
            .collect()
    }

    /// RoPE of `x` `[rows, heads, t, head_dim]` with [`Self::rope_tables`]: one table for all
    /// rows, or row `r` with table `r`.
    fn rope_rows(x: &Tensor, tables: &[(Tensor, Tensor)]) -> Result<Tensor> {
        let x = x.contiguous()?;
        if let [(cos, sin)] = tables {
            return Ok(candle_nn::rotary_emb::rope_i(&x, cos, sin)?);
        }
        let parts = tables
            .iter()
            .enumerate()
            .map(|(r, (cos, sin))| candle_nn::rotary_emb::rope_i(&x.narrow(0, r, 1)?, cos, sin))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// One layer's attention over the rows `x` `[rows, t, dim]` with their RoPE tables;
    /// `caches[r]` holds row `r`'s past keys and values (all of the same length) and gets the
    /// new ones.
    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        rope: &[(Tensor, Tensor)],
        caches: &mut [Option<(Tensor, Tensor)>],
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (nh, hd) = (self.n_head, self.head_dim);
        let qkv = rows(&layer.wqkv, x)?;
        let split = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, i * nh * hd, nh * hd)?
                .reshape((b, t, nh, hd))?
                .transpose(1, 2)?
                .contiguous()?)
        };
        let q = Self::rope_rows(&split(0)?, rope)?;
        let k = Self::rope_rows(&split(1)?, rope)?;
        let v = split(2)?;
        let taken: Vec<(Tensor, Tensor)> = caches.iter_mut().filter_map(Option::take).collect();
        let (k, v, past) = if taken.is_empty() {
            (k, v, 0)
        } else if taken.len() == b {
            let stack = |pick: fn(&(Tensor, Tensor)) -> &Tensor| -> Result<Tensor> {
                let parts: Vec<&Tensor> = taken.iter().map(pick).collect();
                Ok(Tensor::cat(&parts, 0)?)
            };
            let (pk, pv) = (stack(|kv| &kv.0)?, stack(|kv| &kv.1)?);
            let past = pk.dim(2)?;
            (
                Tensor::cat(&[&pk, &k], 2)?,
                Tensor::cat(&[&pv, &v], 2)?,
                past,
            )
        } else {
            return Err(FishError::Candle(candle_core::Error::Msg(
                "codec transformer: some rows have past keys and some none".into(),
            )));
        };
        let s = past + t;
        // key j (absolute start − past + j) is visible to query i (absolute start + i) when it
        // is not later and within the window
        let w = self.window.unwrap_or(usize::MAX);
        let mask: Vec<f32> = (0..t)
            .flat_map(|i| {
                (0..s).map(move |j| {
                    let (qp, kp) = (past + i, j);
                    if kp <= qp && qp - kp < w {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, s), x.device())?;
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.matmul(&k.t()?.contiguous()?)? * scale)?.broadcast_add(&mask)?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?;
        let y = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?;
        let keep = match self.window {
            Some(w) => (w - 1).min(s),
            None => s,
        };
        for (r, c) in caches.iter_mut().enumerate() {
            *c = Some((
                k.narrow(0, r, 1)?.narrow(2, s - keep, keep)?.contiguous()?,
                v.narrow(0, r, 1)?.narrow(2, s - keep, keep)?.contiguous()?,
            ));
        }
        rows(&layer.wo, &y)
    }
}
