//! One decode position for a batch of streams, each at its own position over its own KV caches,
//! on the fused CUDA kernels (feature `cuda`): the talker step of a batched frame graph.
//!
//! The rows share every matmul (`[rows, hidden]` against each weight: cuBLAS GEMMs, one weight
//! read for the whole batch) and the norms; attention is the one part that differs per row, and
//! it runs in one launch over all rows ([`cuda_kernels::rows_attention`]), each row reading its
//! own cache buffers and position from small device tables ([`RowTables`]). Because the tables,
//! not the kernels, hold the addresses and positions, one CUDA graph per batch size replays for
//! any mix of streams, and a stream joins or leaves the batch by a table entry: no cache is
//! copied or moved. Per row the attention is the one-stream kernel's (`rope_attention`); the
//! matmuls are cuBLAS's batched ones instead of the one-row GEMV kernels, so a row's hidden
//! states equal its solo step's up to the GEMM's summation order.

use candle_core::{DType, Device, Module, Result, Tensor};

use super::cuda_kernels::{self, rows_attention};
use super::fused_decode::run_layers_fused;
use super::rope::RotaryEmbedding;
use super::transformer::{DecoderLayer, LayerCaches};

/// Device tables of a batch of streams' KV caches and positions for one decode position:
/// `positions` u32 `[rows]`, `caches` i64 `[layers, 2, rows]` (row r's key, then value, buffer
/// address of each layer), `caps` u32 `[rows]` (the slots of row r's buffers). Static buffers:
/// a CUDA graph captured over them replays with whatever [`RowTables::fill`] wrote last.
#[derive(Debug)]
pub struct RowTables {
    pub positions: Tensor,
    pub caches: Tensor,
    pub caps: Tensor,
    rows: usize,
    layers: usize,
}

impl RowTables {
    /// Zeroed tables for `rows` rows of a `layers`-layer stack on `device`.
    pub fn new(rows: usize, layers: usize, device: &Device) -> Result<Self> {
        Ok(Self {
            positions: Tensor::zeros(rows, DType::U32, device)?,
            caches: Tensor::zeros((layers, 2, rows), DType::I64, device)?,
            caps: Tensor::zeros(rows, DType::U32, device)?,
            rows,
            layers,
        })
    }

    /// Rows the tables hold.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Writes the tables for `streams` (each at its next position `seq_len()`, with buffers that
    /// have room for it: [`LayerCaches::reserve_next`]), the rows past them pointing at `pad`
    /// (a cache with room for position 0, whose contents nothing reads). Returns the positions
    /// written. Errors when there are more streams than rows, a stack of another depth, or a
    /// cache without room (its buffers' slots differ between layers, or none is left).
    pub fn fill(&self, streams: &[&LayerCaches], pad: &LayerCaches) -> Result<Vec<u32>> {
        if streams.len() > self.rows {
            candle_core::bail!(
                "{} streams for a batch of {} rows",
                streams.len(),
                self.rows
            );
        }
        let mut positions = vec![0u32; self.rows];
        let mut caps = vec![0u32; self.rows];
        let mut addrs = vec![0i64; self.layers * 2 * self.rows];
        for r in 0..self.rows {
            let (caches, pos) = match streams.get(r) {
                Some(c) => (*c, c.seq_len()),
                None => (pad, 0),
            };
            if caches.caches.len() != self.layers {
                candle_core::bail!(
                    "row {r}: caches of {} layers for a stack of {}",
                    caches.caches.len(),
                    self.layers
                );
            }
            let cap = caches.caches[0].capacity();
            for (l, c) in caches.caches.iter().enumerate() {
                let (Some(k), Some(v)) = (&c.k, &c.v) else {
                    candle_core::bail!("row {r}: layer {l} has no KV buffers");
                };
                if c.capacity() != cap || pos >= cap || k.dim(0)? != 1 {
                    candle_core::bail!(
                        "row {r}: layer {l} holds {} slots (layer 0: {cap}) for position {pos}",
                        c.capacity()
                    );
                }
                addrs[(l * 2) * self.rows + r] = cuda_kernels::device_address(k)? as i64;
                addrs[(l * 2 + 1) * self.rows + r] = cuda_kernels::device_address(v)? as i64;
            }
            positions[r] = u32::try_from(pos)
                .map_err(|_| candle_core::Error::Msg(format!("row {r}: position {pos}")))?;
            caps[r] = u32::try_from(cap)
                .map_err(|_| candle_core::Error::Msg(format!("row {r}: {cap} slots")))?;
        }
        let dev = self.positions.device();
        self.positions
            .slice_set(&Tensor::new(positions.as_slice(), dev)?, 0, 0)?;
        self.caps
            .slice_set(&Tensor::new(caps.as_slice(), dev)?, 0, 0)?;
        let table = Tensor::from_vec(addrs, (self.layers, 2, self.rows), dev)?;
        self.caches.slice_set(&table, 0, 0)?;
        Ok(positions)
    }
}

