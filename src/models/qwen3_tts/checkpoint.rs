//! A checkpoint directory: its configs parsed and its weight files found.

use std::path::{Path, PathBuf};

use super::config::{self, GenerationConfig, Qwen3TtsConfig};
use crate::models::tts::ModelError;

/// A checkpoint directory, JSON parsed and validated (no weights loaded yet).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Qwen3TtsConfig,
    pub generation: GenerationConfig,
}

impl Checkpoint {
    /// Reads `config.json` and `generation_config.json` (both required, as in the reference).
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let config = Qwen3TtsConfig::from_file(&dir.join("config.json"))?;
        let generation = GenerationConfig::from_file(&dir.join("generation_config.json"))?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            generation,
        })
    }

    /// The weight files: `model.safetensors`, or the shards listed by
    /// `model.safetensors.index.json`. Returns `(files, path for messages)`.
    pub(super) fn weight_files(&self) -> Result<(Vec<PathBuf>, PathBuf), ModelError> {
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            return Ok((vec![single.clone()], single));
        }
        let index = self.dir.join("model.safetensors.index.json");
        if index.is_file() {
            let v = config::read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Config {
                    file: index.clone(),
                    field: "weight_map".into(),
                    msg: "missing or not an object".into(),
                })?;
            let mut files: Vec<PathBuf> = Vec::new();
            for (name, f) in map {
                let f = f.as_str().ok_or_else(|| ModelError::Config {
                    file: index.clone(),
                    field: format!("weight_map.{name}"),
                    msg: "expected a file name".into(),
                })?;
                let p = self.dir.join(f);
                if !files.contains(&p) {
                    files.push(p);
                }
            }
            files.sort();
            return Ok((files, index));
        }
        Err(ModelError::Io {
            path: single,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no model weights"),
        })
    }
}
