//! Helpers of the model's unit tests.

use std::path::Path;

use candle_core::{DType, Device};

use super::{ArModel, Checkpoint, GenerationConfig};

/// The fixture checkpoint `tests/fixtures/<name>` on the CPU in f32, with its generation config.
pub(super) fn fixture(name: &str) -> (ArModel, GenerationConfig) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let ckpt = Checkpoint::open(&dir).expect("fixture checkpoint");
    let m = ArModel::load(&ckpt, &Device::Cpu, DType::F32).expect("load");
    (m, ckpt.generation)
}
