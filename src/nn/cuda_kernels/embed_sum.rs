//! Launcher of `embed_sum.cu`: the talker's next decode input, `Σ_i table_i[code_i] + text`, in
//! one upload and one launch (reference: the input sum of `ArModel::talker_input` in
//! `src/models/qwen3_tts/ar_model.rs`: `C(a0) + Σ_q cp_table[q](a_{q+1}) + text`, summed in f32 in
//! codebook order as the CPU does).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/embed_sum.ptx"));
const MODULE: &str = "omnitts_embed_sum";
/// Threads per block (`EMBED_THREADS` in the kernel).
const THREADS: usize = 256;
/// Most tables one launch takes (`EMBED_MAX_TABLES`).
pub const MAX_TABLES: usize = 32;

/// `Σ_i tables[i][codes[i]]` (f32, in order, rounded to the dtype) `+ text` → `[1, 1, hidden]`.
/// `tables`: `[rows_i, hidden]`, `text`: `hidden` values; all contiguous, one dtype (bf16 or
/// f32), on one CUDA device. Errors when a code is not below its table's rows, on more than
/// [`MAX_TABLES`] tables, or on mismatched shapes.
pub fn embed_sum(codes: &[u32], tables: &[&Tensor], text: &Tensor) -> Result<Tensor> {
    if codes.len() != tables.len() || codes.is_empty() || codes.len() > MAX_TABLES {
        candle_core::bail!(
            "embed_sum: {} codes for {} tables (1..={MAX_TABLES})",
            codes.len(),
            tables.len()
        );
    }
    let dtype = text.dtype();
    expect(text, dtype, "text row")?;
    let hidden = text.elem_count();
    for (i, (&code, t)) in codes.iter().zip(tables).enumerate() {
        expect(t, dtype, "embedding table")?;
        let (rows, width) = t.dims2()?;
        if width != hidden || code as usize >= rows {
            candle_core::bail!(
                "embed_sum: code {code} of table {i} ({rows} x {width}, hidden {hidden})"
            );
        }
    }
    let dev = cuda_device(text)?;
    let codes_dev = Tensor::new(codes, text.device())?;
    let out = empty(&dev, dtype, (1, 1, hidden))?;
    let (pc, pt, po) = (
        dev_ptr(&codes_dev, &dev)?,
        dev_ptr(text, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let guards = tables
        .iter()
        .map(|t| dev_ptr(t, &dev))
        .collect::<Result<Vec<_>>>()?;
    let mut addrs = [0u64; MAX_TABLES];
    for (a, g) in addrs.iter_mut().zip(&guards) {
        *a = g.addr;
    }
    let args = Args::default()
        .ptr(pc.addr)
        .i32(codes.len())?
        .ptrs(addrs)
        .ptr(pt.addr)
        .i32(hidden)?
        .ptr(po.addr);
    let cfg = LaunchConfig {
        grid_dim: (hidden.div_ceil(THREADS) as u32, 1, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name("embed_sum", dtype)?, cfg)?;
    drop((pc, pt, po, guards));
    Ok(out)
}
