//! Qwen3 self-attention as in the reference `Qwen3TTSTalkerAttention` / `Qwen3TTSAttention`:
//! separate `head_dim`, per-head RMSNorm on q and k (before RoPE), NeoX RoPE, grouped-query
//! attention, causal mask (optionally a sliding window), softmax in f32, KV cache.

use super::linear::Linear;
use candle_core::{DType, Device, Module, Result, Tensor};

use super::config::TransformerConfig;
use super::rms_norm::RmsNorm;
use super::rope::RotaryEmbedding;
use super::weights::{WeightError, Weights};

/// Growable key/value cache of one attention layer. Keys and values are stored as
/// `[batch, kv_heads, capacity, head_dim]` buffers in the activation dtype; appends copy into the
/// buffers in place and [`KvCache::reset`] keeps them, so a cache reused across utterances (the
/// code predictor resets its cache every frame) allocates nothing after the first use and its
/// device addresses stay fixed (what a CUDA graph replay needs). A clone copies the buffers.
#[derive(Debug)]
pub struct KvCache {
    pub(super) k: Option<Tensor>,
    pub(super) v: Option<Tensor>,
    len: usize,
    capacity_hint: usize,
}

impl Clone for KvCache {
    fn clone(&self) -> Self {
        let copy = |t: &Option<Tensor>| t.as_ref().and_then(|t| t.copy().ok());
        let (k, v) = (copy(&self.k), copy(&self.v));
        let ok = k.is_some() == self.k.is_some() && v.is_some() == self.v.is_some();
        Self {
            len: if ok { self.len } else { 0 },
            k: if ok { k } else { None },
            v: if ok { v } else { None },
            capacity_hint: self.capacity_hint,
        }
    }
}

impl KvCache {
    /// `capacity_hint`: initial number of positions to allocate (the cache grows by the same
    /// amount when full).
    pub fn new(capacity_hint: usize) -> Self {
        Self {
            k: None,
            v: None,
            len: 0,
            capacity_hint: capacity_hint.max(1),
        }
    }

    /// Number of cached positions.
    pub fn seq_len(&self) -> usize {
        self.len
    }

    /// Drops every cached position (keeps the allocation).
    pub fn reset(&mut self) {
        self.len = 0;
    }

    /// Slots allocated (positions the buffers hold before they must grow).
    pub fn capacity(&self) -> usize {
        self.k.as_ref().and_then(|k| k.dim(2).ok()).unwrap_or(0)
    }

    /// Counts `n` positions that were written into the buffers on the device
    /// ([`Attention::forward_at_slot`]). Errors past the allocated capacity.
    pub fn advance(&mut self, n: usize) -> Result<()> {
        if self.len + n > self.capacity() {
            candle_core::bail!(
                "KV cache: {} + {n} positions exceed its {} slots",
                self.len,
                self.capacity()
            );
        }
        self.len += n;
        Ok(())
    }

