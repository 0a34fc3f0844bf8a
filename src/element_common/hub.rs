//! Resolving the `model` property to a checkpoint directory.
//!
//! `model` is either a local checkpoint directory (it must exist) or a Hugging Face repo id
//! (`owner/name`). A repo id is looked up in the Hugging Face cache (the layout `huggingface_hub`
//! and `hf-hub` share: `<cache>/models--owner--name/{refs/main, snapshots/<commit>/...}`) and, when it
//! is not there and the machine is online, downloaded into that cache with `hf-hub`.
//!
//! Environment (read by [`HubOptions::from_env`]), as in `huggingface_hub`:
//! - `HF_ENDPOINT`: the hub URL (default `https://huggingface.co`);
//! - `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`: the cache folder;
//! - `HF_HUB_OFFLINE=1`: never touch the network;
//! - `HF_TOKEN`: bearer token (else the token file in the cache's parent folder, as `hf-hub` reads it).

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use super::input_error::quoted;
use crate::models::registry;

/// Where and how to look a repo id up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubOptions {
    /// Hub base URL without a trailing slash, e.g. `https://huggingface.co` or `http://127.0.0.1:8123`.
    pub endpoint: String,
    /// The hub cache folder (the one holding `models--owner--name` folders).
    pub cache_dir: PathBuf,
    /// When true, only the cache is consulted.
    pub offline: bool,
    /// Bearer token for private or gated repos.
    pub token: Option<String>,
}

/// Default hub URL.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

impl HubOptions {
    /// Reads `HF_ENDPOINT`, `HF_HUB_CACHE`, `HF_HOME`, `HF_HUB_OFFLINE` and `HF_TOKEN` (see the module docs).
    pub fn from_env() -> HubOptions {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT")
            .map(|e| e.trim_end_matches('/').to_string())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let cache_dir = if let Some(c) = var("HF_HUB_CACHE") {
            PathBuf::from(c)
        } else if let Some(h) = var("HF_HOME") {
            PathBuf::from(h).join("hub")
        } else if let Some(home) = var("HOME") {
            PathBuf::from(home)
                .join(".cache")
                .join("huggingface")
                .join("hub")
        } else {
            PathBuf::from(".cache").join("huggingface").join("hub")
        };
        let offline = var("HF_HUB_OFFLINE")
            .map(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
            .unwrap_or(false);
        HubOptions {
            endpoint,
            cache_dir,
            offline,
            token: var("HF_TOKEN"),
        }
    }
}

/// Where the checkpoint was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// `model` named an existing directory.
    LocalDir,
    /// A complete snapshot was already in the hub cache; nothing was downloaded.
    Cache,
    /// Files were downloaded from the endpoint into the cache.
    Downloaded {
        /// Number of files fetched (files already in the cache are not counted).
        files: usize,
    },
}

/// A resolved `model` property.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedModel {
    /// The checkpoint directory (`config.json`, `model.safetensors`, `speech_tokenizer/`, ...).
    pub dir: PathBuf,
    /// How it was found.
    pub source: ModelSource,
}

/// Why `model` could not be resolved. Every message names the value of the `model` property
/// (escaped and cut as [`quoted`] does).
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Empty property.
    #[error(
        "model: no model given (set model to a checkpoint directory or a Hugging Face repo id)"
    )]
    Empty,
    /// Neither an existing directory nor something shaped like `owner/name`.
    #[error(
        "model: '{}' is neither an existing checkpoint directory nor a Hugging Face repo id (owner/name)",
        quoted(value)
    )]
    NotFound {
        /// The property value.
        value: String,
    },
    /// A directory that exists but is not a checkpoint.
    #[error(
        "model: '{}' is a directory without config.json, not a model checkpoint",
        quoted(value)
    )]
    NotACheckpoint {
        /// The property value.
        value: String,
    },
    /// Not in the cache, and downloading was impossible or failed.
    #[error(
        "model: Hugging Face repo '{}' is not in the cache folder {} and {why}; \
         download it while online, point HF_HUB_CACHE/HF_HOME at a cache that has it, \
         or set model to a local checkpoint directory",
        quoted(repo),
        cache.display()
    )]
    NotCached {
        /// The repo id.
        repo: String,
        /// The cache folder that was searched.
        cache: PathBuf,
        /// Why it was not downloaded (offline, or the network error with the endpoint).
        why: String,
    },
}

