//! Qwen3 pre-norm decoder layer (`Qwen3TTSTalkerDecoderLayer` / `Qwen3TTSDecoderLayer` in the
//! reference) and a helper to run a stack of them with per-layer KV caches.

use candle_core::{Result, Tensor};

use super::attention::{Attention, KvCache};
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weights::{WeightError, Weights};

/// Most query rows per call that take the fused CUDA decode path (decode steps: 1; the code
/// predictor's first step: 2); longer inputs (prefills) run the unfused ops.
#[cfg(feature = "cuda")]
pub(crate) const FUSED_MAX_ROWS: usize = 4;

/// Longest input, in positions, that [`LayerCaches::run`] runs through the stack in one piece;
/// longer ones (long text prompts) run in chunks of this many positions.
pub const PREFILL_CHUNK: usize = 512;

/// The error text of a prefill stopped by [`LayerCaches::run_until`]'s `stop`.
pub const PREFILL_STOPPED: &str = "prefill stopped (request cancelled)";

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

#[cfg(feature = "cuda")]
impl DecoderLayer {
    /// One layer on the fused CUDA decode path: `x` is the residual stream `[batch, t, hidden]`
    /// and `normed` = `input_layernorm(x)` (computed by the caller, fused with the previous
    /// layer's last add). Returns `(h, m)` with the layer output `h + m` left to the caller (so it
    /// fuses with the next layer's norm). See [`super::Attention::forward_fused`] for the rest.
    /// Launches: 4 (attention) + 1 (add + post-attention norm) + 3 (MLP).
    fn forward_fused(
        &self,
        x: &Tensor,
        normed: &Tensor,
        at: super::cuda_kernels::DecodeAt<'_>,
        cache: &KvCache,
    ) -> Result<(Tensor, Tensor)> {
        let a = self.self_attn.forward_fused(normed, at, cache)?;
        let post = &self.post_attention_layernorm;
        let (h, normed) = super::cuda_kernels::add_rms_norm::add_rms_norm(
            x,
            &a,
            &post.weight_as(x.dtype())?,
            post.eps(),
        )?;
        let m = self.mlp.forward_fused(&normed)?;
        Ok((h, m))
    }
}

#[cfg(feature = "cuda")]
impl DecoderLayer {
    /// Whether [`Self::forward_gemv`] takes `x` `[batch, t, hidden]`: the fused q/k/v and gate/up
    /// weights exist, no biases, and the one-row matmul kernels take every projection's shape
    /// (also requires [`LayerCaches::fused_ok`]).
    fn gemv_ok(&self, x: &Tensor) -> bool {
        use super::cuda_kernels::gemv::{supports, takes, vector_ok};
        let (Some((qkv, o)), Some((gate_up, down))) =
            (self.self_attn.gemv_weights(), self.mlp.gemv_weights())
        else {
            return false;
        };
        let Ok((b, t, hidden)) = x.dims3() else {
            return false;
        };
        // The inner inputs (attention output, SiLU·up) are fresh outputs of the kernels.
        let inner = |w: &Tensor| w.dim(1).is_ok_and(|k| supports(b * t, k, x.dtype(), w));
        let norm_ok = |n: &RmsNorm| {
            n.weight_as(x.dtype())
                .is_ok_and(|w| vector_ok(&w, hidden, x.dtype()))
        };
        super::cuda_kernels::all_usable_for(x)
            && takes(x, qkv)
            && inner(o)
            && takes(x, gate_up)
            && inner(down)
            && norm_ok(&self.input_layernorm)
            && norm_ok(&self.post_attention_layernorm)
    }

