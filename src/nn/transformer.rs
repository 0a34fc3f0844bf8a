//! Qwen3 pre-norm decoder layer (`Qwen3TTSTalkerDecoderLayer` / `Qwen3TTSDecoderLayer` in the
//! reference) and a helper to run a stack of them with per-layer KV caches.

use candle_core::{Result, Tensor};

use super::attention::{Attention, KvCache};
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weights::{WeightError, Weights};

/// The sizes of one Qwen3 decoder stack, taken from a checkpoint's config.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Explicit per-head width (not necessarily hidden/heads).
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub attention_bias: bool,
    /// Causal sliding window in positions (a query sees itself and `w-1` earlier keys), or none.
    pub sliding_window: Option<usize>,
}

/// `h = x + o_proj(Attn(input_layernorm(x)))`; `y = h + mlp(post_attention_layernorm(h))`.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    self_attn: Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
}

impl DecoderLayer {
    /// Loads the layer at `vb` (e.g. `talker.model.layers.3`).
    pub fn new(cfg: &TransformerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        Ok(Self {
            self_attn: Attention::new(cfg, &vb.pp("self_attn"))?,
            mlp: Mlp::new(cfg.hidden_size, cfg.intermediate_size, &vb.pp("mlp"))?,
            input_layernorm: RmsNorm::new(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                &vb.pp("input_layernorm"),
            )?,
            post_attention_layernorm: RmsNorm::new(
                cfg.hidden_size,
                cfg.rms_norm_eps,
                &vb.pp("post_attention_layernorm"),
            )?,
        })
    }

    /// `x`: `[batch, t, hidden]` → `[batch, t, hidden]`; see [`Attention::forward`].
    pub fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let h = self
            .self_attn
            .forward(&self.input_layernorm.forward(x)?, cos, sin, cache)?;
        let h = (x + h)?;
        let m = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        h + m
    }

    /// [`Self::forward`] for one position whose index is on the device (see
    /// [`Attention::forward_at_slot`]).
    pub fn forward_at_slot(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        slot: &Tensor,
        mask: &Tensor,
        cache: &KvCache,
    ) -> Result<Tensor> {
        let h = self.self_attn.forward_at_slot(
            &self.input_layernorm.forward(x)?,
            cos,
            sin,
            slot,
            mask,
            cache,
        )?;
        let h = (x + h)?;
        let m = self
            .mlp
            .forward(&self.post_attention_layernorm.forward(&h)?)?;
        h + m
    }
}

/// One KV cache per layer of a stack.
#[derive(Debug, Clone)]
pub struct LayerCaches {
    caches: Vec<KvCache>,
}

impl LayerCaches {
    pub fn new(num_layers: usize, capacity_hint: usize) -> Self {
        Self {
            caches: (0..num_layers)
                .map(|_| KvCache::new(capacity_hint))
                .collect(),
        }
    }

    /// Positions cached so far (the position of the next input).
    pub fn seq_len(&self) -> usize {
        self.caches.first().map_or(0, KvCache::seq_len)
    }

    pub fn reset(&mut self) {
        self.caches.iter_mut().for_each(KvCache::reset);
    }

    /// Slots every layer's buffers hold (0 before the first append).
    pub fn capacity(&self) -> usize {
        self.caches.iter().map(KvCache::capacity).min().unwrap_or(0)
    }

    /// Counts `n` positions written on the device by [`Self::run_at_slot`].
    pub fn advance(&mut self, n: usize) -> Result<()> {
        self.caches.iter_mut().try_for_each(|c| c.advance(n))
    }

    /// Runs `layers` over one position `p` whose index is on the device: `x` `[batch, 1, hidden]`,
    /// `cos`/`sin` `[1, head_dim/2]` in `x`'s dtype, `slot` u32 `[batch, kv_heads, 1, head_dim]`
    /// filled with `p`, `mask` f32 `[1, bucket]` (see [`Attention::forward_at_slot`]). The same
    /// kernels run for every `p` below `bucket`, so the call can be captured in a CUDA graph.
    /// `seq_len()` is unchanged; call [`Self::advance`] after the work has run.
    pub fn run_at_slot(
        &self,
        layers: &[DecoderLayer],
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        slot: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let mut h = x.clone();
        for (layer, cache) in layers.iter().zip(self.caches.iter()) {
            h = layer.forward_at_slot(&h, cos, sin, slot, mask, cache)?;
        }
        Ok(h)
    }

    /// Runs `layers` over `x` (`[batch, t, hidden]`) at positions `seq_len()..seq_len()+t`,
    /// appending to the caches. Returns the last layer's output (before any final norm).
    pub fn run(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        let (cos, sin) = rope.cos_sin(self.seq_len(), t)?;
        // Cast once per stack (the reference casts the f32 tables to the activation dtype too).
        let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
        let mut h = x.clone();
        for (layer, cache) in layers.iter().zip(self.caches.iter_mut()) {
            h = layer.forward(&h, &cos, &sin, cache)?;
        }
        Ok(h)
    }
}