    /// Makes room for `t` more positions of keys/values shaped like `dims`
    /// (`[batch, kv_heads, _, head_dim]`) in `dtype`: allocates the buffers, or grows them by
    /// `capacity_hint` steps keeping the cached positions. Errors when positions are held in
    /// buffers of another batch/head count/dtype.
    pub(super) fn ensure_capacity(
        &mut self,
        dims: &[usize],
        dtype: DType,
        device: &Device,
        t: usize,
    ) -> Result<()> {
        let matches = |b: &Tensor| b.dims()[..2] == dims[..2] && b.dtype() == dtype;
        let cap = match &self.k {
            Some(b) if matches(b) => b.dim(2)?,
            Some(b) if self.len > 0 => candle_core::bail!(
                "KV cache holds {:?} {:?}, cannot append {:?} {:?}",
                b.dims(),
                b.dtype(),
                dims,
                dtype
            ),
            _ => 0, // never allocated, or empty with another batch/head count/dtype
        };
        if self.len + t > cap {
            let mut new_cap = cap;
            while new_cap < self.len + t {
                new_cap += self.capacity_hint;
            }
            let grow = |old: &Option<Tensor>| -> Result<Tensor> {
                let mut shape = dims.to_vec();
                shape[2] = new_cap;
                let buf = Tensor::zeros(shape, dtype, device)?;
                if let (true, Some(old)) = (self.len > 0, old) {
                    buf.slice_set(&old.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
                Ok(buf)
            };
            let (nk, nv) = (grow(&self.k)?, grow(&self.v)?);
            self.k = Some(nk);
            self.v = Some(nv);
        }
        Ok(())
    }

    /// Appends `k`/`v` (`[batch, kv_heads, t, head_dim]`); returns views of all cached positions.
    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let t = k.dim(2)?;
        self.ensure_capacity(k.dims(), k.dtype(), k.device(), t)?;
        let (Some(kb), Some(vb)) = (&self.k, &self.v) else {
            candle_core::bail!("KV cache buffers missing after allocation");
        };
        kb.slice_set(&k.contiguous()?, 2, self.len)?;
        vb.slice_set(&v.contiguous()?, 2, self.len)?;
        self.len += t;
        Ok((kb.narrow(2, 0, self.len)?, vb.narrow(2, 0, self.len)?))
    }
}

/// Additive f32 mask `[t, past + t]`: 0 where query `past+i` may see key `j`, -inf elsewhere.
pub fn causal_mask(
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
    pub(super) q_proj: Linear,
    pub(super) k_proj: Linear,
    pub(super) v_proj: Linear,
    pub(super) o_proj: Linear,
    /// q, k and v projections as one matmul (weights concatenated; `q_proj`/`k_proj`/`v_proj` are
    /// then row views of it): set on CUDA when the fused decode kernels are on and there is no
    /// bias (`fused_decode.rs`).
    #[cfg(feature = "cuda")]
    pub(super) qkv_proj: Option<Linear>,
    /// Per-head RMSNorm of q and k before RoPE; `None` for a stack without it (the fused
    /// CUDA decode kernels need both).
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    pub(super) num_heads: usize,
    pub(super) num_kv_heads: usize,
    pub(super) head_dim: usize,
    pub(super) scaling: f64,
    pub(super) sliding_window: Option<usize>,
}

impl Attention {
    /// Loads the attention at `vb` (the checkpoint's `…self_attn` prefix).
    pub fn new(cfg: &TransformerConfig, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let h = cfg.hidden_size;
        let qd = cfg.num_attention_heads * cfg.head_dim;
        let kvd = cfg.num_key_value_heads * cfg.head_dim;
        let b = cfg.attention_bias;
        let q_proj = vb.linear(h, qd, b, "q_proj")?;
        let k_proj = vb.linear(h, kvd, b, "k_proj")?;
        let v_proj = vb.linear(h, kvd, b, "v_proj")?;
        #[cfg(feature = "cuda")]
        let ([q_proj, k_proj, v_proj], qkv_proj) =
            super::fused_decode::fuse(vb.device(), [q_proj, k_proj, v_proj]);
        Ok(Self {
            q_proj,
            k_proj,
            v_proj,
            #[cfg(feature = "cuda")]
            qkv_proj,
            o_proj: vb.linear(qd, h, b, "o_proj")?,
            q_norm: Some(RmsNorm::new(
                cfg.head_dim,
                cfg.rms_norm_eps,
                &vb.pp("q_norm"),
            )?),
            k_norm: Some(RmsNorm::new(
                cfg.head_dim,
                cfg.rms_norm_eps,
                &vb.pp("k_norm"),
            )?),
            num_heads: cfg.num_attention_heads,
            num_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            scaling: 1.0 / (cfg.head_dim as f64).sqrt(),
            sliding_window: cfg.sliding_window,
        })
    }

    /// An attention from weights already loaded (a checkpoint with other names or a fused
    /// q/k/v matrix): `q_proj` `[heads·head_dim, hidden]`, `k_proj`/`v_proj`
    /// `[kv_heads·head_dim, hidden]`, `o_proj` `[hidden, heads·head_dim]`, optional per-head
    /// `q_norm`/`k_norm` (`[head_dim]`, both or neither), NeoX RoPE pairs (dims i and
    /// i + head_dim/2), scaling `1/sqrt(head_dim)`, no sliding window. `device`: where the
    /// weights are (on CUDA, q/k/v are fused into one matmul as [`Self::new`] does).
    pub fn from_parts(
        [q_proj, k_proj, v_proj, o_proj]: [Linear; 4],
        qk_norm: Option<(RmsNorm, RmsNorm)>,
        heads: (usize, usize),
        head_dim: usize,
        device: &Device,
    ) -> Self {
        #[cfg(feature = "cuda")]
        let ([q_proj, k_proj, v_proj], qkv_proj) =
            super::fused_decode::fuse(device, [q_proj, k_proj, v_proj]);
        #[cfg(not(feature = "cuda"))]
        let _ = device;
        let (q_norm, k_norm) = qk_norm.unzip();
        Self {
            q_proj,
            k_proj,
            v_proj,
            #[cfg(feature = "cuda")]
            qkv_proj,
            o_proj,
            q_norm,
            k_norm,
            num_heads: heads.0,
            num_kv_heads: heads.1,
            head_dim,
            scaling: 1.0 / (head_dim as f64).sqrt(),
            sliding_window: None,
        }
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
        let (q, k, v) = self.qkv(x, cos, sin)?;
        self.o_proj
            .forward(&self.attend_cached(&q, &k, &v, cache, None)?)
    }

