//! Embedding tables: loaded on the device, or (on the CPU) rows read from the mapped checkpoint
//! file when they are looked up, so that a large table that an utterance touches a few rows of
//! (the 151 936-row text embedding) is never resident as a whole.

use std::sync::Arc;

use candle_core::{DType, Device, Result, Tensor};

use super::weights::Source;

/// An embedding table `[num, dim]` ([`super::Weights::mapped_embedding`]).
#[derive(Debug, Clone)]
pub enum Embedding {
    /// The whole table on the device in the model dtype.
    Table(candle_nn::Embedding),
    /// Rows copied from the file at each lookup (CPU).
    Mapped(MappedRows),
}

impl Embedding {
    /// `ids` (u32 `[n]`) → `[n, dim]` in the model dtype. Errors on an id outside the table.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        match self {
            Embedding::Table(e) => candle_core::Module::forward(e, ids),
            Embedding::Mapped(m) => m.forward(ids),
        }
    }
}

/// The rows of a `[rows, dim]` table in a memory-mapped safetensors file, in its stored dtype,
/// converted to `dtype` when looked up (a bf16 table looked up as f32 gives exactly the values
/// loading it as f32 gives).
#[derive(Clone)]
pub struct MappedRows {
    source: Arc<Source>,
    name: String,
    rows: usize,
    dim: usize,
    stored: DType,
    dtype: DType,
}

impl std::fmt::Debug for MappedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MappedRows({} [{}, {}] {:?} → {:?})",
            self.name, self.rows, self.dim, self.stored, self.dtype
        )
    }
}

impl MappedRows {
    /// Tensor `name` of `source`, `[rows, dim]` stored in `stored`, looked up as `dtype`.
    pub(super) fn new(
        source: Arc<Source>,
        name: String,
        [rows, dim]: [usize; 2],
        stored: DType,
        dtype: DType,
    ) -> Self {
        MappedRows {
            source,
            name,
            rows,
            dim,
            stored,
            dtype,
        }
    }

    /// `ids` (u32 `[n]`) → `[n, dim]` in the target dtype, on the CPU. Errors on an id outside
    /// the table.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let view = self.source.st.get(&self.name)?;
        let data = view.data();
        let row_bytes = self.dim * self.stored.size_in_bytes();
        let ids = ids.flatten_all()?.to_vec1::<u32>()?;
        let mut bytes = Vec::with_capacity(ids.len() * row_bytes);
        for &id in &ids {
            let r = id as usize;
            let row = (r < self.rows)
                .then(|| data.get(r * row_bytes..(r + 1) * row_bytes))
                .flatten()
                .ok_or_else(|| {
                    candle_core::Error::Msg(format!(
                        "{}: id {r} is outside the table of {} rows",
                        self.name, self.rows
                    ))
                })?;
            bytes.extend_from_slice(row);
        }
        Tensor::from_raw_buffer(&bytes, self.stored, &[ids.len(), self.dim], &Device::Cpu)?
            .to_dtype(self.dtype)
    }
}
