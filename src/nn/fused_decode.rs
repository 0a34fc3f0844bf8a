//! The fused CUDA decode path of the decoder stack (feature `cuda`): the decode steps of
//! [`Attention`], [`Mlp`], [`DecoderLayer`] and [`LayerCaches`] on the kernels of
//! [`super::cuda_kernels`], with the q/k/v and gate/up weights fused at load time. The eager
//! layers (`attention.rs`, `mlp.rs`, `transformer.rs`) know nothing of it beyond one dispatch:
//! [`LayerCaches::run`] hands a decode input here first ([`LayerCaches::try_run_fused`]), and
//! the talker's decode graphs call [`LayerCaches::run_fused`] directly.
//!
//! Numerics and launch counts: docs/cuda.md ("Fused decode kernels" and after).

use super::linear::Linear;
use candle_core::{DType, Device, Module, Result, Tensor};

use super::attention::{Attention, KvCache};
use super::cuda_kernels::{self, DecodeAt, Pos};
use super::mlp::Mlp;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::transformer::{DecoderLayer, LayerCaches};

/// `linears` as one matmul when the fused decode kernels are on for `device`: the weights
/// concatenated along the output rows, and the parts returned as row views of it (so the eager
/// path keeps working on the same memory). `None` (and the parts unchanged) off CUDA, with the
/// kernels off, or when a part has a bias.
pub(super) fn fuse<const N: usize>(
    device: &Device,
    linears: [Linear; N],
) -> ([Linear; N], Option<Linear>) {
    if !(device.is_cuda() && cuda_kernels::enabled()) {
        return (linears, None);
    }
    let refs: Vec<&Linear> = linears.iter().collect();
    match cuda_kernels::fused_linear::fuse_linears(&refs) {
        Ok((parts, fused)) => match <[Linear; N]>::try_from(parts) {
            Ok(parts) => (parts, Some(fused)),
            Err(_) => (linears, None),
        },
        Err(_) => (linears, None),
    }
}

impl Attention {
    /// Whether [`Self::forward_fused`] can run `t` query rows attending to at most `max_keys`
    /// keys on `x`'s device and dtype (CUDA, bf16/f32, kernels enabled, no sliding window,
    /// supported head width).
    pub(super) fn fused_ok(&self, x: &Tensor, t: usize, max_keys: usize) -> bool {
        use cuda_kernels::decode_attention::{MAX_KEYS, supports_head_dim};
        use cuda_kernels::qk_norm_rope::supports_head_dim as rope_supports_head_dim;
        cuda_kernels::usable_for(x)
            && self.sliding_window.is_none()
            && (1..=cuda_kernels::MAX_DECODE_ROWS).contains(&t)
            && max_keys <= MAX_KEYS
            && supports_head_dim(self.head_dim)
            && rope_supports_head_dim(self.head_dim)
            && self.num_kv_heads > 0
            && self.num_heads.is_multiple_of(self.num_kv_heads)
            && self.q_norm.is_some() == self.k_norm.is_some()
            && self
                .q_norm
                .as_ref()
                .zip(self.k_norm.as_ref())
                .is_none_or(|(q, k)| q.eps() == k.eps())
    }

    /// The q and k head norms' weights in `dtype` and their epsilon, as the fused kernels take
    /// them (`None` for a stack without them: the kernels then apply RoPE only).
    pub(super) fn head_norm_weights(&self, dtype: DType) -> Result<Option<(Tensor, Tensor, f64)>> {
        match (&self.q_norm, &self.k_norm) {
            (Some(q), Some(k)) => Ok(Some((q.weight_as(dtype)?, k.weight_as(dtype)?, q.eps()))),
            _ => Ok(None),
        }
    }

