//! Locating and opening a checkpoint directory: `config.json`, `tokenizer.json`, and the LLM
//! weights as `model.safetensors.index.json` + its shards or a single `model.safetensors`.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};

use super::error::{FishError, Result};
use crate::nn::Weights;

/// The safetensors files of the LLM (slow + fast AR) and the path shown in errors.
pub fn weight_files(dir: &Path) -> Result<(Vec<PathBuf>, PathBuf)> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        let text = std::fs::read_to_string(&index).map_err(|source| FishError::Io {
            path: index.clone(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| FishError::Config {
                path: index.clone(),
                msg: e.to_string(),
            })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| FishError::Config {
                path: index.clone(),
                msg: "no `weight_map` object".into(),
            })?;
        let mut files: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        files.sort();
        files.dedup();
        if files.is_empty() {
            return Err(FishError::Config {
                path: index,
                msg: "empty `weight_map`".into(),
            });
        }
        let files: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        if let Some(missing) = files.iter().find(|f| !f.exists()) {
            return Err(FishError::Checkpoint {
                file: index,
                msg: format!("shard {} is missing", missing.display()),
            });
        }
        return Ok((files, index));
    }
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok((vec![single.clone()], single));
    }
    Err(FishError::Checkpoint {
        file: dir.to_path_buf(),
        msg: "no model.safetensors.index.json or model.safetensors".into(),
    })
}

/// Opens the LLM weights of `dir` for `device` in `dtype`.
pub fn open_weights(dir: &Path, device: &Device, dtype: DType) -> Result<Weights> {
    let (files, display) = weight_files(dir)?;
    Ok(Weights::from_files(&files, &display, device, dtype)?)
}
