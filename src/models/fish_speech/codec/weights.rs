//! `codec.pth` (a torch state dict in PyTorch's zip format) read without Python, through candle's
//! pickle reader, with weight norm folded at load: `weight = v · (g / ‖v‖)`, the norm over every
//! dim but the first, for both spellings in the file (`parametrizations.weight.original0/1` and
//! the older `weight_g/weight_v`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use crate::models::fish_speech::error::{FishError, Result};

/// The codec's tensors by name, f32 on a device.
pub struct CodecWeights {
    tensors: HashMap<String, Tensor>,
    file: PathBuf,
    device: Device,
}

impl CodecWeights {
    /// Reads every tensor of `path` (a bare state dict, or one under `state_dict`; a
    /// `generator.` prefix is dropped as the reference does).
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let err = |e: candle_core::Error| FishError::Checkpoint {
            file: path.to_path_buf(),
            msg: e.to_string(),
        };
        let mut all = candle_core::pickle::read_all(path).map_err(err)?;
        if all.is_empty() {
            all = candle_core::pickle::read_all_with_key(path, Some("state_dict")).map_err(err)?;
        }
        let has_generator = all.iter().any(|(k, _)| k.contains("generator."));
        let mut tensors = HashMap::new();
        for (k, t) in all {
            let k = if has_generator {
                match k.split_once("generator.") {
                    Some((_, rest)) => rest.to_string(),
                    None => continue,
                }
            } else {
                k
            };
            let t = t
                .to_dtype(DType::F32)
                .and_then(|t| t.to_device(device))
                .map_err(err)?;
            tensors.insert(k, t);
        }
        Ok(Self {
            tensors,
            file: path.to_path_buf(),
            device: device.clone(),
        })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    fn missing(&self, name: &str) -> FishError {
        FishError::Checkpoint {
            file: self.file.clone(),
            msg: format!("missing tensor `{name}`"),
        }
    }

    /// `name` with the expected shape.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| self.missing(name))?;
        if t.dims() != shape {
            return Err(FishError::Checkpoint {
                file: self.file.clone(),
                msg: format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    t.dims()
                ),
            });
        }
        Ok(t.clone())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The weight of the module at `prefix` (`prefix.weight`, or folded from its weight-norm
    /// parametrisation), of shape `shape`.
    pub fn weight(&self, prefix: &str, shape: &[usize]) -> Result<Tensor> {
        let plain = format!("{prefix}.weight");
        if self.contains(&plain) {
            return self.get(&plain, shape);
        }
        let (g, v) = if self.contains(&format!("{prefix}.weight_g")) {
            (format!("{prefix}.weight_g"), format!("{prefix}.weight_v"))
        } else {
            (
                format!("{prefix}.parametrizations.weight.original0"),
                format!("{prefix}.parametrizations.weight.original1"),
            )
        };
        let v = self.get(&v, shape)?;
        let mut gshape = vec![1; shape.len()];
        gshape[0] = shape[0];
        let g = self.get(&g, &gshape)?;
        Ok(fold_weight_norm(&g, &v)?)
    }

    /// `prefix.bias` `[n]`.
    pub fn bias(&self, prefix: &str, n: usize) -> Result<Tensor> {
        self.get(&format!("{prefix}.bias"), &[n])
    }
}

/// `v · (g / ‖v‖)` with the norm over all dims but the first (`g` `[d0, 1, …]`).
pub fn fold_weight_norm(g: &Tensor, v: &Tensor) -> candle_core::Result<Tensor> {
    let d0 = v.dim(0)?;
    let flat = v.reshape((d0, ()))?;
    let norm = flat.sqr()?.sum_keepdim(1)?.sqrt()?; // [d0, 1]
    let scale = g.reshape((d0, 1))?.broadcast_div(&norm)?;
    flat.broadcast_mul(&scale)?.reshape(v.shape())
}