impl LayerCaches {
    /// Makes room in every layer's buffers for one more position of `layers`' keys/values (one
    /// stream, `dtype` on `device`), as a decode step would allocate it: the buffers a batched
    /// step ([`run_rows_fused`]) writes through [`RowTables`].
    pub fn reserve_next(
        &mut self,
        layers: &[DecoderLayer],
        dtype: DType,
        device: &Device,
    ) -> Result<()> {
        if layers.len() != self.caches.len() {
            candle_core::bail!(
                "caches of {} layers for a stack of {}",
                self.caches.len(),
                layers.len()
            );
        }
        for (layer, cache) in layers.iter().zip(self.caches.iter_mut()) {
            layer.self_attn.reserve(cache, 1, 1, dtype, device)?;
        }
        Ok(())
    }
}

/// Whether [`run_rows_fused`] takes `layers` for `x` `[rows, 1, hidden]` attending to at most
/// `max_keys` keys: the fused kernels' conditions (CUDA, bf16/f32, no sliding window, head width)
/// and a head width [`rows_attention`] takes.
pub fn rows_fused_ok(layers: &[DecoderLayer], x: &Tensor, max_keys: usize) -> bool {
    !layers.is_empty()
        && x.dim(1).is_ok_and(|t| t == 1)
        && layers.iter().all(|l| {
            l.self_attn.fused_ok(x, 1, max_keys)
                && rows_attention::supports_head_dim(l.self_attn.head_dim)
        })
}

/// One decode position of `layers` for every row of `x` `[rows, 1, hidden]`: row r at position
/// `tables.positions[r]`, its keys/values written into and read from the buffers `tables` points
/// at (slot `positions[r]`; the caches' `seq_len()` is not changed: advance them after the work
/// has run). `cos`/`sin`: f32 RoPE tables from position 0 covering every position; `max_keys`
/// (≤ `decode_attention::MAX_KEYS`) bounds the keys a row reads: every position must be below
/// it. Launches per layer: 9 (norm, q/k/v GEMM, [`rows_attention`], `o_proj`, add + norm, gate/up,
/// SiLU·up, down, add + next norm), whatever the rows and positions, so the call can be captured
/// in a CUDA graph. Returns the last layer's output `[rows, 1, hidden]` (before any final norm).
/// Check [`rows_fused_ok`] first.
pub fn run_rows_fused(
    layers: &[DecoderLayer],
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    tables: &RowTables,
    max_keys: usize,
) -> Result<Tensor> {
    run_layers_fused(layers, x.contiguous()?, |l, layer, normed| {
        let attn = &layer.self_attn;
        let (q, k, v) = attn.project_qkv(normed)?;
        let dtype = q.dtype();
        let weights = attn.head_norm_weights(dtype)?;
        let caches = tables.caches.get(l)?;
        let a = rows_attention::rows_attention(
            &q,
            &k,
            &v,
            weights
                .as_ref()
                .map(|(q, k, eps)| cuda_kernels::qk_norm_rope::HeadNorms { q, k, eps: *eps }),
            cos,
            sin,
            &tables.positions,
            rows_attention::RowCaches {
                caches: &caches,
                caps: &tables.caps,
            },
            attn.heads(),
            max_keys,
            attn.scaling,
        )?;
        attn.o_proj.forward(&a)
    })
}

/// [`LayerCaches::decode_rows`] on the fused kernels, without a CUDA graph: `None` when
/// [`rows_fused_ok`] does not take the stack, `x` or the rows' longest cache (then the caller
/// runs the eager ops). Makes room in each row's caches, writes a fresh [`RowTables`], runs
/// [`run_rows_fused`] and advances every row by one position.
pub(super) fn try_decode_rows_fused(
    layers: &[DecoderLayer],
    rope: &RotaryEmbedding,
    x: &Tensor,
    caches: &mut [&mut LayerCaches],
) -> Result<Option<Tensor>> {
    let keys = caches.iter().map(|c| c.seq_len() + 1).max().unwrap_or(0);
    if caches.is_empty() || x.dim(0)? != caches.len() || !rows_fused_ok(layers, x, keys) {
        return Ok(None);
    }
    for c in caches.iter_mut() {
        c.reserve_next(layers, x.dtype(), x.device())?;
    }
    let tables = RowTables::new(caches.len(), layers.len(), x.device())?;
    let streams: Vec<&LayerCaches> = caches.iter().map(|c| &**c).collect();
    // Every row is a stream: the padding caches are never read.
    tables.fill(&streams, streams[0])?;
    let (cos, sin) = rope.cos_sin(0, keys)?;
    let h = run_rows_fused(
        layers,
        x,
        &cos.contiguous()?,
        &sin.contiguous()?,
        &tables,
        keys,
    )?;
    for c in caches.iter_mut() {
        c.advance(1)?;
    }
    Ok(Some(h))
}