    /// [`Self::forward`] with the additive f32 attention mask given (`[t, cache.seq_len() + t]`,
    /// as [`causal_mask`] makes it) instead of built on the host for the call, so that the work
    /// uploads nothing and can be captured in a CUDA graph (the prefill graphs).
    pub fn forward_masked(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        cache: &mut KvCache,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, cos, sin)?;
        self.o_proj
            .forward(&self.attend_cached(&q, &k, &v, cache, Some(mask))?)
    }

    /// One decode position for each of `caches.len()` sequences, each at its own position with
    /// its own cache: `x` `[rows, 1, hidden]`, row i at position `caches[i].seq_len()`;
    /// `cos`/`sin` `[rows, 1, head_dim/2]` for those positions. The projections run as one
    /// matmul over the rows; each row's attention runs over its own cache with the ops
    /// [`Self::forward`] runs for that row alone. Appends each row's key/value to its cache.
    /// Returns `[rows, 1, hidden]`. Errors when the rows and caches differ in number.
    pub fn forward_rows(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        caches: &mut [&mut KvCache],
    ) -> Result<Tensor> {
        let (rows, t, _) = x.dims3()?;
        if rows != caches.len() || t != 1 {
            candle_core::bail!(
                "decode rows: input {:?} for {} caches (one position per cache)",
                x.dims(),
                caches.len()
            );
        }
        let (q, k, v) = self.qkv(x, cos, sin)?;
        let mut out = Vec::with_capacity(rows);
        for (i, cache) in caches.iter_mut().enumerate() {
            let row = |t: &Tensor| t.narrow(0, i, 1);
            out.push(self.attend_cached(&row(&q)?, &row(&k)?, &row(&v)?, cache, None)?);
        }
        self.o_proj.forward(&Tensor::cat(&out, 0)?)
    }

