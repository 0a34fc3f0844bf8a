//! Launcher of `embed_sum.cu`: the talker's next decode input, `Σ_i table_i[code_i] + text`, in
//! one upload and one launch (reference: the input sum of `ArModel::talker_input` in
//! `src/models/qwen3_tts/ar_model.rs`: `C(a0) + Σ_q cp_table[q](a_{q+1}) + text`, summed in f32 in
//! codebook order as the CPU does).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{Result, Tensor};

use super::{Args, DevPtr, cuda_device, dev_ptr, empty, expect, kernel_name};

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
    let (addrs, guards) = table_addrs(tables, &dev)?;
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

/// [`embed_sum`] for several rows at once with the codes already on the device: row r of the
/// output is `Σ_i tables[i][codes[r, i]] + text[r]`, summed as the one-row kernel sums. `codes`
/// u32 `[rows, n]` (n = the number of tables, ≤ [`MAX_TABLES`]); `text` `[rows, 1, hidden]`;
/// both contiguous. Returns `[rows, 1, hidden]`. The codes are not checked against the tables
/// (they are read on the device): every code must be below its table's rows, as the pick kernels
/// that write them guarantee. Errors on mismatched shapes or dtypes.
pub fn embed_sum_rows(codes: &Tensor, tables: &[&Tensor], text: &Tensor) -> Result<Tensor> {
    let dtype = text.dtype();
    expect(text, dtype, "text rows")?;
    expect(codes, candle_core::DType::U32, "codes")?;
    let (rows, n) = codes.dims2()?;
    let (trows, one, hidden) = text.dims3()?;
    if n != tables.len() || n == 0 || n > MAX_TABLES || trows != rows || one != 1 {
        candle_core::bail!(
            "embed_sum_rows: codes {:?} for {} tables (1..={MAX_TABLES}), text {:?}",
            codes.dims(),
            tables.len(),
            text.dims()
        );
    }
    for (i, t) in tables.iter().enumerate() {
        expect(t, dtype, "embedding table")?;
        if t.dims2()?.1 != hidden {
            candle_core::bail!(
                "embed_sum_rows: table {i} is {:?}, hidden {hidden}",
                t.dims()
            );
        }
    }
    let dev = cuda_device(text)?;
    let out = empty(&dev, dtype, (rows, 1, hidden))?;
    let (pc, pt, po) = (
        dev_ptr(codes, &dev)?,
        dev_ptr(text, &dev)?,
        dev_ptr(&out, &dev)?,
    );
    let (addrs, guards) = table_addrs(tables, &dev)?;
    let args = Args::default()
        .ptr(pc.addr)
        .i32(n)?
        .ptrs(addrs)
        .ptr(pt.addr)
        .i32(hidden)?
        .ptr(po.addr);
    let cfg = LaunchConfig {
        grid_dim: (hidden.div_ceil(THREADS) as u32, rows as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("embed_sum_rows", dtype)?,
        cfg,
    )?;
    drop((pc, pt, po, guards));
    Ok(out)
}

/// The tables' device addresses as the kernels' by-value array (unused slots 0), with the guards
/// that keep them alive until the launch is queued.
fn table_addrs<'t>(
    tables: &[&'t Tensor],
    dev: &candle_core::cuda_backend::CudaDevice,
) -> Result<([u64; MAX_TABLES], Vec<DevPtr<'t>>)> {
    let guards = tables
        .iter()
        .map(|t| dev_ptr(t, dev))
        .collect::<Result<Vec<_>>>()?;
    let mut addrs = [0u64; MAX_TABLES];
    for (a, g) in addrs.iter_mut().zip(&guards) {
        *a = g.addr;
    }
    Ok((addrs, guards))
}
