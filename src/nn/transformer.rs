//! Qwen3 pre-norm decoder layer (`Qwen3TTSTalkerDecoderLayer` / `Qwen3TTSDecoderLayer` in the
//! reference) and a helper to run a stack of them with per-layer KV caches.

use candle_core::{Result, Tensor};

use super::attention::{Attention, KvCache};
use super::config::TransformerConfig;
use super::linear::Linear;
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weights::{WeightError, Weights};

/// Longest input, in positions, that [`LayerCaches::run`] runs through the stack in one piece;
/// longer ones (long text prompts) run in chunks of this many positions.
pub const PREFILL_CHUNK: usize = 512;

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

    /// A layer from its parts (weights loaded under other names: [`Attention::from_parts`],
    /// [`Mlp::from_parts`]) and its two norms `[hidden]`.
    pub fn from_parts(
        self_attn: Attention,
        mlp: Mlp,
        input_layernorm: RmsNorm,
        post_attention_layernorm: RmsNorm,
    ) -> Self {
        Self {
            self_attn,
            mlp,
            input_layernorm,
            post_attention_layernorm,
        }
    }

    /// The layer's linear layers: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
    /// `up_proj`, `down_proj`.
    pub fn linears(&self) -> [&Linear; 7] {
        let (a, m) = (&self.self_attn, &self.mlp);
        [
            &a.q_proj,
            &a.k_proj,
            &a.v_proj,
            &a.o_proj,
            &m.gate_proj,
            &m.up_proj,
            &m.down_proj,
        ]
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
        self.add_mlp(x, &h)
    }

    /// [`Self::forward`] with the attention mask given ([`Attention::forward_masked`]).
    pub fn forward_masked(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let h = self.self_attn.forward_masked(
            &self.input_layernorm.forward(x)?,
            cos,
            sin,
            cache,
            mask,
        )?;
        self.add_mlp(x, &h)
    }

    /// [`Self::forward`] for one position of each of several sequences with their own caches (see
    /// [`Attention::forward_rows`]): `x` `[rows, 1, hidden]`, `cos`/`sin` `[rows, 1, head_dim/2]`.
    pub fn forward_rows(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        let h = self
            .self_attn
            .forward_rows(&self.input_layernorm.forward(x)?, cos, sin, caches)?;
        self.add_mlp(x, &h)
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
        self.add_mlp(x, &h)
    }

    /// The layer's second half: `h = x + attn`, then `h + mlp(post_attention_layernorm(h))`.
    fn add_mlp(&self, x: &Tensor, attn: &Tensor) -> Result<Tensor> {
        let h = (x + attn)?;
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

    /// Makes these caches hold positions `0..count` of `src`, a cache of a stack of the same depth
    /// whose buffers hold at least `count` written positions (its `seq_len()` is not consulted: the
    /// prefill graphs' scratch cache is written on the device). Grows the buffers as an append
    /// would, copies (on CUDA with the fused kernels: one launch for every layer,
    /// [`super::cuda_kernels::kv_prefix::kv_prefix_copy`]) and sets `seq_len()` to `count`.
    /// Errors when the depths differ, these caches already hold positions, or `src` lacks buffers
    /// or room for `count` positions.
    pub fn fill_prefix_from(&mut self, src: &LayerCaches, count: usize) -> Result<()> {
        self.fill_prefix_from_row(src, 0, count)
    }

    /// [`Self::fill_prefix_from`] from sequence `row` of a batched `src` (buffers `[batch,
    /// kv_heads, slots, head_dim]`, e.g. a batched prefill's scratch cache) into these caches of
    /// one sequence. Errors as [`Self::fill_prefix_from`], and when `row` is past `src`'s batch.
    pub fn fill_prefix_from_row(
        &mut self,
        src: &LayerCaches,
        row: usize,
        count: usize,
    ) -> Result<()> {
        if self.caches.len() != src.caches.len() {
            candle_core::bail!(
                "KV prefix: caches of {} layers from a stack of {}",
                self.caches.len(),
                src.caches.len()
            );
        }
        if self.seq_len() != 0 {
            candle_core::bail!(
                "KV prefix: the caches already hold {} positions",
                self.seq_len()
            );
        }
        let mut pairs = Vec::with_capacity(src.caches.len());
        for (d, s) in self.caches.iter_mut().zip(&src.caches) {
            let (Some(k), Some(v)) = (&s.k, &s.v) else {
                candle_core::bail!("KV prefix: the source has no buffers");
            };
            if k.dim(2)? < count {
                candle_core::bail!("KV prefix: {count} positions from {} slots", k.dim(2)?);
            }
            if row >= k.dim(0)? {
                candle_core::bail!("KV prefix: sequence {row} of a batch of {}", k.dim(0)?);
            }
            let (k, v) = (k.narrow(0, row, 1)?, v.narrow(0, row, 1)?);
            d.ensure_capacity(k.dims(), k.dtype(), k.device(), count)?;
            pairs.push((k, v));
        }
        let dst: Vec<(&Tensor, &Tensor)> = self
            .caches
            .iter()
            .filter_map(|c| c.k.as_ref().zip(c.v.as_ref()))
            .collect();
        if dst.len() != pairs.len() {
            candle_core::bail!("KV prefix: destination buffers missing after allocation");
        }
        #[cfg(feature = "cuda")]
        if pairs.first().is_some_and(|(k, _)| k.device().is_cuda())
            && super::cuda_kernels::enabled()
        {
            let s: Vec<&Tensor> = pairs.iter().flat_map(|(k, v)| [k, v]).collect();
            let d: Vec<&Tensor> = dst.iter().flat_map(|(k, v)| [*k, *v]).collect();
            super::cuda_kernels::kv_prefix::kv_prefix_copy(&s, &d, count)?;
            return self.advance(count);
        }
        for ((sk, sv), (dk, dv)) in pairs.iter().zip(&dst) {
            dk.slice_set(&sk.narrow(2, 0, count)?.contiguous()?, 2, 0)?;
            dv.slice_set(&sv.narrow(2, 0, count)?.contiguous()?, 2, 0)?;
        }
        self.advance(count)
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
    /// piece. On CUDA, a decode input (`t` ≤ `cuda_kernels::MAX_DECODE_ROWS`) takes the fused
    /// kernels (`fused_decode.rs`); everything else, and every CPU run, the ops below.
    pub fn run(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
    ) -> Result<Tensor> {
        self.run_in_chunks(layers, rope, x, PREFILL_CHUNK)
    }

    /// [`Self::run`] with the chunk length as a parameter (`chunk` ≥ 1 positions).
    pub(crate) fn run_in_chunks(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        chunk: usize,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        if t > chunk {
            let mut outs = Vec::with_capacity(t.div_ceil(chunk));
            for start in (0..t).step_by(chunk) {
                let part = x.narrow(1, start, chunk.min(t - start))?;
                outs.push(self.run_in_chunks(layers, rope, &part, chunk)?);
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

    /// [`Self::run`] in one piece with the additive attention mask given (`[t, seq_len() + t]`
    /// f32, [`super::attention::causal_mask`]): the eager ops without the fused decode path and
    /// without uploading a mask, so the call can be captured in a CUDA graph (the prefill graphs).
    /// No sliding window. Errors as [`Self::run`], or for a mask of another shape.
    pub fn run_masked(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let t = x.dim(1)?;
        let (cos, sin) = rope.cos_sin(self.seq_len(), t)?;
        let (cos, sin) = (cos.to_dtype(x.dtype())?, sin.to_dtype(x.dtype())?);
        let mut h = x.clone();
        for (layer, cache) in layers.iter().zip(self.caches.iter_mut()) {
            h = layer.forward_masked(&h, &cos, &sin, cache, mask)?;
        }
        Ok(h)
    }

    /// [`Self::run_rows`] on the fused CUDA kernels when they take the stack and the rows (one
    /// attention launch per layer for every row: [`super::rows_decode::run_rows_fused`], up to
    /// the GEMM's summation order), else the eager ops of [`Self::run_rows`]. Same arguments,
    /// result and errors.
    pub fn decode_rows(
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if let Some(h) = super::rows_decode::try_decode_rows_fused(layers, rope, x, caches)? {
            return Ok(h);
        }
        Self::run_rows(layers, rope, x, caches)
    }

    /// One decode position for each of `caches.len()` sequences, each with its own caches at its
    /// own position: `x` `[rows, 1, hidden]`, row i at position `caches[i].seq_len()`, appended
    /// to `caches[i]`. The norms, projections and MLP run over all rows at once (one matmul per
    /// weight); each row attends over its own caches ([`Attention::forward_rows`]). The RoPE rows
    /// are picked from the tables with a u32 position tensor `[rows]`. Returns the last layer's
    /// output `[rows, 1, hidden]` (before any final norm), each row equal to what [`Self::run`]
    /// gives for it alone up to the matmul's float rounding (the CPU matmul takes another kernel
    /// for one row than for several). Eager ops on every device. Errors when the rows and caches
    /// differ in number or a cache belongs to a stack of another depth.
    pub fn run_rows(
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
        caches: &mut [&mut LayerCaches],
    ) -> Result<Tensor> {
        if let Some(c) = caches.iter().find(|c| c.caches.len() != layers.len()) {
            candle_core::bail!(
                "decode rows: caches of {} layers for a stack of {}",
                c.caches.len(),
                layers.len()
            );
        }
        let positions: Vec<u32> = caches.iter().map(|c| c.seq_len() as u32).collect();
        let end = positions.iter().max().map_or(0, |&p| p as usize + 1);
        let (cos, sin) = rope.cos_sin(0, end)?;
        let rows = Tensor::new(positions.as_slice(), x.device())?;
        let pick = |table: &Tensor| -> Result<Tensor> {
            table
                .index_select(&rows, 0)?
                .unsqueeze(1)?
                .to_dtype(x.dtype())
        };
        let (cos, sin) = (pick(&cos)?, pick(&sin)?);
        let mut h = x.clone();
        for (l, layer) in layers.iter().enumerate() {
            let mut layer_caches: Vec<&mut KvCache> =
                caches.iter_mut().map(|c| &mut c.caches[l]).collect();
            h = layer.forward_rows(&h, &cos, &sin, &mut layer_caches)?;
        }
        Ok(h)
    }
}
