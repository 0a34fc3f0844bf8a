//! Qwen3 pre-norm decoder layer (`Qwen3TTSTalkerDecoderLayer` / `Qwen3TTSDecoderLayer` in the
//! reference) and a helper to run a stack of them with per-layer KV caches.

use candle_core::{Result, Tensor};

use super::attention::{Attention, KvCache};
use super::config::TransformerConfig;
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weights::{WeightError, Weights};

/// Longest input, in positions, that [`LayerCaches::run`] runs through the stack in one piece;
/// longer ones (long text prompts) run in chunks of this many positions.
pub const PREFILL_CHUNK: usize = 512;

/// The error text of a prefill stopped by [`LayerCaches::run_until`]'s `stop`.
pub const PREFILL_STOPPED: &str = "prefill stopped (request cancelled)";

/// `h = x + o_proj(Attn(input_layernorm(x)))`; `y = h + mlp(post_attention_layernorm(h))`.
#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub(super) self_attn: Attention,
    pub(super) mlp: Mlp,
    pub(super) input_layernorm: RmsNorm,
    pub(super) post_attention_layernorm: RmsNorm,
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
    pub(super) caches: Vec<KvCache>,
    /// The whole-stack decode kernel's barrier state (one per stack of caches).
    #[cfg(feature = "cuda")]
    pub(super) stack_barrier: super::cuda_kernels::decode_stack::Barrier,
}

impl LayerCaches {
    pub fn new(num_layers: usize, capacity_hint: usize) -> Self {
        Self {
            caches: (0..num_layers)
                .map(|_| KvCache::new(capacity_hint))
                .collect(),
            #[cfg(feature = "cuda")]
            stack_barrier: Default::default(),
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
    /// Inputs longer than [`PREFILL_CHUNK`] positions (long prompts) run in chunks of that many,
    /// each attending to the cache and causally to itself, so a prefill's attention scores take
    /// `O(PREFILL_CHUNK × positions)` memory instead of `O(positions²)`; shorter inputs run in one
    /// piece. On CUDA, a decode input (`t` ≤ [`MAX_DECODE_ROWS`](super::cuda_kernels::MAX_DECODE_ROWS))
    /// takes the fused kernels (`fused_decode.rs`); everything else, and every CPU run, the ops
    /// below.
    pub fn run(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
    ) -> Result<Tensor> {
        self.run_in_chunks(layers, rope, x, PREFILL_CHUNK, &|| false)
    }

    /// [`Self::run`] that asks `stop` before each chunk of a long input and, when it answers
    /// true, fails with [`PREFILL_STOPPED`] (the caches then hold the chunks run so far), so a
    /// cancelled request does not wait for the rest of a long prompt.
    pub fn run_until(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        stop: &dyn Fn() -> bool,
    ) -> Result<Tensor> {
        self.run_in_chunks(layers, rope, x, PREFILL_CHUNK, stop)
    }

    /// [`Self::run_until`] with the chunk length as a parameter (`chunk` ≥ 1 positions).
    pub(crate) fn run_in_chunks(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        chunk: usize,
        stop: &dyn Fn() -> bool,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        if t > chunk {
            let mut outs = Vec::with_capacity(t.div_ceil(chunk));
            for start in (0..t).step_by(chunk) {
                if stop() {
                    candle_core::bail!("{PREFILL_STOPPED}");
                }
                let part = x.narrow(1, start, chunk.min(t - start))?;
                outs.push(self.run_in_chunks(layers, rope, &part, chunk, stop)?);
            }
            return Tensor::cat(&outs, 1);
        }
        #[cfg(feature = "cuda")]
        if let Some(h) = self.try_run_fused(layers, rope, x)? {
            return Ok(h);
        }
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