    /// Appends `k`/`v` (`[b, kv_heads, t, hd]`) to `cache` and attends `q` (`[b, heads, t, hd]`,
    /// at positions `cache.seq_len()..`) over every cached position, causally (and within the
    /// sliding window), with `mask` when given (`[t, seq_len + t]`) or one built here. Returns
    /// `[b, t, heads·hd]`, before `o_proj`.
    fn attend_cached(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cache: &mut KvCache,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, _, t, _) = q.dims4()?;
        let past = cache.seq_len();
        let (k, v) = cache.append(k, v)?;
        let s = k.dim(2)?;
        let built = match mask {
            None if t > 1 || self.sliding_window.is_some_and(|w| w < s) => {
                Some(causal_mask(t, past, self.sliding_window, q.device())?)
            }
            _ => None,
        };
        self.attend_heads(q, &k, &v, mask.or(built.as_ref()), b, t)
    }

    /// One decode position whose index lives on the device, for CUDA graphs (the same kernels at
    /// every position): writes the new key/value into slot `p` of `cache`'s buffers with a scatter
    /// (`slot`: u32 `[batch, kv_heads, 1, head_dim]`, every element `p`) and attends over the
    /// first `mask.dim(1)` slots with the additive f32 `mask` `[1, bucket]` (0 for slots ≤ p,
    /// −inf after). `x`: `[batch, 1, hidden]`; `cos`/`sin`: `[1, head_dim/2]` for position `p`.
    /// Does not change `cache.seq_len()` (the caller advances it). No sliding window.
    /// Errors when the cache buffers are missing or hold fewer than `bucket` slots.
    pub fn forward_at_slot(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        slot: &Tensor,
        mask: &Tensor,
        cache: &KvCache,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let bucket = mask.dim(1)?;
        if self.sliding_window.is_some() {
            candle_core::bail!("slot decoding does not support a sliding window");
        }
        let (q, k, v) = self.qkv(x, cos, sin)?;
        let (Some(kb), Some(vb)) = (&cache.k, &cache.v) else {
            candle_core::bail!("slot decoding needs allocated KV buffers");
        };
        if kb.dim(2)? < bucket {
            candle_core::bail!("KV buffers hold {} slots, bucket is {bucket}", kb.dim(2)?);
        }
        kb.scatter_set(slot, &k.contiguous()?, 2)?;
        vb.scatter_set(slot, &v.contiguous()?, 2)?;
        let (k, v) = (kb.narrow(2, 0, bucket)?, vb.narrow(2, 0, bucket)?);
        self.o_proj
            .forward(&self.attend_heads(&q, &k, &v, Some(mask), b, t)?)
    }

    /// Projections, per-head norms and RoPE: `q` `[b, heads, t, hd]`, `k`/`v` `[b, kv_heads, t, hd]`.
    fn qkv(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let norm = |n: &Option<RmsNorm>, x: Tensor| match n {
            Some(n) => n.forward(&x),
            None => Ok(x),
        };
        let q = self.q_proj.forward(x)?.reshape((b, t, nh, hd))?;
        let q = norm(&self.q_norm, q)?.transpose(1, 2)?.contiguous()?;
        let k = self.k_proj.forward(x)?.reshape((b, t, nkv, hd))?;
        let k = norm(&self.k_norm, k)?.transpose(1, 2)?.contiguous()?;
        let v = self
            .v_proj
            .forward(x)?
            .reshape((b, t, nkv, hd))?
            .transpose(1, 2)?;
        let q = RotaryEmbedding::apply(&q, cos, sin)?;
        let k = RotaryEmbedding::apply(&k, cos, sin)?;
        Ok((q, k, v))
    }

    /// Scaled dot-product attention of `q` over `k`/`v` (`[b, kv_heads, s, hd]`) with an optional
    /// additive f32 mask `[t, s]`, softmax in f32. Returns `[b, t, heads·hd]`, before `o_proj`.
    fn attend_heads(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        b: usize,
        t: usize,
    ) -> Result<Tensor> {
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let s = k.dim(2)?;
        // Grouped-query attention without repeating k/v: query heads g*rep..g*rep+rep-1 share kv
        // head g (the reference's `repeat_kv` = repeat_interleave), so fold them into the rows.
        let dtype = q.dtype();
        let q = q.reshape((b, nkv, rep * t, hd))?;
        let scores = (q.matmul(&k.t()?)? * self.scaling)?;
        let scores = scores.to_dtype(DType::F32)?;
        let scores = match mask {
            Some(mask) => scores
                .reshape((b, nkv, rep, t, s))?
                .broadcast_add(mask)?
                .reshape((b, nkv, rep * t, s))?,
            None => scores,
        };
        let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(dtype)?;
        let out = probs.matmul(&v.contiguous()?)?; // [b, nkv, rep*t, hd]
        out.reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_grows_resets_and_keeps_its_buffers() {
        let dev = Device::Cpu;
        let mk = |t: usize, base: f32| {
            let n = 2 * t * 3;
            let data: Vec<f32> = (0..n).map(|i| base + i as f32).collect();
            Tensor::from_vec(data, (1, 2, t, 3), &dev).unwrap()
        };
        let mut c = KvCache::new(2);
        let (k, v) = c.append(&mk(1, 0.0), &mk(1, 100.0)).unwrap();
        assert_eq!((k.dims(), v.dims()), (&[1, 2, 1, 3][..], &[1, 2, 1, 3][..]));
        // Grows past the hint (2) and keeps the earlier positions.
        let (k, _) = c.append(&mk(3, 10.0), &mk(3, 200.0)).unwrap();
        assert_eq!(c.seq_len(), 4);
        let want = Tensor::cat(&[mk(1, 0.0), mk(3, 10.0)], 2).unwrap();
        assert_eq!(
            k.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // A clone is independent.
        let snapshot = c.clone();
        c.reset();
        assert_eq!(c.seq_len(), 0);
        let (k, v) = c.append(&mk(2, 50.0), &mk(2, 60.0)).unwrap();
        assert_eq!(k.dims(), &[1, 2, 2, 3]);
        assert_eq!(
            v.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            mk(2, 60.0).flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        assert_eq!(snapshot.seq_len(), 4);
        let kept = snapshot.k.as_ref().unwrap().narrow(2, 0, 4).unwrap();
        assert_eq!(
            kept.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // Another head count after a reset reallocates; while positions are held it is an error.
        c.reset();
        let other = Tensor::zeros((1, 4, 1, 3), DType::F32, &dev).unwrap();
        assert_eq!(c.append(&other, &other).unwrap().0.dims(), &[1, 4, 1, 3]);
        assert!(c.append(&mk(1, 0.0), &mk(1, 0.0)).is_err());
    }

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
