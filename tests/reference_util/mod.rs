//! Helpers shared by the tests that use the fixtures (tests/fixtures, see its README): the paths of
//! the fixture checkpoints (every test file that needs one takes it from here), and the official
//! reference's recorded outputs (tests/fixtures/reference/*.json + safetensors): reading ids and
//! codes from the JSON, tensors as f32 vectors, and the error measures the tolerances are stated in.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use gstomnitts::models::qwen3_tts::{ArModel, Checkpoint, SamplingParams};
use serde_json::Value;

/// `tests/fixtures`: the fixture checkpoints and the reference's records (tests/fixtures/README.md).
pub fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `tests/fixtures/<name>`, a fixture checkpoint; panics with a clear message when it is missing.
pub fn fixture(name: &str) -> PathBuf {
    let p = fixtures_dir().join(name);
    assert!(
        p.join("config.json").is_file(),
        "fixture checkpoint {} is missing (tests/fixtures, see its README)",
        p.display()
    );
    p
}

/// [`fixture`] as the elements' `model` property value.
pub fn fixture_model(name: &str) -> String {
    fixture(name).display().to_string()
}

/// One checkpoint's reference record: `reference/<name>.json` and its safetensors.
pub struct Suite {
    /// The checkpoint name (`tiny-customvoice`, …).
    pub name: String,
    /// `tests/fixtures/<name>`.
    pub ckpt_dir: PathBuf,
    pub json: Value,
    pub tensors: HashMap<String, Tensor>,
}

impl Suite {
    /// Tensor `key` of the Base reference's `clone` section (`audio`, `mel`, `xvector`, `codes`).
    pub fn clone_tensor(&self, key: &str) -> Tensor {
        let name = self.json["clone"]["tensors"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{}: clone.tensors.{key}", self.name));
        self.tensors[name].clone()
    }

    /// The reference's sampling settings for `case` (its `generation` block over the checkpoint's
    /// `generation_config.json`, and the case's `max_new_tokens`).
    pub fn sampling(&self, ckpt: &Checkpoint, case: &Value) -> SamplingParams {
        let g = &self.json["generation"];
        let f = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("generation.{k}"));
        let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("generation.{k}")) as usize;
        let b = |k: &str| g[k].as_bool().unwrap_or_else(|| panic!("generation.{k}"));
        let mut p = SamplingParams::from_generation_config(&ckpt.generation);
        p.do_sample = b("do_sample");
        p.subtalker_do_sample = b("subtalker_dosample");
        p.repetition_penalty = f("repetition_penalty");
        p.temperature = f("temperature");
        p.top_k = n("top_k");
        p.top_p = f("top_p");
        p.subtalker_temperature = f("subtalker_temperature");
        p.subtalker_top_k = n("subtalker_top_k");
        p.subtalker_top_p = f("subtalker_top_p");
        p.max_new_tokens = case["max_new_tokens"].as_u64().expect("max_new_tokens") as usize;
        p
    }
}

/// Every checkpoint reference in `tests/fixtures/reference` (JSON files with `checkpoint` and
/// `cases`; `tokenizer.json` is not one), sorted by file name. Panics when there is none.
pub fn reference_suites() -> Vec<Suite> {
    let refdir = fixtures_dir().join("reference");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&refdir)
        .unwrap_or_else(|e| panic!("{}: {e}", refdir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    let mut out = Vec::new();
    for p in entries {
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let json: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        if json.get("checkpoint").is_none() || json.get("cases").is_none() {
            continue;
        }
        let name = json["checkpoint"].as_str().expect("checkpoint").to_string();
        let st = refdir.join(json["safetensors"].as_str().expect("safetensors"));
        let tensors = candle_core::safetensors::load(&st, &Device::Cpu)
            .unwrap_or_else(|e| panic!("{}: {e}", st.display()));
        out.push(Suite {
            ckpt_dir: fixtures_dir().join(&name),
            name,
            json,
            tensors,
        });
    }
    assert!(!out.is_empty(), "no reference JSON in {}", refdir.display());
    out
}

/// The reference of checkpoint `name`.
pub fn reference_suite(name: &str) -> Suite {
    reference_suites()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no reference for {name}"))
}

/// Loads a fixture checkpoint's stage 0 on the CPU in f32 (the parity setting).
pub fn load_f32(dir: &Path) -> ArModel {
    let ckpt = Checkpoint::open(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    ArModel::load(&ckpt, &Device::Cpu, DType::F32).unwrap_or_else(|e| panic!("{e}"))
}

/// A JSON array of non-negative integers as u32 ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("JSON array of ids")
        .iter()
        .map(|x| u32::try_from(x.as_u64().expect("id ≥ 0")).expect("id fits u32"))
        .collect()
}

/// A JSON array of frames (each an array of codes) as `[frames][codebooks]`.
pub fn frames(v: &Value) -> Vec<Vec<u32>> {
    v.as_array()
        .expect("JSON array of frames")
        .iter()
        .map(ids)
        .collect()
}

/// A 2-D integer tensor (codes, `[frames, codebooks]`) as rows of u32.
pub fn code_rows(t: &Tensor) -> Vec<Vec<u32>> {
    t.to_dtype(DType::I64)
        .and_then(|t| t.to_vec2::<i64>())
        .expect("2-D integer tensor")
        .into_iter()
        .map(|r| {
            r.into_iter()
                .map(|c| u32::try_from(c).expect("code ≥ 0"))
                .collect()
        })
        .collect()
}

/// Every element of `t` (any shape) as f32, in row-major order.
pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.to_vec1::<f32>())
        .expect("tensor as f32")
}

/// Relative L2 error ‖got − want‖ / ‖want‖, in f64; panics when the lengths differ.
pub fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// Largest absolute difference; panics when the lengths differ.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
