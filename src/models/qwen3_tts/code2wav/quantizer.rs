//! `decoder.quantizer`: split residual vector quantizer, decode direction only.
//!
//! Reference: `SplitResidualVectorQuantizer`, `ResidualVectorQuantizer`, `EuclideanCodebook` in
//! `modeling_qwen3_tts_tokenizer_v2.py`. Each codebook is
//! `embedding_sum / clamp(cluster_usage, 1e-5)` `[codebook_size, codebook_dim / 2]`; each group
//! (`rvq_first`: 1 codebook, `rvq_rest`: the others) sums its lookups and applies its `output_proj`
//! (a bias-free 1×1 conv to `codebook_dim`); the two groups are added.
//!
//! Because `output_proj` is linear and bias-free, the projection is folded into the codebooks at
//! load: the decode is a single gather from a `[num_quantizers * codebook_size, codebook_dim]`
//! table followed by a sum over quantizers.

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::config::DecoderConfig;
use crate::nn::Weights;

/// The reference's clamp of `cluster_usage`.
const CLUSTER_USAGE_EPSILON: f64 = 1e-5;

/// One `EuclideanCodebook` (`vq.layers.{i}._codebook`): the decoded vectors `[codebook_size, dim]`.
struct EuclideanCodebook {
    embedding: Tensor,
}

impl EuclideanCodebook {
    fn new(codebook_size: usize, dim: usize, w: &Weights) -> Result<Self, ModelError> {
        let embedding_sum = w.get(&[codebook_size, dim], "embedding_sum")?;
        let cluster_usage = w.get(&[codebook_size], "cluster_usage")?;
        let usage = cluster_usage
            .clamp(CLUSTER_USAGE_EPSILON, f64::INFINITY)?
            .unsqueeze(1)?;
        Ok(Self {
            embedding: embedding_sum.broadcast_div(&usage)?,
        })
    }
}

/// One `ResidualVectorQuantizer` group (`rvq_first` / `rvq_rest`) with `output_proj` folded in.
struct ResidualVectorQuantizer {
    /// Per codebook, `[codebook_size, codebook_dim]` = codebook · output_projᵀ.
    projected: Vec<Tensor>,
}

impl ResidualVectorQuantizer {
    fn new(n_q: usize, cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let dim = cfg.codebook_dim / 2;
        // Conv1d(dim → codebook_dim, k=1, bias=False): [codebook_dim, dim, 1].
        let output_proj = w
            .get(&[cfg.codebook_dim, dim, 1], "output_proj.weight")?
            .squeeze(2)?;
        let projected = (0..n_q)
            .map(|i| {
                let cb = EuclideanCodebook::new(
                    cfg.codebook_size,
                    dim,
                    &w.pp(format!("vq.layers.{i}._codebook")),
                )?;
                Ok(cb.embedding.matmul(&output_proj.t()?)?)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        Ok(Self { projected })
    }
}

/// `decoder.quantizer` (`SplitResidualVectorQuantizer`, decode only).
pub(crate) struct SplitResidualVectorQuantizer {
    /// `[num_quantizers * codebook_size, codebook_dim]`; row `q * codebook_size + id`; f32 (f64
    /// in the verification mode).
    table: Tensor,
    /// The decoder's activation dtype: the output of [`Self::decode`].
    out_dtype: DType,
    num_quantizers: usize,
    codebook_size: usize,
    device: Device,
}

impl SplitResidualVectorQuantizer {
    /// Loads `rvq_first` (1 codebook) and `rvq_rest` (`num_quantizers - 1`) at `w` = `decoder.quantizer`.
    /// The codebooks at `w`, folded with their projections in f32 (f64 if `w` is f64), whatever the
    /// decoder's dtype (`w.dtype()`, the dtype [`Self::decode`] returns): a bf16 division by the
    /// cluster usage and a bf16 sum over 16 codebooks would each cost precision for nothing.
    pub(crate) fn new(cfg: &DecoderConfig, w: &Weights) -> Result<Self, ModelError> {
        let out_dtype = w.dtype();
        let w = &w.with_dtype(if out_dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        });
        let first = ResidualVectorQuantizer::new(1, cfg, &w.pp("rvq_first"))?;
        let rest = ResidualVectorQuantizer::new(cfg.num_quantizers - 1, cfg, &w.pp("rvq_rest"))?;
        let all: Vec<&Tensor> = first.projected.iter().chain(&rest.projected).collect();
        Ok(Self {
            table: Tensor::cat(&all, 0)?,
            out_dtype,
            num_quantizers: cfg.num_quantizers,
            codebook_size: cfg.codebook_size,
            device: w.device().clone(),
        })
    }

    /// The rows of the folded table that validated codes select, one row per stream, every row
    /// `n` frames of `num_quantizers` ids: `q × codebook_size + id`, stream-major, then frame,
    /// then codebook (`rows × n × num_quantizers` values).
    pub(crate) fn table_rows(&self, rows: &[&[Vec<u32>]]) -> Vec<u32> {
        let cb = self.codebook_size as u32;
        rows.iter()
            .flat_map(|codes| codes.iter())
            .flat_map(|frame| {
                frame
                    .iter()
                    .enumerate()
                    .map(move |(q, &id)| q as u32 * cb + id)
            })
            .collect()
    }

    /// Decodes validated codes, one row per stream, every row `n` frames of `num_quantizers` ids
    /// (each `< codebook_size`) → `[rows, codebook_dim, n]`.
    pub(crate) fn decode(&self, rows: &[&[Vec<u32>]]) -> Result<Tensor, ModelError> {
        let n = rows.first().map_or(0, |r| r.len());
        if let Some(r) = rows.iter().find(|r| r.len() != n) {
            return Err(candle_core::Error::Msg(format!(
                "code2wav: a pass of {n}-frame rows got a row of {} frames",
                r.len()
            ))
            .into());
        }
        let ids = self.table_rows(rows);
        let ids = Tensor::from_vec(ids, rows.len() * n * self.num_quantizers, &self.device)?;
        Ok(self.decode_rows(&ids, rows.len(), n)?)
    }

    /// [`Self::decode`] of table rows already on the device: `ids` `[rows × n × num_quantizers]`
    /// u32 ([`Self::table_rows`]) → `[rows, codebook_dim, n]`.
    pub(crate) fn decode_rows(
        &self,
        ids: &Tensor,
        rows: usize,
        n: usize,
    ) -> candle_core::Result<Tensor> {
        let dim = self.table.dim(1)?;
        let x = self
            .table
            .index_select(ids, 0)?
            .reshape((rows, n, self.num_quantizers, dim))?
            .sum(2)? // [rows, n, dim]
            .to_dtype(self.out_dtype)?;
        x.transpose(1, 2)?.contiguous()
    }
}
