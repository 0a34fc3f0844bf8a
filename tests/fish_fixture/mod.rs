//! The tiny Fish S2 Pro checkpoint (tests/fixtures/tiny-fish) and the official reference's
//! outputs on it (`expected/`, made by scripts/fish/make_tiny.py), shared by the Fish tests.

#![allow(dead_code)] // each test binary uses its own part

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};

/// The checkpoint directory.
pub fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-fish")
}

/// The reference's tensors (`expected/reference.safetensors`): codes, waveforms, logits.
pub fn expected() -> HashMap<String, Tensor> {
    candle_core::safetensors::load(
        fixture().join("expected/reference.safetensors"),
        &Device::Cpu,
    )
    .unwrap()
}

/// The reference's run description (`expected/reference.json`): its cases, generation
/// settings and tokenizer ids.
pub fn meta() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture().join("expected/reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}
