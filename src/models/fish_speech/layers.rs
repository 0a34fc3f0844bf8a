//! The transformer block of the slow and fast ARs (the reference's `TransformerBlock`), with the
//! checkpoint's names: `attention.wqkv` (fused q, k, v rows), `attention.wo`,
//! `attention.{q,k}_norm` (optional), `feed_forward.w1/w3/w2` (SwiGLU), `attention_norm`,
//! `ffn_norm`.
//!
//! `h = x + wo(attn(attention_norm(x)))`, `y = h + w2(silu(w1(n)) · w3(n))` with
//! `n = ffn_norm(h)`. Attention: q/k RMSNorm over each head (before RoPE), interleaved RoPE with
//! a bf16 table ([`RopeTable`]), grouped-query heads (query head j reads key/value head
//! `j / (n_head / n_kv_head)`), causal softmax in f32.

use candle_core::{DType, Module, Result, Tensor};

use super::config::StackDims;
use super::rope::RopeTable;
use crate::nn::{Linear, RmsNorm, WeightError, Weights};

/// Keys and values of one layer, `[batch, kv_heads, positions, head_dim]` each.
#[derive(Debug, Clone, Default)]
pub struct LayerCache {
    kv: Option<(Tensor, Tensor)>,
}

impl LayerCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.kv.as_ref().map_or(0, |(k, _)| k.dim(2).unwrap_or(0))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (k, v) = match self.kv.take() {
            Some((pk, pv)) => (Tensor::cat(&[&pk, k], 2)?, Tensor::cat(&[&pv, v], 2)?),
            None => (k.contiguous()?, v.contiguous()?),
        };
        self.kv = Some((k.clone(), v.clone()));
        Ok((k, v))
    }
}

/// One cache per layer of a stack.
pub type StackCache = Vec<LayerCache>;

/// Self-attention with a fused `wqkv` projection.
#[derive(Debug, Clone)]
pub struct Attention {
    /// `[(n_head + 2 · n_kv_head) · head_dim, dim]`.
    wqkv: Linear,
    /// `[dim, n_head · head_dim]`.
    wo: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    n_head: usize,
    n_kv_head: usize,
    head_dim: usize,
}

impl Attention {
    pub fn new(d: &StackDims, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let qkv = (d.n_head + 2 * d.n_kv_head) * d.head_dim;
        let (q_norm, k_norm) = if d.qk_norm {
            (
                Some(RmsNorm::new(d.head_dim, d.norm_eps, &vb.pp("q_norm"))?),
                Some(RmsNorm::new(d.head_dim, d.norm_eps, &vb.pp("k_norm"))?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            wqkv: vb.linear(d.dim, qkv, d.qkv_bias, "wqkv")?,
            wo: vb.linear(d.n_head * d.head_dim, d.dim, d.o_bias, "wo")?,
            q_norm,
            k_norm,
            n_head: d.n_head,
            n_kv_head: d.n_kv_head,
            head_dim: d.head_dim,
        })
    }

    /// `x` `[b, t, dim]` at positions `cache.len()..+t` → `[b, t, dim]`; appends to `cache`.
    pub fn forward(&self, x: &Tensor, rope: &RopeTable, cache: &mut LayerCache) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let start = cache.len();
        let (hd, nh, nkv) = (self.head_dim, self.n_head, self.n_kv_head);
        let qkv = self.wqkv.forward(x)?;
        let q = qkv.narrow(2, 0, nh * hd)?.reshape((b, t, nh, hd))?;
        let k = qkv.narrow(2, nh * hd, nkv * hd)?.reshape((b, t, nkv, hd))?;
        let v = qkv
            .narrow(2, (nh + nkv) * hd, nkv * hd)?
            .reshape((b, t, nkv, hd))?;
        let q = match &self.q_norm {
            Some(n) => n.forward(&q)?,
            None => q,
        };
        let k = match &self.k_norm {
            Some(n) => n.forward(&k)?,
            None => k,
        };
        let q = rope.apply(&q.transpose(1, 2)?, start)?;
        let k = rope.apply(&k.transpose(1, 2)?, start)?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let (k, v) = cache.append(&k, &v)?;
        let s = k.dim(2)?;
        let rep = nh / nkv;
        let expand = |x: &Tensor| -> Result<Tensor> {
            if rep == 1 {
                return Ok(x.clone());
            }
            x.unsqueeze(2)?
                .expand((b, nkv, rep, s, hd))?
                .reshape((b, nh, s, hd))
        };
        let (k, v) = (expand(&k)?, expand(&v)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.contiguous()?.matmul(&k.t()?.contiguous()?)? * scale)?;
        let scores = if t > 1 {
            scores.broadcast_add(&causal_bias(t, start, x.device())?)?
        } else {
            scores
        };
        let probs =
            candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(x.dtype())?;
        let y = probs.matmul(&v)?; // [b, nh, t, hd]
        let y = y.transpose(1, 2)?.reshape((b, t, nh * hd))?;
        self.wo.forward(&y)
    }
}

