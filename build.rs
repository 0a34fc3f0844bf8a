//! Build script: GStreamer plugin version info, and (feature `cuda`) omnitts' fused decode kernels
//! compiled to PTX with nvcc (`src/nn/cuda_kernels/*.cu` -> `$OUT_DIR/<name>.ptx`, embedded by
//! `src/nn/cuda_kernels/mod.rs`; the driver JIT-compiles them on first use, as candle's own).
//!
//! nvcc: `$NVCC`, else `nvcc` on `PATH`, else `/usr/local/cuda/bin/nvcc` (what candle-kernels
//! also looks for). Target: `compute_$CUDA_COMPUTE_CAP` (e.g. 90 for H100/H200), else the first
//! GPU's compute capability from `nvidia-smi`, else 80 (PTX that JITs on any GPU >= sm_80).
//! nvcc must not be newer than the driver's CUDA version (docs/cuda.md, "Building").

fn main() {
    gst_plugin_version_helper::info();
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_cuda_kernels();
    }
}

const KERNELS: &[&str] = &[
    "qk_norm_rope",
    "decode_attention",
    "add_rms_norm",
    "silu_mul",
    "gemv",
    "argmax_embed",
    "embed_sum",
    "sample_embed",
    "rope_attention",
    "decode_stack",
    "pick_rows",
    "rows_attention",
    "snake_beta",
    "bias_epilogue",
    "gather_rows",
    "shift_cols",
    "kv_prefix",
];
/// Device functions shared between kernels (`#include`d by the .cu files above).
const HEADERS: &[&str] = &[
    "common",
    "gemv",
    "qk_norm_rope",
    "decode_attention",
    "rope_attention",
    "argmax_embed",
    "sample_embed",
];
const KERNEL_DIR: &str = "src/nn/cuda_kernels";

fn build_cuda_kernels() {
    use std::path::PathBuf;
    use std::process::Command;

    println!("cargo:rerun-if-env-changed=NVCC");
    println!("cargo:rerun-if-env-changed=CUDA_COMPUTE_CAP");
    for name in HEADERS {
        println!("cargo:rerun-if-changed={KERNEL_DIR}/{name}.cuh");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = std::env::var("NVCC").unwrap_or_else(|_| {
        let on_path = Command::new("nvcc").arg("--version").output().is_ok();
        if on_path {
            "nvcc".into()
        } else {
            "/usr/local/cuda/bin/nvcc".into()
        }
    });
    let cap = compute_cap();
    for name in KERNELS {
        let src = format!("{KERNEL_DIR}/{name}.cu");
        println!("cargo:rerun-if-changed={src}");
        let ptx = out.join(format!("{name}.ptx"));
        let status = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "--expt-relaxed-constexpr"])
            .arg(format!("-arch=compute_{cap}"))
            .arg("-o")
            .arg(&ptx)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("cannot run nvcc ({nvcc}) for {src}: {e}; set NVCC"));
        if !status.success() {
            panic!("nvcc failed on {src} ({status})");
        }
    }
}

/// `CUDA_COMPUTE_CAP` (e.g. `90`), else `nvidia-smi`'s first GPU, else 80.
fn compute_cap() -> String {
    if let Ok(c) = std::env::var("CUDA_COMPUTE_CAP") {
        let digits: String = c.chars().filter(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            return digits;
        }
    }
    let smi = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output();
    if let Ok(o) = smi
        && o.status.success()
        && let Some(line) = String::from_utf8_lossy(&o.stdout).lines().next()
    {
        let digits: String = line.chars().filter(char::is_ascii_digit).collect();
        if !digits.is_empty() {
            return digits;
        }
    }
    "80".into()
}
