//! The tiny Fish S2 Pro checkpoints (tests/fixtures/tiny-fish and tiny-fish-alt) and the official
//! reference's outputs on them (`expected/`, made by scripts/fish/make_tiny.py), shared by the
//! Fish tests.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// Every checkpoint the reference made: `tiny-fish` has S2 Pro's own configuration (q/k norm in
/// the slow AR only, no biases, a tied head, a fast AR as wide as the slow AR); `tiny-fish-alt`
/// takes the other value of each of those options, with other depths, head geometry and codec
/// widths (its README says which).
pub const FIXTURES: [&str; 2] = ["tiny-fish", "tiny-fish-alt"];

/// One checkpoint and the reference's outputs on it.
pub struct Fixture {
    /// Its directory name under tests/fixtures.
    pub name: &'static str,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The reference's tensors (`expected/reference.safetensors`): codes, waveforms, logits.
    pub expected: HashMap<String, Tensor>,
    /// The reference's run description (`expected/reference.json`): its cases, generation
    /// settings and tokenizer ids.
    pub meta: serde_json::Value,
}

impl Fixture {
    /// Loads `tests/fixtures/<name>` and its `expected/`.
    pub fn load(name: &'static str) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let expected = candle_core::safetensors::load(
            dir.join("expected/reference.safetensors"),
            &Device::Cpu,
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.join("expected/reference.json")).unwrap();
        let meta = serde_json::from_str(&text).unwrap();
        Self {
            name,
            dir,
            expected,
            meta,
        }
    }
}

/// Every fixture of [`FIXTURES`], loaded.
pub fn all() -> impl Iterator<Item = Fixture> {
    FIXTURES.into_iter().map(Fixture::load)
}

/// The main checkpoint directory (`tiny-fish`).
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-fish")
}

/// The reference's tensors on the main checkpoint.
pub fn expected() -> HashMap<String, Tensor> {
    Fixture::load(FIXTURES[0]).expected
}

/// The reference's run description on the main checkpoint.
pub fn meta() -> serde_json::Value {
    Fixture::load(FIXTURES[0]).meta
}