/// Files of a model repo that are not needed to run it.
fn is_needed(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    if base.starts_with('.') {
        return false;
    }
    let lower = base.to_ascii_lowercase();
    ![".md", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// True when `value` has the shape of a hub repo id: `owner/name`, each part made of
/// `[A-Za-z0-9._-]`, not starting with `.` or `-`.
pub fn looks_like_repo_id(value: &str) -> bool {
    let mut parts = value.split('/');
    let (Some(owner), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && !p.starts_with('-')
            && p.len() <= 96
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    ok(owner) && ok(name)
}

/// The cache folder of a model repo: `<cache>/models--owner--name`.
pub fn repo_cache_folder(cache_dir: &Path, repo_id: &str) -> PathBuf {
    cache_dir.join(Repo::new(repo_id.to_string(), RepoType::Model).folder_name())
}

/// What the hub cache holds of a repo at `main`.
enum Cached {
    /// A snapshot with every group of its family's required files
    /// ([`Family::required_files`](crate::models::registry::Family::required_files)).
    Complete(PathBuf),
    /// A snapshot (its `config.json` is there) without these files, e.g. written by another
    /// tool that fetched only some of them.
    Partial(Vec<&'static str>),
    Absent,
}

/// The cached snapshot of `repo_id` at `main` (found by its `config.json`), and whether it is
/// complete.
fn cached_snapshot(cache_dir: &Path, repo_id: &str) -> Cached {
    let cache = Cache::new(cache_dir.to_path_buf());
    let Some(dir) = cache
        .model(repo_id.to_string())
        .get("config.json")
        .and_then(|config| config.parent().map(Path::to_path_buf))
    else {
        return Cached::Absent;
    };
    // The family by the snapshot's config.json (Qwen3-TTS's files when it cannot be told: the
    // load then names what is wrong).
    let family = registry::detect(&dir).unwrap_or(&registry::QWEN3_TTS);
    let missing: Vec<&'static str> = family
        .required_files
        .iter()
        .filter(|group| !group.iter().any(|f| dir.join(f).is_file()))
        .map(|group| group[0])
        .collect();
    if missing.is_empty() {
        Cached::Complete(dir)
    } else {
        Cached::Partial(missing)
    }
}

/// Resolves the `model` property value to a checkpoint directory, downloading a repo id into
/// the cache when needed and allowed. Blocking (network); call it from `start()`, never from
/// the streaming thread.
pub fn resolve_model(value: &str, opts: &HubOptions) -> Result<ResolvedModel, HubError> {
    let value = value.trim();
    if value.is_empty() {
        return Err(HubError::Empty);
    }
    let path = Path::new(value);
    if path.is_dir() {
        if !path.join("config.json").is_file() {
            return Err(HubError::NotACheckpoint {
                value: value.to_string(),
            });
        }
        return Ok(ResolvedModel {
            dir: path.to_path_buf(),
            source: ModelSource::LocalDir,
        });
    }
    if !looks_like_repo_id(value) {
        return Err(HubError::NotFound {
            value: value.to_string(),
        });
    }
    let partial = match cached_snapshot(&opts.cache_dir, value) {
        Cached::Complete(dir) => {
            return Ok(ResolvedModel {
                dir,
                source: ModelSource::Cache,
            });
        }
        Cached::Partial(missing) => format!("; the cached snapshot lacks {}", missing.join(", ")),
        Cached::Absent => String::new(),
    };
    let not_cached = |why: String| HubError::NotCached {
        repo: value.to_string(),
        cache: repo_cache_folder(&opts.cache_dir, value),
        why,
    };
    if opts.offline {
        return Err(not_cached(format!("HF_HUB_OFFLINE is set{partial}")));
    }
    // hf-hub has internal asserts/unwraps on odd server answers: never let one unwind into GStreamer.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| download(value, opts)))
        .unwrap_or_else(|_| {
            Err("the download panicked (unexpected answer from the server)".to_string())
        });
    result.map_err(|e| {
        not_cached(format!(
            "downloading from {} failed: {e}{partial}",
            opts.endpoint
        ))
    })
}

/// Downloads every needed file of `repo_id` (see [`is_needed`]) into the cache.
fn download(repo_id: &str, opts: &HubOptions) -> Result<ResolvedModel, String> {
    let mut builder = ApiBuilder::from_cache(Cache::new(opts.cache_dir.clone()))
        .with_endpoint(opts.endpoint.clone())
        .with_progress(false)
        .with_user_agent("omnitts", env!("CARGO_PKG_VERSION"));
    if opts.token.is_some() {
        builder = builder.with_token(opts.token.clone());
    }
    let api = builder.build().map_err(|e| e.to_string())?;
    let repo = api.model(repo_id.to_string());
    let info = repo.info().map_err(|e| format!("repo info: {e}"))?;
    let mut files: Vec<String> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.clone())
        .filter(|f| is_needed(f))
        .collect();
    // config.json last: its presence in a snapshot is what marks the snapshot complete.
    files.sort_by_key(|f| f == "config.json");
    if !files.iter().any(|f| f == "config.json") {
        return Err(format!(
            "the repo lists no config.json (files: {:?})",
            info.siblings
                .iter()
                .map(|s| &s.rfilename)
                .collect::<Vec<_>>()
        ));
    }
    let mut fetched = 0;
    let mut config_path = None;
    for f in &files {
        let cached = Cache::new(opts.cache_dir.clone())
            .model(repo_id.to_string())
            .get(f)
            .is_some();
        let p = repo.get(f).map_err(|e| format!("{f}: {e}"))?;
        if !cached {
            fetched += 1;
        }
        if f == "config.json" {
            config_path = Some(p);
        }
    }
    let dir = config_path
        .as_deref()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| "config.json was not stored".to_string())?;
    Ok(ResolvedModel {
        dir,
        source: ModelSource::Downloaded { files: fetched },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_id_shape() {
        assert!(looks_like_repo_id("Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"));
        assert!(looks_like_repo_id("a/b"));
        assert!(!looks_like_repo_id("tests/fixtures/tiny"));
        assert!(!looks_like_repo_id("/abs/path"));
        assert!(!looks_like_repo_id("./rel"));
        assert!(!looks_like_repo_id("noslash"));
        assert!(!looks_like_repo_id("a/b c"));
        assert!(!looks_like_repo_id("../x"));
    }

    #[test]
    fn needed_files() {
        assert!(is_needed("config.json"));
        assert!(is_needed("speech_tokenizer/model.safetensors"));
        assert!(!is_needed(".gitattributes"));
        assert!(!is_needed("README.md"));
        assert!(!is_needed("assets/pic.PNG"));
    }
}