    /// One layer for a few decode rows with the one-row matmul kernels (`cuda_kernels::gemv`):
    /// input norm + q/k/v → per-head norms, RoPE, cache writes → attention → `o_proj` + residual →
    /// post-attention norm + gate/up + SiLU·up → `down_proj` + residual. `x` `[batch, t, hidden]`
    /// contiguous; returns the layer output `[batch, t, hidden]`. Launches: 5 (q/k norms, RoPE and
    /// attention in one; 9 on [`Self::forward_fused`]). Check [`Self::gemv_ok`] first.
    fn forward_gemv(
        &self,
        x: &Tensor,
        at: super::cuda_kernels::DecodeAt<'_>,
        cache: &KvCache,
    ) -> Result<Tensor> {
        use super::cuda_kernels::gemv::{gemv_residual, norm_gemv, norm_gemv_silu};
        let (Some((qkv_w, o_w)), Some((gate_up_w, down_w))) =
            (self.self_attn.gemv_weights(), self.mlp.gemv_weights())
        else {
            candle_core::bail!("one-row matmul path without fused q/k/v and gate/up weights");
        };
        let dtype = x.dtype();
        let (inp, post) = (&self.input_layernorm, &self.post_attention_layernorm);
        let qkv = norm_gemv(x, &inp.weight_as(dtype)?, inp.eps(), qkv_w)?;
        let (q, k, v) = self.self_attn.split_qkv(&qkv)?;
        let a = self.self_attn.attend_fused(&q, &k, &v, at, cache)?;
        let h = gemv_residual(&a, o_w, x)?;
        let act = norm_gemv_silu(&h, &post.weight_as(dtype)?, post.eps(), gate_up_w)?;
        gemv_residual(&act, down_w, &h)
    }
}

#[cfg(feature = "cuda")]
impl DecoderLayer {
    /// This layer with `cache`'s buffers for the whole-stack decode kernel
    /// ([`super::cuda_kernels::decode_stack`]), in `dtype`; `None` where the layer does not take
    /// the one-row matmul path's weights or its two norms differ in epsilon.
    fn stack_layer(
        &self,
        cache: &KvCache,
        dtype: candle_core::DType,
    ) -> Result<Option<super::cuda_kernels::decode_stack::StackLayer>> {
        let (inp, post) = (&self.input_layernorm, &self.post_attention_layernorm);
        let (Some(attn), Some((gate_up, down))) = (
            self.self_attn.stack_attention(cache, dtype)?,
            self.mlp.gemv_weights(),
        ) else {
            return Ok(None);
        };
        if inp.eps() != post.eps() {
            return Ok(None);
        }
        Ok(Some(super::cuda_kernels::decode_stack::StackLayer {
            eps: inp.eps(),
            input_norm: inp.weight_as(dtype)?,
            post_norm: post.weight_as(dtype)?,
            attn,
            gate_up: gate_up.clone(),
            down: down.clone(),
        }))
    }
}

/// One KV cache per layer of a stack.
#[derive(Debug, Clone)]
pub struct LayerCaches {
    caches: Vec<KvCache>,
    /// The whole-stack decode kernel's barrier state (one per stack of caches).
    #[cfg(feature = "cuda")]
    stack_barrier: super::cuda_kernels::decode_stack::Barrier,
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

    /// Whether `layers` can run `x` (`t` rows, at most `max_keys` keys) on the fused CUDA decode
    /// path ([`Self::run_fused`]).
    #[cfg(feature = "cuda")]
    pub fn fused_ok(&self, layers: &[DecoderLayer], x: &Tensor, max_keys: usize) -> bool {
        let t = x.dim(1).unwrap_or(0);
        !layers.is_empty()
            && layers.len() == self.caches.len()
            && layers.iter().all(|l| l.self_attn.fused_ok(x, t, max_keys))
    }

