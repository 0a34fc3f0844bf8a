//! Launcher of `argmax_embed.cu`: the greedy code and the next step's input embedding in one
//! kernel (reference: [`crate::models::qwen3_tts::device_sampler::DeviceSampler::greedy`]
//! followed by the codec embedding's `index_select`, in `CodePredictor::frame_on_device`).

use candle_core::cuda_backend::cudarc::driver::LaunchConfig;
use candle_core::{DType, Result, Tensor};

use super::{Args, cuda_device, dev_ptr, empty, expect, kernel_name};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/argmax_embed.ptx"));
const MODULE: &str = "omnitts_argmax_embed";
/// Threads of the one block (`ARGMAX_THREADS` in the kernel).
const THREADS: u32 = 1024;

/// The first index of the maximum of `logits` (f32, contiguous, any shape; its element count is
/// the vocabulary) as u32 `[1]`, and with `table` (`[vocab, hidden]`, bf16 or f32, contiguous)
/// that row of it as `[1, 1, hidden]`: the greedy pick and the next input of a code-predictor
/// step. NaN logits never win (an all-NaN row gives the last index). One launch.
pub fn argmax_embed(logits: &Tensor, table: Option<&Tensor>) -> Result<(Tensor, Option<Tensor>)> {
    expect(logits, DType::F32, "logits")?;
    let vocab = logits.elem_count();
    if vocab == 0 {
        candle_core::bail!("argmax_embed: empty logits");
    }
    let dev = cuda_device(logits)?;
    let id = empty(&dev, DType::U32, 1)?;
    let (pl, pi) = (dev_ptr(logits, &dev)?, dev_ptr(&id, &dev)?);
    let (hidden, dtype) = match table {
        Some(t) => {
            expect(t, t.dtype(), "embedding table")?;
            let (rows, hidden) = t.dims2()?;
            if rows != vocab {
                candle_core::bail!("argmax_embed: table of {rows} rows for {vocab} logits");
            }
            (hidden, t.dtype())
        }
        None => (0, DType::F32),
    };
    let x = table
        .map(|_| empty(&dev, dtype, (1, 1, hidden)))
        .transpose()?;
    let pt = table.map(|t| dev_ptr(t, &dev)).transpose()?;
    let px = x.as_ref().map(|x| dev_ptr(x, &dev)).transpose()?;
    // Without a table the kernel copies nothing: any address stands in for table and output.
    let (table_addr, x_addr) = (
        pt.as_ref().map_or(pl.addr, |p| p.addr),
        px.as_ref().map_or(pl.addr, |p| p.addr),
    );
    let args = Args::default()
        .ptr(pl.addr)
        .i32(vocab)?
        .ptr(table_addr)
        .i32(hidden)?
        .ptr(pi.addr)
        .ptr(x_addr);
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    args.launch(&dev, MODULE, PTX, &kernel_name("argmax_embed", dtype)?, cfg)?;
    drop((pl, pi, pt, px));
    Ok((id, x))
}
