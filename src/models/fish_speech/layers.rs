//! The transformer blocks of the slow and fast ARs (the reference's `TransformerBlock`), read
//! from the checkpoint's names into omnitts' one decoder stack ([`DecoderLayer`]), so that Fish
//! runs on the same batched rows, fused CUDA kernels and KV caches as every other model.
//!
//! Checkpoint names per block: `attention.wqkv` (q, k, v rows fused), `attention.wo`,
//! `attention.{q,k}_norm` (optional), `feed_forward.w1/w3/w2` (SwiGLU: gate, up, down),
//! `attention_norm`, `ffn_norm`. The block is `h = x + wo(attn(attention_norm(x)))`,
//! `y = h + w2(silu(w1(n)) · w3(n))` with `n = ffn_norm(h)`: the decoder layer's formula.
//!
//! RoPE: Fish rotates interleaved pairs (dims 2i and 2i+1) with a cos/sin table rounded to bf16;
//! the decoder stack rotates NeoX pairs (dims i and i + head_dim/2). At load, each head's q and
//! k rows (and the q/k norm weights) are reordered so that the old dim 2i becomes dim i and
//! 2i+1 becomes i + head_dim/2: the NeoX rotation of the reordered vectors is the interleaved
//! rotation of the original ones with the same angle per pair, and q·k is the same sum in
//! another order (RMSNorm over a head is unchanged by a reordering). v and `wo` keep their
//! order, so the attention output is the reference's. The table is [`RotaryEmbedding::
//! with_bf16_table`].

use candle_core::{Device, Tensor};

use super::config::StackDims;
use crate::nn::{
    Attention, DecoderLayer, Linear, Mlp, RmsNorm, RotaryEmbedding, WeightError, Weights,
};

/// The row order that turns `heads` heads of interleaved RoPE pairs into NeoX pairs: entry
/// `h·hd + i` is `h·hd + 2i` and entry `h·hd + hd/2 + i` is `h·hd + 2i + 1` (i < hd/2).
pub fn interleaved_to_half(heads: usize, head_dim: usize) -> Vec<u32> {
    let half = head_dim / 2;
    (0..heads)
        .flat_map(|h| {
            let base = (h * head_dim) as u32;
            (0..head_dim).map(move |j| {
                let (i, odd) = if j < half { (j, 0) } else { (j - half, 1) };
                base + (2 * i + odd) as u32
            })
        })
        .collect()
}

/// The RoPE of a stack with dims `d`: NeoX pairs over a bf16-rounded table (see the module docs).
pub fn rope(d: &StackDims, device: &Device) -> RotaryEmbedding {
    RotaryEmbedding::with_bf16_table(d.head_dim, d.rope_base, device)
}

/// Loads `vb.layers.{0..n_layer}` as decoder layers (see the module docs).
pub fn load_stack(d: &StackDims, vb: &Weights) -> Result<Vec<DecoderLayer>, WeightError> {
    (0..d.n_layer)
        .map(|i| load_block(d, &vb.pp(format!("layers.{i}"))))
        .collect()
}

