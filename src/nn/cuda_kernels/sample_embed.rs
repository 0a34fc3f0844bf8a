//! Launcher of `sample_embed.cu`: the sampled code of a code-predictor step (temperature → top-k →
//! top-p → inverse-CDF draw with a pre-drawn uniform) and the next step's input embedding in one
//! kernel (reference: [`crate::models::qwen3_tts::device_sampler::DeviceSampler::sample`]
//! followed by the codec embedding's `index_select`, in `CodePredictor::frame_on_device`).
//!
//! On by default; `OMNITTS_FUSED_SAMPLER=0` keeps `DeviceSampler::sample` (for A/B runs). Checked on
//! an H200 (docs/cuda.md): the same picks as `DeviceSampler::sample` in 600 of 600 draws.

use candle_core::{DType, Result, Tensor};

use super::{Args, PickOutputs, cuda_device, dev_ptr, expect, kernel_name, single_block};

const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/sample_embed.ptx"));
const MODULE: &str = "omnitts_sample_embed";
/// Threads of the one block (`SAMPLE_THREADS` in the kernel).
const THREADS: u32 = 1024;
/// Largest vocabulary the kernel sorts in shared memory (`SAMPLE_MAX_VOCAB`).
pub const MAX_VOCAB: usize = 4096;

/// Whether the fused sampler is on: unless `OMNITTS_FUSED_SAMPLER=0` ([`crate::nn::switches`]).
pub fn enabled() -> bool {
    crate::nn::switches::Switches::get().fused_sampler
}

/// The code of step `step` drawn from `logits` (f32, contiguous, `vocab` ≤ [`MAX_VOCAB`]
/// elements) with `params` (f64 `[PARAM_HEADER + steps]` of
/// [`crate::models::qwen3_tts::device_sampler::frame_params`], on the device) as u32 `[1]`, and
/// with `table` (`[vocab, hidden]`, bf16 or f32, contiguous) that row of it as `[1, 1, hidden]`.
/// One launch. Errors on a vocabulary over [`MAX_VOCAB`], a step past the parameters, or
/// mismatched shapes.
pub fn sample_embed(
    logits: &Tensor,
    params: &Tensor,
    step: usize,
    table: Option<&Tensor>,
) -> Result<(Tensor, Option<Tensor>)> {
    use crate::models::qwen3_tts::device_sampler::PARAM_HEADER;
    expect(logits, DType::F32, "logits")?;
    expect(params, DType::F64, "sampling parameters")?;
    let vocab = logits.elem_count();
    if vocab == 0 || vocab > MAX_VOCAB || PARAM_HEADER + step >= params.elem_count() {
        candle_core::bail!(
            "sample_embed: {vocab} logits (1..={MAX_VOCAB}), step {step} of {} parameters",
            params.elem_count()
        );
    }
    let dev = cuda_device(logits)?;
    let out = PickOutputs::new(&dev, table, vocab, "sample_embed")?;
    let (pl, pp, pi) = (
        dev_ptr(logits, &dev)?,
        dev_ptr(params, &dev)?,
        dev_ptr(&out.id, &dev)?,
    );
    let (table_addr, x_addr, rows) = out.row_addrs(&dev, table, pl.addr)?;
    let args = Args::default()
        .ptr(pl.addr)
        .i32(vocab)?
        .ptr(pp.addr)
        .i32(step)?
        .ptr(table_addr)
        .i32(out.hidden)?
        .ptr(pi.addr)
        .ptr(x_addr);
    args.launch(
        &dev,
        MODULE,
        PTX,
        &kernel_name("sample_embed", out.dtype)?,
        single_block(THREADS),
    )?;
    drop((pl, pp, pi, rows));
    Ok((out.id, out.x))
}
