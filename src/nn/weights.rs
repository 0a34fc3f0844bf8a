//! Checked weight loading from safetensors files.
//!
//! [`Weights`] plays the role of candle's `VarBuilder` (a prefix that grows with [`Weights::pp`]),
//! but every lookup checks that the tensor exists and has the expected shape *before* loading it,
//! and reports the file and the full tensor name when it does not. Tensors are converted to the
//! requested dtype and placed on the requested device. Tensors that are never asked for (e.g.
//! `speaker_encoder.*` in a CustomVoice checkpoint) are simply ignored.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};

/// Errors of [`Weights`] lookups.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The tensor is not in the file.
    #[error("{file}: missing tensor `{name}`")]
    Missing { file: PathBuf, name: String },
    /// The tensor exists with another shape.
    #[error("{file}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        file: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// Opening/mapping the file or converting the tensor failed.
    #[error("{file}: tensor `{name}`: {source}")]
    Load {
        file: PathBuf,
        name: String,
        #[source]
        source: Box<candle_core::Error>,
    },
}

struct Source {
    st: MmapedSafetensors,
    /// The file(s) shown in error messages.
    file: PathBuf,
}

/// A view of one or more safetensors files at a name prefix, with a target device and dtype.
#[derive(Clone)]
pub struct Weights {
    source: Arc<Source>,
    prefix: String,
    device: Device,
    dtype: DType,
}

impl Weights {
    /// Memory-maps `files` (one file, or the shards of an index). `display` is the path used in
    /// error messages (the single file, or the index file).
    pub fn from_files(
        files: &[PathBuf],
        display: &Path,
        device: &Device,
        dtype: DType,
    ) -> Result<Self, WeightError> {
        // SAFETY: the files are mapped read-only; as with every mmap, modifying them while the
        // model is loaded is undefined behaviour (same contract as candle's VarBuilder).
        let st = unsafe {
            if files.len() == 1 {
                MmapedSafetensors::new(&files[0])
            } else {
                MmapedSafetensors::multi(files)
            }
        }
        .map_err(|source| WeightError::Load {
            file: display.to_path_buf(),
            name: String::new(),
            source: Box::new(source),
        })?;
        Ok(Self {
            source: Arc::new(Source {
                st,
                file: display.to_path_buf(),
            }),
            prefix: String::new(),
            device: device.clone(),
            dtype,
        })
    }

    /// The same files at `prefix.name`.
    pub fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Self {
            source: self.source.clone(),
            prefix,
            device: self.device.clone(),
            dtype: self.dtype,
        }
    }

    /// Same tensors, another target dtype (e.g. to keep some tensors in f32).
    pub fn with_dtype(&self, dtype: DType) -> Self {
        let mut w = self.clone();
        w.dtype = dtype;
        w
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The file shown in error messages.
    pub fn file(&self) -> &Path {
        &self.source.file
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The shape of `prefix.name` if the tensor exists.
    pub fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        let full = self.full_name(name);
        self.source.st.get(&full).ok().map(|v| v.shape().to_vec())
    }

    /// Whether `prefix.name` exists.
    pub fn contains(&self, name: &str) -> bool {
        self.shape_of(name).is_some()
    }

    /// Loads `prefix.name`, checking that its shape is `shape`, converted to the target dtype.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Tensor, WeightError> {
        let full = self.full_name(name);
        let file = self.source.file.clone();
        let view = self
            .source
            .st
            .get(&full)
            .map_err(|_| WeightError::Missing {
                file: file.clone(),
                name: full.clone(),
            })?;
        if view.shape() != shape {
            return Err(WeightError::Shape {
                file,
                name: full,
                expected: shape.to_vec(),
                got: view.shape().to_vec(),
            });
        }
        let load = || -> candle_core::Result<Tensor> {
            self.source
                .st
                .load(&full, &Device::Cpu)?
                .to_dtype(self.dtype)?
                .to_device(&self.device)
        };
        load().map_err(|source| WeightError::Load {
            file,
            name: full.clone(),
            source: Box::new(source),
        })
    }

    /// A `candle_nn::Linear` from `prefix.name.weight` ([out, in]) and, if `bias`,
    /// `prefix.name.bias` ([out]).
    pub fn linear(
        &self,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        name: &str,
    ) -> Result<candle_nn::Linear, WeightError> {
        let w = self.pp(name);
        let weight = w.get(&[out_dim, in_dim], "weight")?;
        let bias = if bias {
            Some(w.get(&[out_dim], "bias")?)
        } else {
            None
        };
        Ok(candle_nn::Linear::new(weight, bias))
    }

    /// A `candle_nn::Embedding` from `prefix.name.weight` ([num, dim]).
    pub fn embedding(
        &self,
        num: usize,
        dim: usize,
        name: &str,
    ) -> Result<candle_nn::Embedding, WeightError> {
        let weight = self.pp(name).get(&[num, dim], "weight")?;
        Ok(candle_nn::Embedding::new(weight, dim))
    }
}
