//! Qwen3 self-attention as in the reference `Qwen3TTSTalkerAttention` / `Qwen3TTSAttention`:
//! separate `head_dim`, per-head RMSNorm on q and k (before RoPE), NeoX RoPE, grouped-query
//! attention, causal mask (optionally a sliding window), softmax in f32, KV cache.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::Linear;

use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::transformer::TransformerConfig;
use super::weights::{WeightError, Weights};

/// Growable key/value cache of one attention layer. Keys and values are stored as
/// `[batch, kv_heads, seq, head_dim]` in the activation dtype.
#[derive(Debug, Clone)]
pub struct KvCache {
    inner: candle_nn::kv_cache::KvCache,
}

impl KvCache {
    /// `capacity_hint`: initial number of positions to allocate (the cache grows by the same
    /// amount when full).
    pub fn new(capacity_hint: usize) -> Self {
        Self {
            inner: candle_nn::kv_cache::KvCache::new(2, capacity_hint.max(1)),
        }
    }

    /// Number of cached positions.
    pub fn seq_len(&self) -> usize {
        self.inner.current_seq_len()
    }

    /// Drops every cached position (keeps the allocation).
    pub fn reset(&mut self) {
        self.inner.reset();
    }

    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        self.inner.append(&k.contiguous()?, &v.contiguous()?)
    }
}

/// Additive f32 mask `[t, past + t]`: 0 where query `past+i` may see key `j`, -inf elsewhere.
fn causal_mask(
    t: usize,
    past: usize,
    sliding_window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    let s = past + t;
    let mut data = Vec::with_capacity(t * s);
    for i in 0..t {
        let qpos = past + i;
        for j in 0..s {
            let visible = j <= qpos && sliding_window.is_none_or(|w| qpos - j < w);
            data.push(if visible { 0f32 } else { f32::NEG_INFINITY });
        }
    }
    Tensor::from_vec(data, (t, s), device)
}

/// Weights: `q_proj` `[heads*head_dim, hidden]`, `k_proj`/`v_proj` `[kv_heads*head_dim, hidden]`,
/// `o_proj` `[hidden, heads*head_dim]` (biases iff `attention_bias`), `q_norm`/`k_norm` `[head_dim]`.
#[derive(Debug, Clone)]
pub struct Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    scaling: f64,
    sliding_window: Option<usize>,
}

impl Attention {
    /// Loads the attention at `vb` (the checkpoint's `…self_attn` prefix).
    pub fn new(cfg: &TransformerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let h = cfg.hidden_size;
        let qd = cfg.num_attention_heads * cfg.head_dim;
        let kvd = cfg.num_key_value_heads * cfg.head_dim;
        let b = cfg.attention_bias;
        Ok(Self {
            q_proj: vb.linear(h, qd, b, "q_proj")?,
            k_proj: vb.linear(h, kvd, b, "k_proj")?,
            v_proj: vb.linear(h, kvd, b, "v_proj")?,
            o_proj: vb.linear(qd, h, b, "o_proj")?,
            q_norm: RmsNorm::new(cfg.head_dim, cfg.rms_norm_eps, &vb.pp("q_norm"))?,
            k_norm: RmsNorm::new(cfg.head_dim, cfg.rms_norm_eps, &vb.pp("k_norm"))?,
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            scaling: 1.0 / (cfg.head_dim as f64).sqrt(),
            sliding_window: cfg.sliding_window,
        })
    }

    /// `x`: `[batch, t, hidden]`; `cos`/`sin`: `[t, head_dim/2]` (f32, or already in the
    /// activation dtype) for the positions
    /// `cache.seq_len()..cache.seq_len()+t`. Appends the new keys/values to `cache`.
    /// Returns `[batch, t, hidden]`.
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let past = cache.seq_len();
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = nh / nkv;

        let q = self.q_proj.forward(x)?.reshape((b, t, nh, hd))?;
        let q = self.q_norm.forward(&q)?.transpose(1, 2)?.contiguous()?;
        let k = self.k_proj.forward(x)?.reshape((b, t, nkv, hd))?;
        let k = self.k_norm.forward(&k)?.transpose(1, 2)?.contiguous()?;
        let v = self
            .v_proj
            .forward(x)?
            .reshape((b, t, nkv, hd))?
            .transpose(1, 2)?;

        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = RotaryEmbedding::apply(&k, cos, sin)?;
        let (k, v) = cache.append(&k, &v)?;
        let s = k.dim(2)?;

        // Grouped-query attention without repeating k/v: query heads g*rep..g*rep+rep-1 share kv
        // head g (the reference's `repeat_kv` = repeat_interleave), so fold them into the rows.
        let dtype = q.dtype();
        let q = q.reshape((b, nkv, rep * t, hd))?;
        let scores = (q.matmul(&k.t()?)? * self.scaling)?;
        let scores = scores.to_dtype(DType::F32)?;
        let scores = if t > 1 || self.sliding_window.is_some_and(|w| w < s) {
            let mask = causal_mask(t, past, self.sliding_window, x.device())?;
            scores
                .reshape((b, nkv, rep, t, s))?
                .broadcast_add(&mask)?
                .reshape((b, nkv, rep * t, s))?
        } else {
            scores
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(dtype)?;
        let out = probs.matmul(&v.contiguous()?)?; // [b, nkv, rep*t, hd]
        let out = out
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?;
        self.o_proj.forward(&out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_is_causal_with_past_and_window() {
        let m = causal_mask(2, 3, None, &Device::Cpu).unwrap();
        let v: Vec<Vec<f32>> = m.to_vec2().unwrap();
        assert_eq!(v[0], vec![0., 0., 0., 0., f32::NEG_INFINITY]);
        assert_eq!(v[1], vec![0., 0., 0., 0., 0.]);
        let m = causal_mask(2, 3, Some(2), &Device::Cpu).unwrap();
        let v: Vec<Vec<f32>> = m.to_vec2().unwrap();
        let n = f32::NEG_INFINITY;
        assert_eq!(v[0], vec![n, n, 0., 0., n]);
        assert_eq!(v[1], vec![n, n, n, 0., 0.]);
    }
}