    /// Ensures `cache` has buffers with room for `t` more positions of this layer's keys/values
    /// (`batch` rows, `dtype`), as [`Self::forward`] would allocate them.
    pub(super) fn reserve(
        &self,
        cache: &mut KvCache,
        batch: usize,
        t: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<()> {
        cache.ensure_capacity(
            &[batch, self.num_kv_heads, t, self.head_dim],
            dtype,
            device,
            t,
        )
    }

    /// The decode path with the fused CUDA kernels (`src/nn/cuda_kernels`): `x` `[batch, t,
    /// hidden]` (already input-normed) at positions `at.pos + i`, with `at`'s f32 RoPE tables.
    /// Writes the new keys/values into slots `at.pos + i` of `cache`'s buffers (does not change
    /// `cache.seq_len()`) and attends causally to at most `at.max_keys` slots. Returns `[batch, t,
    /// hidden]` as [`Self::forward`]. Launches: 1 matmul (q/k/v fused, 3 otherwise) + 1 or 2 for
    /// the norms, RoPE, cache write and attention ([`Self::attend_fused`]) + 1 `o_proj`.
    fn forward_fused(&self, x: &Tensor, at: DecodeAt<'_>, cache: &KvCache) -> Result<Tensor> {
        let (q, k, v) = self.project_qkv(x)?;
        self.o_proj
            .forward(&self.attend_fused(&q, &k, &v, at, cache)?)
    }

    /// `q`, `k`, `v` of `x` `[batch, t, hidden]`: one matmul with the fused q/k/v weight (views of
    /// its output), else three.
    pub(super) fn project_qkv(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        match &self.qkv_proj {
            Some(qkv) => self.split_qkv(&qkv.forward(x)?),
            None => Ok((
                self.q_proj.forward(x)?,
                self.k_proj.forward(x)?,
                self.v_proj.forward(x)?,
            )),
        }
    }

    /// `qkv` `[batch, t, (heads + 2·kv_heads)·head_dim]` (the fused q/k/v weight's output) as
    /// views `q` `[batch, t, heads·head_dim]`, `k`/`v` `[batch, t, kv_heads·head_dim]`.
    pub(super) fn split_qkv(&self, qkv: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let qd = self.num_heads * self.head_dim;
        let kvd = self.num_kv_heads * self.head_dim;
        Ok((
            qkv.narrow(2, 0, qd)?,
            qkv.narrow(2, qd, kvd)?,
            qkv.narrow(2, qd + kvd, kvd)?,
        ))
    }

    /// The part of [`Self::forward_fused`] between the projections and `o_proj`: `q` `[batch, t,
    /// heads·head_dim]`, `k`/`v` `[batch, t, kv_heads·head_dim]` (rows evenly spaced: contiguous
    /// or views of one q/k/v output) → per-head norms, RoPE and cache writes, attention (one
    /// launch with every kernel on, else two) → `[batch, t, heads·head_dim]`, ready for `o_proj`.
    fn attend_fused(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        at: DecodeAt<'_>,
        cache: &KvCache,
    ) -> Result<Tensor> {
        use cuda_kernels::{decode_attention, qk_norm_rope, rope_attention};
        let DecodeAt {
            cos,
            sin,
            pos,
            max_keys,
        } = at;
        let (Some(kb), Some(vb)) = (&cache.k, &cache.v) else {
            candle_core::bail!("fused decoding needs allocated KV buffers");
        };
        let dtype = q.dtype();
        let heads = self.heads();
        let weights = self.head_norm_weights(dtype)?;
        let norms = weights
            .as_ref()
            .map(|(q, k, eps)| qk_norm_rope::HeadNorms { q, k, eps: *eps });
        if cuda_kernels::all_enabled() && rope_attention::supports_head_dim(self.head_dim) {
            return rope_attention::rope_attention(
                q,
                k,
                v,
                norms,
                cos,
                sin,
                pos,
                kb,
                vb,
                heads,
                max_keys,
                self.scaling,
            );
        }
        let q = qk_norm_rope::qk_norm_rope_kv(q, k, v, norms, cos, sin, pos, kb, vb, heads)?;
        decode_attention::decode_attention(&q, kb, vb, pos, max_keys, self.scaling)
    }

    /// The head counts and width, as the fused kernels take them.
    pub(super) fn heads(&self) -> cuda_kernels::qk_norm_rope::Heads {
        cuda_kernels::qk_norm_rope::Heads {
            nh: self.num_heads,
            nkv: self.num_kv_heads,
            hd: self.head_dim,
        }
    }

    /// The fused q/k/v weight `[(heads + 2·kv_heads)·head_dim, hidden]` and `o_proj`'s weight
    /// `[hidden, heads·head_dim]`, when both exist without a bias (the one-row matmul path of
    /// [`LayerCaches::run_fused`]).
    fn gemv_weights(&self) -> Option<(&Tensor, &Tensor)> {
        let qkv = self.qkv_proj.as_ref()?;
        if qkv.bias().is_some() || self.o_proj.bias().is_some() {
            return None;
        }
        Some((qkv.weight()?, self.o_proj.weight()?))
    }

    /// This attention with `cache`'s buffers for the whole-stack decode kernel
    /// ([`cuda_kernels::decode_stack`]), in `dtype`; `None` without the fused q/k/v weight
    /// ([`Self::gemv_weights`]), with a sliding window, or before the cache has buffers.
    fn stack_attention(
        &self,
        cache: &KvCache,
        dtype: DType,
    ) -> Result<Option<cuda_kernels::decode_stack::StackAttention>> {
        let (Some((qkv, o)), Some(k_cache), Some(v_cache), None) =
            (self.gemv_weights(), &cache.k, &cache.v, self.sliding_window)
        else {
            return Ok(None);
        };
        let norms = self.head_norm_weights(dtype)?;
        Ok(Some(cuda_kernels::decode_stack::StackAttention {
            heads: self.heads(),
            qk_eps: norms.as_ref().map_or(0.0, |n| n.2),
            scale: self.scaling,
            qkv: qkv.clone(),
            qk_norm: norms.map(|(q, k, _)| (q, k)),
            o: o.clone(),
            k_cache: k_cache.clone(),
            v_cache: v_cache.clone(),
        }))
    }
}

impl Mlp {
    /// The fused gate/up weight `[2·intermediate, hidden]` (gate rows first) and `down_proj`'s
    /// weight `[hidden, intermediate]`, when the fused weight exists and `down_proj` has no bias
    /// (the one-row matmul path of [`LayerCaches::run_fused`]).
    fn gemv_weights(&self) -> Option<(&Tensor, &Tensor)> {
        let gate_up = self.gate_up.as_ref()?;
        if gate_up.bias().is_some() || self.down_proj.bias().is_some() {
            return None;
        }
        Some((gate_up.weight()?, self.down_proj.weight()?))
    }

