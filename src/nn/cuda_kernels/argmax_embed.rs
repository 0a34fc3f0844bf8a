//! Launcher of `argmax_embed.cu`: the greedy code and the next step's input embedding in one
//! kernel (reference: [`crate::models::qwen3_tts::device_sampler::DeviceSampler::greedy`]
//! followed by the codec embedding's `index_select`, in `CodePredictor::frame_on_device`).

use candle_core::{DType, Result, Tensor};

use super::{Args, PickOutputs, cuda_device, dev_ptr, expect, kernel_name, single_block};

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
    let out = PickOutputs::new(&dev, table, vocab, "argmax_embed")?;
    let (pl, pi) = (dev_ptr(logits, &dev)?, dev_ptr(&out.id, &dev)?);
    let (table_addr, x_addr, rows) = out.row_addrs(&dev, table, pl.addr)?;
    let args = Args::default()
        .ptr(pl.addr)
        .i32(vocab)?
        .ptr(table_addr)
        .i32(out.hidden)?
        .ptr(pi.addr)
        .ptr(x_addr);
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("argmax_embed", out.dtype)?,
        single_block(THREADS),
    )?;
    drop((pl, pi, rows));
    Ok((out.id, out.x))
}