/// One block at `vb` (`…layers.N`).
fn load_block(d: &StackDims, vb: &Weights) -> Result<DecoderLayer, WeightError> {
    let a = vb.pp("attention");
    let (hd, nh, nkv) = (d.head_dim, d.n_head, d.n_kv_head);
    let qkv = (nh + 2 * nkv) * hd;
    let w = a.get(&[qkv, d.dim], "wqkv.weight")?;
    let b = if d.qkv_bias {
        Some(a.get(&[qkv], "wqkv.bias")?)
    } else {
        None
    };
    let device = vb.device().clone();
    let err = |name: &str, source: candle_core::Error| a.error(name, source);
    // Rows [start, start + len) of the fused weight (and bias), reordered by `order` if given.
    let part = |start: usize, len: usize, order: Option<&[u32]>| -> candle_core::Result<Linear> {
        let pick = |t: &Tensor| -> candle_core::Result<Tensor> {
            let rows = t.narrow(0, start, len)?;
            match order {
                Some(o) => rows.index_select(&Tensor::new(o, t.device())?, 0),
                None => rows.contiguous(),
            }
        };
        Ok(Linear::new(pick(&w)?, b.as_ref().map(pick).transpose()?))
    };
    let q_order = interleaved_to_half(nh, hd);
    let k_order = interleaved_to_half(nkv, hd);
    let q_proj = part(0, nh * hd, Some(&q_order)).map_err(|e| err("wqkv.weight", e))?;
    let k_proj = part(nh * hd, nkv * hd, Some(&k_order)).map_err(|e| err("wqkv.weight", e))?;
    let v_proj = part((nh + nkv) * hd, nkv * hd, None).map_err(|e| err("wqkv.weight", e))?;
    let qk_norm = if d.qk_norm {
        let head_order = Tensor::new(&q_order[..hd], &device).map_err(|e| err("q_norm", e))?;
        let norm = |name: &str| -> Result<RmsNorm, WeightError> {
            let w = a.get(&[hd], &format!("{name}.weight"))?;
            let w = w.index_select(&head_order, 0).map_err(|e| err(name, e))?;
            Ok(RmsNorm::from_weight(w, d.norm_eps))
        };
        Some((norm("q_norm")?, norm("k_norm")?))
    } else {
        None
    };
    let attention = Attention::from_parts(
        [
            q_proj,
            k_proj,
            v_proj,
            a.linear(nh * hd, d.dim, d.o_bias, "wo")?,
        ],
        qk_norm,
        (nh, nkv),
        hd,
        &device,
    );
    let f = vb.pp("feed_forward");
    let mlp = Mlp::from_parts(
        f.linear(d.dim, d.intermediate, false, "w1")?,
        f.linear(d.dim, d.intermediate, false, "w3")?,
        f.linear(d.intermediate, d.dim, false, "w2")?,
        &device,
    );
    Ok(DecoderLayer::from_parts(
        attention,
        mlp,
        RmsNorm::new(d.dim, d.norm_eps, &vb.pp("attention_norm"))?,
        RmsNorm::new(d.dim, d.norm_eps, &vb.pp("ffn_norm"))?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{D, DType};

    #[test]
    fn the_order_moves_even_dims_first_then_odd_per_head() {
        assert_eq!(interleaved_to_half(1, 4), [0, 2, 1, 3]);
        assert_eq!(
            interleaved_to_half(2, 6),
            [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]
        );
    }

    /// The identity the loader relies on: NeoX RoPE of the reordered vector = the reordered
    /// interleaved RoPE of the vector, at every position, with the same bf16 table.
    #[test]
    fn neox_on_reordered_dims_is_interleaved_rope() {
        let dev = Device::Cpu;
        let (hd, heads, t, start) = (8, 2, 5, 11);
        let data: Vec<f32> = (0..heads * t * hd)
            .map(|i| ((i * 29 % 97) as f32 - 48.0) / 17.0)
            .collect();
        let x = Tensor::from_vec(data, (1, heads, t, hd), &dev).unwrap();
        let interleaved = super::super::rope::RopeTable::new(64, hd, 1e4, &dev).unwrap();
        let want = interleaved.apply(&x, start).unwrap();
        let neox = RotaryEmbedding::with_bf16_table(hd, 1e4, &dev);
        let order = Tensor::new(&interleaved_to_half(1, hd)[..], &dev).unwrap();
        let (cos, sin) = neox.cos_sin(start, t).unwrap();
        let got = RotaryEmbedding::apply(&x.index_select(&order, D::Minus1).unwrap(), &cos, &sin)
            .unwrap();
        let want = want.index_select(&order, D::Minus1).unwrap();
        let diff = (got - want)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "{diff}");
    }
}