    /// [`Self::forward`] with the fused CUDA kernels (`src/nn/cuda_kernels`): one gate/up matmul
    /// (two without the fused weight), one SiLU·up kernel, the down matmul. `x` `[batch, t,
    /// hidden]`, bf16 or f32 on CUDA.
    pub(super) fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let (gate, up) = match &self.gate_up {
            Some(gu) => {
                let gu = gu.forward(x)?;
                let n = gu.dim(2)? / 2;
                (gu.narrow(2, 0, n)?, gu.narrow(2, n, n)?)
            }
            None => (self.gate_proj.forward(x)?, self.up_proj.forward(x)?),
        };
        self.down_proj
            .forward(&cuda_kernels::silu_mul::silu_mul(&gate, &up)?)
    }
}

impl DecoderLayer {
    /// One layer on the fused CUDA decode path: `x` is the residual stream `[batch, t, hidden]`
    /// and `normed` = `input_layernorm(x)` (computed by the caller, fused with the previous
    /// layer's last add). Returns `(h, m)` with the layer output `h + m` left to the caller (so it
    /// fuses with the next layer's norm). `a`: the attention output of `normed` (after
    /// `o_proj`: [`Attention::forward_fused`], or a batched step's per-row attention).
    /// Launches: 1 (add + post-attention norm) + 3 (MLP).
    pub(super) fn finish_fused(&self, x: &Tensor, a: &Tensor) -> Result<(Tensor, Tensor)> {
        let post = &self.post_attention_layernorm;
        let (h, normed) = cuda_kernels::add_rms_norm::add_rms_norm(
            x,
            a,
            &post.weight_as(x.dtype())?,
            post.eps(),
        )?;
        let m = self.mlp.forward_fused(&normed)?;
        Ok((h, m))
    }