    /// Runs `layers` over `x` (`[batch, t, hidden]`, `t` ≤ `FUSED_MAX_ROWS`) at positions
    /// `pos..pos+t` with the fused CUDA kernels (5 launches per layer with the one-row matmuls when
    /// every layer takes them ([`DecoderLayer::forward_gemv`]), else 9; ~27 unfused; docs/cuda.md):
    /// writes the new keys/values into those slots of the caches' buffers (allocated, with room;
    /// `seq_len()` unchanged) and attends causally to at most `max_keys` slots. `cos`/`sin`: f32
    /// RoPE tables from position 0. With a device `pos` (u32 `[1]`) the launches are the same for
    /// every position, so the call can be captured in a CUDA graph. Returns the last layer's output
    /// (before any final norm), as [`Self::run`]. Check [`Self::fused_ok`] first.
    #[cfg(feature = "cuda")]
    pub fn run_fused(
        &self,
        layers: &[DecoderLayer],
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        pos: super::cuda_kernels::Pos<'_>,
        max_keys: usize,
    ) -> Result<Tensor> {
        use super::cuda_kernels::add_rms_norm::add_rms_norm;
        let Some(first) = layers.first() else {
            candle_core::bail!("fused decode over an empty stack");
        };
        let at = super::cuda_kernels::DecodeAt {
            cos,
            sin,
            pos,
            max_keys,
        };
        // The residual stream goes through `add_rms_norm` / the GEMV kernels: contiguous rows.
        let mut x = x.contiguous()?;
        if layers.iter().all(|l| l.gemv_ok(&x)) {
            if let Some(out) = self.run_stack(layers, &x, at)? {
                return Ok(out);
            }
            for (layer, cache) in layers.iter().zip(self.caches.iter()) {
                x = layer.forward_gemv(&x, at, cache)?;
            }
            return Ok(x);
        }
        let mut normed = first.input_layernorm.forward(&x)?;
        for (i, (layer, cache)) in layers.iter().zip(self.caches.iter()).enumerate() {
            let (h, m) = layer.forward_fused(&x, &normed, at, cache)?;
            match layers.get(i + 1) {
                Some(next) => {
                    let norm = &next.input_layernorm;
                    (x, normed) = add_rms_norm(&h, &m, &norm.weight_as(h.dtype())?, norm.eps())?;
                }
                None => x = (h + m)?,
            }
        }
        Ok(x)
    }

    /// [`Self::run_fused`] in one launch of the whole-stack decode kernel
    /// ([`super::cuda_kernels::decode_stack`]; bit-identical to the per-layer one-row matmul
    /// path), when it is on and takes this stack; `None` otherwise (nothing launched).
    #[cfg(feature = "cuda")]
    fn run_stack(
        &self,
        layers: &[DecoderLayer],
        x: &Tensor,
        at: super::cuda_kernels::DecodeAt<'_>,
    ) -> Result<Option<Tensor>> {
        use super::cuda_kernels::decode_stack;
        if !super::cuda_kernels::stack_enabled() || layers.len() != self.caches.len() {
            return Ok(None);
        }
        let mut parts = Vec::with_capacity(layers.len());
        for (layer, cache) in layers.iter().zip(&self.caches) {
            match layer.stack_layer(cache, x.dtype())? {
                Some(part) => parts.push(part),
                None => return Ok(None),
            }
        }
        if !decode_stack::takes(x, &parts, at.max_keys) {
            return Ok(None);
        }
        decode_stack::decode_stack(x, &parts, at, &self.stack_barrier).map(Some)
    }

    /// Runs `layers` over `x` (`[batch, t, hidden]`) at positions `seq_len()..seq_len()+t`,
    /// appending to the caches. Returns the last layer's output (before any final norm).
    /// Inputs longer than [`PREFILL_CHUNK`] positions (long prompts) run in chunks of that many,
    /// each attending to the cache and causally to itself, so a prefill's attention scores take
    /// `O(PREFILL_CHUNK × positions)` memory instead of `O(positions²)`; shorter inputs run in one
    /// piece. On CUDA, a decode input (`t` ≤ `FUSED_MAX_ROWS`) takes the fused kernels
    /// ([`Self::run_fused`]); everything else, and every CPU run, the ops below.
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
        {
            let past = self.seq_len();
            if self.fused_ok(layers, x, past + t) {
                let (b, dtype, dev) = (x.dim(0)?, x.dtype(), x.device().clone());
                for (layer, cache) in layers.iter().zip(self.caches.iter_mut()) {
                    layer.self_attn.reserve(cache, b, t, dtype, &dev)?;
                }
                let (cos, sin) = rope.cos_sin(0, past + t)?;
                let h = self.run_fused(
                    layers,
                    x,
                    &cos,
                    &sin,
                    super::cuda_kernels::Pos::Host(past),
                    past + t,
                )?;
                self.advance(t)?;
                return Ok(h);
            }
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