/// `[t, start + t]` additive mask: 0 where query `i` (position `start + i`) may see key `j`
/// (`j ≤ start + i`), −∞ elsewhere.
fn causal_bias(t: usize, start: usize, device: &candle_core::Device) -> Result<Tensor> {
    let s = start + t;
    let data: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..s).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(data, (t, s), device)
}

/// SwiGLU: `w2(silu(w1(x)) · w3(x))`.
#[derive(Debug, Clone)]
pub struct FeedForward {
    w1: Linear,
    w3: Linear,
    w2: Linear,
}

impl FeedForward {
    pub fn new(d: &StackDims, vb: &Weights) -> std::result::Result<Self, WeightError> {
        Ok(Self {
            w1: vb.linear(d.dim, d.intermediate, false, "w1")?,
            w3: vb.linear(d.dim, d.intermediate, false, "w3")?,
            w2: vb.linear(d.intermediate, d.dim, false, "w2")?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let g = candle_nn::ops::silu(&self.w1.forward(x)?)?;
        self.w2.forward(&(g * self.w3.forward(x)?)?)
    }
}

/// One pre-norm block.
#[derive(Debug, Clone)]
pub struct Block {
    attention: Attention,
    feed_forward: FeedForward,
    attention_norm: RmsNorm,
    ffn_norm: RmsNorm,
}

impl Block {
    pub fn new(d: &StackDims, vb: &Weights) -> std::result::Result<Self, WeightError> {
        Ok(Self {
            attention: Attention::new(d, &vb.pp("attention"))?,
            feed_forward: FeedForward::new(d, &vb.pp("feed_forward"))?,
            attention_norm: RmsNorm::new(d.dim, d.norm_eps, &vb.pp("attention_norm"))?,
            ffn_norm: RmsNorm::new(d.dim, d.norm_eps, &vb.pp("ffn_norm"))?,
        })
    }

    pub fn forward(&self, x: &Tensor, rope: &RopeTable, cache: &mut LayerCache) -> Result<Tensor> {
        let h = (x + self
            .attention
            .forward(&self.attention_norm.forward(x)?, rope, cache)?)?;
        &h + self.feed_forward.forward(&self.ffn_norm.forward(&h)?)?
    }
}

/// The blocks of a stack.
#[derive(Debug, Clone)]
pub struct Stack {
    pub blocks: Vec<Block>,
}

impl Stack {
    /// Loads `vb.layers.{0..n_layer}`.
    pub fn new(d: &StackDims, vb: &Weights) -> std::result::Result<Self, WeightError> {
        let blocks = (0..d.n_layer)
            .map(|i| Block::new(d, &vb.pp(format!("layers.{i}"))))
            .collect::<std::result::Result<_, _>>()?;
        Ok(Self { blocks })
    }

    /// An empty cache for this stack.
    pub fn new_cache(&self) -> StackCache {
        vec![LayerCache::default(); self.blocks.len()]
    }

    /// Runs every block over `x` `[b, t, dim]`, appending to `cache`.
    pub fn forward(&self, x: &Tensor, rope: &RopeTable, cache: &mut StackCache) -> Result<Tensor> {
        let mut h = x.clone();
        for (block, c) in self.blocks.iter().zip(cache.iter_mut()) {
            h = block.forward(&h, rope, c)?;
        }
        Ok(h)
    }
}