    /// Whether [`Self::forward_gemv`] takes `x` `[batch, t, hidden]`: the fused q/k/v and gate/up
    /// weights exist, no biases, and the one-row matmul kernels take every projection's shape
    /// (also requires [`LayerCaches::fused_ok`]).
    fn gemv_ok(&self, x: &Tensor) -> bool {
        use cuda_kernels::gemv::{supports, takes, vector_ok};
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
        cuda_kernels::all_usable_for(x)
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
    fn forward_gemv(&self, x: &Tensor, at: DecodeAt<'_>, cache: &KvCache) -> Result<Tensor> {
        use cuda_kernels::gemv::{gemv_residual, norm_gemv, norm_gemv_silu};
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

    /// This layer with `cache`'s buffers for the whole-stack decode kernel
    /// ([`cuda_kernels::decode_stack`]), in `dtype`; `None` where the layer does not take
    /// the one-row matmul path's weights or its two norms differ in epsilon.
    fn stack_layer(
        &self,
        cache: &KvCache,
        dtype: candle_core::DType,
    ) -> Result<Option<cuda_kernels::decode_stack::StackLayer>> {
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
        Ok(Some(cuda_kernels::decode_stack::StackLayer {
            eps: inp.eps(),
            input_norm: inp.weight_as(dtype)?,
            post_norm: post.weight_as(dtype)?,
            attn,
            gate_up: gate_up.clone(),
            down: down.clone(),
        }))
    }
}

impl LayerCaches {
    /// Whether `layers` can run `x` (`t` rows, at most `max_keys` keys) on the fused CUDA decode
    /// path ([`Self::run_fused`]).
    pub fn fused_ok(&self, layers: &[DecoderLayer], x: &Tensor, max_keys: usize) -> bool {
        let t = x.dim(1).unwrap_or(0);
        !layers.is_empty()
            && layers.len() == self.caches.len()
            && layers.iter().all(|l| l.self_attn.fused_ok(x, t, max_keys))
    }

    /// Runs `layers` over `x` (`[batch, t, hidden]`, `t` ≤ [`cuda_kernels::MAX_DECODE_ROWS`]) at positions
    /// `pos..pos+t` with the fused CUDA kernels (5 launches per layer with the one-row matmuls when
    /// every layer takes them ([`DecoderLayer::forward_gemv`]), else 9; ~27 unfused; docs/cuda.md):
    /// writes the new keys/values into those slots of the caches' buffers (allocated, with room;
    /// `seq_len()` unchanged) and attends causally to at most `max_keys` slots. `cos`/`sin`: f32
    /// RoPE tables from position 0. With a device `pos` (u32 `[1]`) the launches are the same for
    /// every position, so the call can be captured in a CUDA graph. Returns the last layer's output
    /// (before any final norm), as [`Self::run`]. Check [`Self::fused_ok`] first.
    pub fn run_fused(
        &self,
        layers: &[DecoderLayer],
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        pos: Pos<'_>,
        max_keys: usize,
    ) -> Result<Tensor> {
        if layers.is_empty() {
            candle_core::bail!("fused decode over an empty stack");
        }
        let at = DecodeAt {
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
        run_layers_fused(layers, x, |i, layer, normed| {
            let Some(cache) = self.caches.get(i) else {
                candle_core::bail!("fused decode: no cache for layer {i}");
            };
            layer.self_attn.forward_fused(normed, at, cache)
        })
    }

    /// [`Self::run_fused`] in one launch of the whole-stack decode kernel
    /// ([`cuda_kernels::decode_stack`]; bit-identical to the per-layer one-row matmul
    /// path), when it is on and takes this stack; `None` otherwise (nothing launched).
    fn run_stack(
        &self,
        layers: &[DecoderLayer],
        x: &Tensor,
        at: DecodeAt<'_>,
    ) -> Result<Option<Tensor>> {
        use cuda_kernels::decode_stack;
        if !cuda_kernels::stack_enabled() || layers.len() != self.caches.len() {
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
    /// The fused path of [`LayerCaches::run`] for one piece `x` (`[batch, t, hidden]`) at the next
    /// positions: when [`Self::fused_ok`] takes it, makes room in the caches, runs
    /// [`Self::run_fused`] at the host position `seq_len()`, advances the caches and returns the
    /// output; `None` (nothing run) otherwise.
    pub(super) fn try_run_fused(
        &mut self,
        layers: &[DecoderLayer],
        rope: &RotaryEmbedding,
        x: &Tensor,
    ) -> Result<Option<Tensor>> {
        let (b, t, _) = x.dims3()?;
        let past = self.seq_len();
        if !self.fused_ok(layers, x, past + t) {
            return Ok(None);
        }
        let (dtype, dev) = (x.dtype(), x.device().clone());
        for (layer, cache) in layers.iter().zip(self.caches.iter_mut()) {
            layer.self_attn.reserve(cache, b, t, dtype, &dev)?;
        }
        let (cos, sin) = rope.cos_sin(0, past + t)?;
        let h = self.run_fused(layers, x, &cos, &sin, Pos::Host(past), past + t)?;
        self.advance(t)?;
        Ok(Some(h))
    }
}

/// The per-layer fused decode path over `layers` (9 launches a layer): input norm, the attention
/// output `attend(i, layer, normed)` (after `o_proj`), then add + post-attention norm, MLP, and the
/// residual add fused with the next layer's input norm. `x`: the residual stream `[rows, t,
/// hidden]`, contiguous. Returns the last layer's output (before any final norm).
pub(super) fn run_layers_fused(
    layers: &[DecoderLayer],
    mut x: Tensor,
    mut attend: impl FnMut(usize, &DecoderLayer, &Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    use cuda_kernels::add_rms_norm::add_rms_norm;
    let Some(first) = layers.first() else {
        candle_core::bail!("fused decode over an empty stack");
    };
    let mut normed = first.input_layernorm.forward(&x)?;
    for (i, layer) in layers.iter().enumerate() {
        let a = attend(i, layer, &normed)?;
        let (h, m) = layer.finish_fused(&x, &a)?;
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
