//! Checked weight loading from safetensors files.
//!
//! [`Weights`] plays the role of candle's `VarBuilder` (a prefix that grows with [`Weights::pp`]),
//! but every lookup checks that the tensor exists and has the expected shape *before* loading it,
//! and reports the file and the full tensor name when it does not. Tensors are converted to the
//! requested dtype and placed on the requested device. Tensors that are never asked for (e.g.
//! `speaker_encoder.*` in a CustomVoice checkpoint) are simply ignored.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Tensor};

use super::embedding::{Embedding, MappedRows};
use super::linear::{Linear, QuantizationSpec};

/// "tensor `NAME`: " before a [`WeightError::Load`]'s cause, nothing for the file as a whole.
fn tensor_prefix(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!("tensor `{name}`: ")
    }
}

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
    /// Opening/mapping the file (`name` empty) or converting the tensor failed.
    #[error("{file}: {}{source}", tensor_prefix(.name))]
    Load {
        file: PathBuf,
        name: String,
        #[source]
        source: Box<candle_core::Error>,
    },
}

/// The mapped file(s) behind a [`Weights`] (shared with [`MappedRows`], which reads from them
/// after loading).
pub(super) struct Source {
    pub(super) st: MmapedSafetensors,
    /// The file(s) shown in error messages.
    file: PathBuf,
}

/// Tells the kernel that the mapped file pages under `data` are not needed any more (they are
/// read again from the file if touched later). Best effort: nothing happens off Unix.
fn release_pages(data: &[u8]) {
    #[cfg(unix)]
    {
        // SAFETY: sysconf has no preconditions.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => return,
        };
        let start = data.as_ptr() as usize;
        let first = start.div_ceil(page) * page;
        let end = (start + data.len()) / page * page;
        if end > first {
            // SAFETY: [first, end) lies inside the read-only file mapping that `data` borrows
            // from, whose pages are never written; MADV_DONTNEED on it only unmaps resident
            // pages, which the next access maps again from the unchanged file.
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED);
            }
        }
    }
    #[cfg(not(unix))]
    let _ = data;
}

/// A view of one or more safetensors files at a name prefix, with a target device and dtype.
#[derive(Clone)]
pub struct Weights {
    source: Arc<Source>,
    prefix: String,
    device: Device,
    dtype: DType,
    /// The form [`Self::linear`] stores weights in (CPU only; dense on other devices).
    quantization: QuantizationSpec,
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
            quantization: QuantizationSpec::DENSE,
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
            quantization: self.quantization,
        }
    }

    /// Same tensors, another target dtype (e.g. to keep some tensors in f32).
    pub fn with_dtype(&self, dtype: DType) -> Self {
        let mut w = self.clone();
        w.dtype = dtype;
        w
    }

    /// Same tensors, [`Self::linear`] storing weights as `spec` asks (on the CPU; other
    /// devices keep dense weights in the target dtype).
    pub fn with_quantization(&self, spec: QuantizationSpec) -> Self {
        let mut w = self.clone();
        w.quantization = if self.device.is_cpu() {
            spec
        } else {
            QuantizationSpec::DENSE
        };
        w
    }

    /// Same tensors, [`Self::linear`] keeping dense weights (output heads, whose logits stay
    /// the checkpoint's f32 products).
    pub fn dense(&self) -> Self {
        self.with_quantization(QuantizationSpec::DENSE)
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

    /// The file's view of `prefix.name` and its full name, checked to have shape `shape`.
    fn view(
        &self,
        shape: &[usize],
        name: &str,
    ) -> Result<(safetensors::tensor::TensorView<'_>, String), WeightError> {
        let full = self.full_name(name);
        let file = || self.source.file.clone();
        let view = self
            .source
            .st
            .get(&full)
            .map_err(|_| WeightError::Missing {
                file: file(),
                name: full.clone(),
            })?;
        if view.shape() != shape {
            return Err(WeightError::Shape {
                file: file(),
                name: full,
                expected: shape.to_vec(),
                got: view.shape().to_vec(),
            });
        }
        Ok((view, full))
    }

    /// The error of work on `prefix.name` after it was loaded (a reshaping that failed).
    pub fn error(&self, name: &str, source: candle_core::Error) -> WeightError {
        self.load_error(self.full_name(name), source)
    }

    /// A loading error of tensor `name`.
    fn load_error(&self, name: String, source: candle_core::Error) -> WeightError {
        WeightError::Load {
            file: self.source.file.clone(),
            name,
            source: Box::new(source),
        }
    }

    /// Loads `prefix.name`, checking that its shape is `shape`, converted to the target dtype.
    pub fn get(&self, shape: &[usize], name: &str) -> Result<Tensor, WeightError> {
        let (view, full) = self.view(shape, name)?;
        let load = || -> candle_core::Result<Tensor> {
            let copy = view.load(&Device::Cpu)?;
            // The tensor owns a copy now: hand the file's pages back, so that loading does not
            // hold the whole mapped file resident beside the model.
            release_pages(view.data());
            copy.to_dtype(self.dtype)?.to_device(&self.device)
        };
        load().map_err(|source| self.load_error(full, source))
    }

    /// An embedding table `prefix.name.weight` ([num, dim]) whose rows are read from the mapped
    /// file at each lookup when the target is the CPU ([`Embedding::Mapped`]: only the rows
    /// used are ever resident, e.g. a few thousand of the text embedding's 151 936), else
    /// loaded onto the device as [`Self::embedding`] does. The values are the same either way.
    pub fn mapped_embedding(
        &self,
        num: usize,
        dim: usize,
        name: &str,
    ) -> Result<Embedding, WeightError> {
        if !self.device.is_cpu() {
            return Ok(Embedding::Table(self.embedding(num, dim, name)?));
        }
        let table = self.pp(name);
        let (view, full) = table.view(&[num, dim], "weight")?;
        let stored = DType::try_from(view.dtype()).map_err(|e| self.load_error(full.clone(), e))?;
        Ok(Embedding::Mapped(MappedRows::new(
            self.source.clone(),
            full,
            [num, dim],
            stored,
            self.dtype,
        )))
    }

    /// A [`Linear`] from `prefix.name.weight` ([out, in]) and, if `bias`, `prefix.name.bias`
    /// ([out]), in the form [`Self::with_quantization`] asked for
    /// ([`QuantizationSpec::for_layer`]; dense by default).
    pub fn linear(
        &self,
        in_dim: usize,
        out_dim: usize,
        bias: bool,
        name: &str,
    ) -> Result<Linear, WeightError> {
        let w = self.pp(name);
        let weight = w.get(&[out_dim, in_dim], "weight")?;
        let bias = if bias {
            Some(w.get(&[out_dim], "bias")?)
        } else {
            None
        };
        Linear::quantize(&weight, bias, self.quantization.for_layer(in_dim, out_dim))
            .map_err(|source| self.load_error(w.full_name("weight"), source))
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
