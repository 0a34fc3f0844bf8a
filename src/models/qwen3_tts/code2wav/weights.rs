//! Reading `decoder.*` tensors from `speech_tokenizer/model.safetensors` with errors that name the
//! file and tensor.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor, safetensors::MmapedSafetensors};

use super::ModelError;

/// A memory-mapped safetensors file.
pub(crate) struct WeightFile {
    path: PathBuf,
    st: MmapedSafetensors,
    device: Device,
    dtype: DType,
}

impl WeightFile {
    /// Maps `path`; tensors will be loaded onto `device` as `dtype`.
    /// Errors: [`ModelError::Io`] if absent, [`ModelError::Json`] if not a safetensors file.
    pub(crate) fn open(path: &Path, device: &Device, dtype: DType) -> Result<Self, ModelError> {
        std::fs::metadata(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: the file is mapped read-only and only for the duration of loading; every tensor is
        // copied out (`load`) before the map is dropped. Modifying the checkpoint file concurrently
        // is outside what this loader supports (the same contract as candle's VarBuilder).
        let st = unsafe { MmapedSafetensors::new(path) }.map_err(|e| ModelError::Json {
            path: path.to_path_buf(),
            msg: format!("not a safetensors file: {e}"),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            st,
            device: device.clone(),
            dtype,
        })
    }

    /// A view at `prefix` (e.g. `"decoder"`).
    pub(crate) fn root(&self, prefix: &str) -> Weights<'_> {
        Weights {
            file: self,
            prefix: prefix.to_string(),
        }
    }
}

/// A prefix inside a [`WeightFile`], like candle's `VarBuilder::pp`.
#[derive(Clone)]
pub(crate) struct Weights<'a> {
    file: &'a WeightFile,
    prefix: String,
}

impl<'a> Weights<'a> {
    /// The view at `prefix.name`.
    pub(crate) fn pp(&self, name: impl std::fmt::Display) -> Weights<'a> {
        Weights {
            file: self.file,
            prefix: if self.prefix.is_empty() {
                name.to_string()
            } else {
                format!("{}.{name}", self.prefix)
            },
        }
    }

    /// The device tensors are loaded onto.
    pub(crate) fn device(&self) -> &Device {
        &self.file.device
    }

    /// The dtype tensors are loaded as.
    pub(crate) fn dtype(&self) -> DType {
        self.file.dtype
    }

    /// Loads `prefix.name` (converted to the file's load dtype), checking it has exactly `shape`.
    ///
    /// Errors: [`ModelError::MissingTensor`], [`ModelError::Shape`] (both name file and tensor).
    pub(crate) fn get(&self, shape: &[usize], name: &str) -> Result<Tensor, ModelError> {
        let full = self.pp(name).prefix;
        let view = self
            .file
            .st
            .get(&full)
            .map_err(|_| ModelError::MissingTensor {
                file: self.file.path.clone(),
                name: full.clone(),
            })?;
        let got = view.shape().to_vec();
        if got != shape {
            return Err(ModelError::Shape {
                file: self.file.path.clone(),
                name: full,
                expected: shape.to_vec(),
                got,
            });
        }
        let t = self.file.st.load(&full, &self.file.device)?;
        Ok(t.to_dtype(self.file.dtype)?)
    }
}
