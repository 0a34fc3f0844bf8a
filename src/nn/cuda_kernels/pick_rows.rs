//! Launcher of `pick_rows.cu`: the code-predictor step's pick for every row of a batched frame in
//! one launch, each row greedy or sampled with its own parameters (reference: `argmax_embed` and
//! `sample_embed`, whose device functions it runs, so a row picks what the one-row kernels pick).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name, pick_table};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/pick_rows.ptx"));
const MODULE: &str = "omnitts_pick_rows";
/// Threads of a row's block (`SAMPLE_THREADS` in the kernel).
const THREADS: u32 = 1024;
/// Largest vocabulary the kernel takes (`SAMPLE_MAX_VOCAB`).
pub const MAX_VOCAB: usize = super::sample_embed::MAX_VOCAB;

/// Picks step `step`'s code of every row: `logits` f32 `[rows, 1, vocab]` (contiguous, `vocab` ≤
/// [`MAX_VOCAB`]), `params` f64 `[rows, PARAM_HEADER + steps]` (each row as
/// [`crate::models::qwen3_tts::device_sampler::frame_params`] makes it; a temperature ≤ 0 marks a
/// greedy row: the first index of the maximum). Writes row r's code into `codes[r, column]`
/// (`codes` u32 `[rows, width]`, contiguous) and, with `table` (`[vocab, hidden]`, bf16 or f32),
/// returns the picked rows of it as `[rows, 1, hidden]` (the next step's input). Errors on
/// mismatched shapes, a step past the parameters, or a column past `codes`.
pub fn pick_rows(
    logits: &Tensor,
    params: &Tensor,
    step: usize,
    table: Option<&Tensor>,
    codes: &Tensor,
    column: usize,
) -> Result<Option<Tensor>> {
    use crate::models::qwen3_tts::device_sampler::PARAM_HEADER;
    expect(logits, DType::F32, "logits")?;
    expect(params, DType::F64, "sampling parameters")?;
    expect(codes, DType::U32, "codes")?;
    let (rows, one, vocab) = logits.dims3()?;
    let (prow, stride) = params.dims2()?;
    let (crow, width) = codes.dims2()?;
    if one != 1
        || vocab == 0
        || vocab > MAX_VOCAB
        || prow != rows
        || crow != rows
        || PARAM_HEADER + step >= stride
        || column >= width
    {
        candle_core::bail!(
            "pick_rows: logits {:?}, parameters {:?}, codes {:?}, step {step}, column {column}",
            logits.dims(),
            params.dims(),
            codes.dims()
        );
    }
    let dev = cuda_device(logits)?;
    let (hidden, dtype) = pick_table(table, vocab, "pick_rows")?;
    let x = table
        .map(|_| empty(&dev, dtype, (rows, 1, hidden)))
        .transpose()?;
    let (pl, pp, pc) = (
        dev_ptr(logits, &dev)?,
        dev_ptr(params, &dev)?,
        dev_ptr(codes, &dev)?,
    );
    let pt = table.map(|t| dev_ptr(t, &dev)).transpose()?;
    let px = x.as_ref().map(|x| dev_ptr(x, &dev)).transpose()?;
    // Without a table nothing is copied; the logits' address stands in for both pointers.
    let table_addr = pt.as_ref().map_or(pl.addr, |p| p.addr);
    let x_addr = px.as_ref().map_or(pl.addr, |p| p.addr);
    let codes_addr = pc.addr + (column * std::mem::size_of::<u32>()) as u64;
    let args = Args::default()
        .ptr(pl.addr)
        .i32(vocab)?
        .ptr(pp.addr)
        .i32(stride)?
        .i32(step)?
        .ptr(table_addr)
        .i32(hidden)?
        .ptr(codes_addr)
        .i32(width)?
        .ptr(x_addr);
    let cfg = LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name("pick_rows", dtype)?, cfg)?;
    drop((pl, pp, pc, pt, px));
    Ok(x)
}
