//! Causal 1-D convolutions with explicit streaming state.
//!
//! Every layer here is stateless (`&self`); the per-stream state lives in a separate value that the
//! caller owns, so one loaded model can serve several independent streams. Processing a signal in
//! one call or in any sequence of chunks gives the same result (up to f32 rounding), because the
//! state carries exactly what the causal layer needs from the past:
//!
//! - [`StreamingCausalConv1d`] keeps the last `(kernel_size - 1) * dilation` input samples
//!   (initially zeros, which reproduces the reference's left zero padding);
//! - [`StreamingCausalConvTranspose1d`] keeps the `kernel_size - stride` output samples that a
//!   chunk's last input frames contribute beyond the chunk (the overlap tail); on CUDA, where it
//!   runs as a product by phases, the last `⌈kernel_size / stride⌉ - 1` input frames instead.
//!
//! On CUDA (bf16 or f32) a convolution runs as one GEMM over its input written tap-major from the
//! history and the chunk in place ([`crate::nn::cuda_kernels::shift_cols`]), whose output is
//! already `[batch, channels, time]` (docs/cuda.md, "Code2Wav convolutions as products over the
//! history"); on the CPU (f32) as the same product, its input stacked from the taps' views of the
//! padded chunk a stream at a time (1.25-1.3× faster Code2Wav than candle's `conv1d`, which zeroes
//! and fills an im2col buffer and copies its output back to channels-first;
//! docs/cpu-results/2026-12-06-code2wav-products/). `OMNITTS_DECODER_CONV=candle` keeps candle's
//! `conv1d` on both.
//!
//! Several streams run through a layer together by stacking their states along the batch
//! dimension ([`CausalConvState::stack`], [`ConvTransposeState::stack`]) for one pass over a
//! `[streams, channels, time]` input, and splitting the updated state back per stream afterwards
//! (`split`); row `i` of the pass is then exactly stream `i`'s own chunk.
//!
//! Reference: `Qwen3TTSTokenizerV2CausalConvNet` and `Qwen3TTSTokenizerV2CausalTransConvNet` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use candle_core::{Result, Tensor, bail};

use super::snake_beta::SnakeBeta;

/// What follows a convolution's bias add; on CUDA the two run as one kernel
/// ([`crate::nn::cuda_kernels::bias_epilogue`]), elsewhere as the tensor operations.
#[derive(Debug, Clone, Copy)]
pub enum Then<'a> {
    /// Nothing: `conv(x) + bias`.
    Nothing,
    /// SnakeBeta: `snake(conv(x) + bias)`.
    Snake(&'a SnakeBeta),
    /// A residual add: `residual + (conv(x) + bias)`, `residual` of the output's shape.
    Residual(&'a Tensor),
}

/// `y` `[b, c, t]` plus `bias` (`[1, c, 1]`, if any), then `then`.
fn bias_then(y: Tensor, bias: Option<&Tensor>, then: Then<'_>) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(b) = bias
        && y.device().is_cuda()
        && matches!(
            y.dtype(),
            candle_core::DType::F32 | candle_core::DType::BF16
        )
        && crate::nn::switches::Switches::get().decoder_kernels
    {
        use crate::nn::cuda_kernels::bias_epilogue::{Then as K, bias_epilogue};
        let b = b.flatten_all()?;
        match then {
            Then::Nothing => return bias_epilogue(&y, &b, K::Nothing),
            Then::Residual(r) if r.dtype() == y.dtype() => {
                return bias_epilogue(&y, &b, K::Residual(&r.contiguous()?));
            }
            Then::Snake(s) => {
                if let Some((frequency, inv_magnitude)) = s.kernel_params() {
                    let k = K::Snake {
                        frequency: &frequency,
                        inv_magnitude: &inv_magnitude,
                    };
                    return bias_epilogue(&y, &b, k);
                }
            }
            Then::Residual(_) => {}
        }
    }
    let y = match bias {
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    match then {
        Then::Nothing => Ok(y),
        Then::Snake(s) => s.forward(&y),
        Then::Residual(r) => r + y,
    }
}

/// How the convolution is computed; chosen once at construction.
#[derive(Debug, Clone)]
enum ConvKernel {
    /// Plain `conv1d` (groups = 1, kernel > 1).
    Dense(Tensor),
    /// Kernel size 1: a matmul with the `[c_out, c_in]` weight.
    Pointwise(Tensor),
    /// Depthwise (groups = channels): one `[1, C, 1]` weight per tap, applied as shifted
    /// multiply-adds (candle's grouped conv would run one conv per channel).
    Depthwise(Vec<Tensor>),
    /// The `[1, c_out, k · c_in]` weight (taps outermost) of one product over the history and the
    /// chunk: on CUDA with the product input written in place
    /// ([`StreamingCausalConv1d::forward_product`]), on the CPU row by row from the taps' views.
    Product(Tensor),
}

/// Whether a layer whose weight is `weight` runs as one product over the history and the chunk
/// (`OMNITTS_DECODER_CONV` `cols`, the default): on CUDA in bf16 or f32 with
/// `OMNITTS_DECODER_KERNELS` on; on the CPU in f32 (candle's `conv1d` there writes an im2col
/// buffer it zeroes first and copies its output back to channels-first: 1.3× the time of a
/// Code2Wav pass, docs/cpu-results/2026-12-06-code2wav-products/).
fn product_kernel(weight: &Tensor) -> bool {
    use candle_core::DType;
    let switches = crate::nn::switches::Switches::get();
    if switches.decoder_conv != crate::nn::switches::DecoderConv::Cols {
        return false;
    }
    if weight.device().is_cuda() {
        switches.decoder_kernels && matches!(weight.dtype(), DType::BF16 | DType::F32)
    } else {
        weight.dtype() == DType::F32
    }
}

/// The history a causal layer needs before a chunk of `x` `[b, c, n]`: `slot`'s, or zeros before
/// the first chunk; `[b, c, ctx]`. Errors if the stored history does not fit `x`.
fn take_history(slot: &mut Option<Tensor>, x: &Tensor, ctx: usize, what: &str) -> Result<Tensor> {
    let (b, c, _) = x.dims3()?;
    match slot.take() {
        Some(h) if h.dims3()? == (b, c, ctx) => Ok(h),
        Some(h) => bail!(
            "{what}: state shape {:?} does not fit input {:?}",
            h.shape(),
            x.shape()
        ),
        None => Tensor::zeros((b, c, ctx), x.dtype(), x.device()),
    }
}

/// The last `ctx` samples of `[history, x]` along time (the history after the chunk `x`).
#[cfg(feature = "cuda")]
fn next_history(history: &Tensor, x: &Tensor, ctx: usize) -> Result<Tensor> {
    let n = x.dim(2)?;
    if n >= ctx {
        x.narrow(2, n - ctx, ctx)?.contiguous()
    } else {
        Tensor::cat(&[history, x], 2)?
            .narrow(2, n, ctx)?
            .contiguous()
    }
}

/// Causal, stride-1 1-D convolution: left zero padding of `(k - 1) * dilation`, no right padding,
/// so `L` input samples give `L` output samples.
///
/// Input and output are `[batch, channels, time]`. Weight `[c_out, c_in / groups, k]`, bias `[c_out]`.
/// Supported groups: 1, or depthwise (groups = c_in = c_out).
#[derive(Debug, Clone)]
pub struct StreamingCausalConv1d {
    kernel: ConvKernel,
    /// `[1, c_out, 1]`, if any.
    bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    dilation: usize,
}

/// Streaming state of a [`StreamingCausalConv1d`]: the last `(k - 1) * dilation` input samples,
/// `[batch, c_in, (k - 1) * dilation]`; `None` before the first chunk (= zeros).
#[derive(Debug, Clone, Default)]
pub struct CausalConvState {
    history: Option<Tensor>,
}

impl CausalConvState {
    /// Forget the past (the next chunk starts a new signal).
    pub fn reset(&mut self) {
        self.history = None;
    }

    /// Stacks the states of streams (each of batch 1) along the batch dimension, in order, for
    /// one pass over `[states.len(), c_in, n]`: `[states.len(), c_in, (k - 1) * dilation]`, with
    /// zeros (the left padding) for a stream that has seen nothing yet.
    ///
    /// Errors if the histories differ in shape (states of different layers).
    pub fn stack(states: &[&Self]) -> Result<Self> {
        let rows: Vec<_> = states.iter().map(|s| s.history.as_ref()).collect();
        Ok(Self {
            history: stack_rows(&rows)?,
        })
    }

    /// Splits a state of batch `n` (after a pass over a stacked state) into the `n` per-stream
    /// states, in order (the inverse of [`Self::stack`]).
    pub fn split(self, n: usize) -> Result<Vec<Self>> {
        Ok(split_rows(self.history, n)?
            .into_iter()
            .map(|history| Self { history })
            .collect())
    }
}

/// `f` applied to each row `[1, ...]` of `x` `[rows, ...]` on its own, the results stacked along
/// the batch dimension again (`f(x)` itself for one row).
///
/// The layers run their matrix products this way when several streams share a pass, so that a row
/// computes bit for bit what the stream computes alone: the CPU matrix kernels pick their blocking
/// and inner kernels by the row count (small products, single rows and long inner dimensions each
/// take another path), so a batch folded into one product rounds differently from its rows, and
/// candle 0.11 folds a batch into the rows of one product even where that is wrong (a transposed
/// conv's input, viewed time-major, is not row-major).
pub fn row_by_row(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    let rows = x.dim(0)?;
    if rows == 1 {
        return f(x);
    }
    let outs = (0..rows)
        .map(|r| f(&x.narrow(0, r, 1)?))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&outs, 0)
}

/// `f(x)` in one call on a CUDA device, [`row_by_row`] elsewhere: the batched passes' products.
///
/// On the GPU a pass of many streams would otherwise cost a launch per stream and product (the
/// decoder's convolutions and linear layers: thousands of small launches a pass at 64 streams),
/// and its rows are computed independently either way; the batch only changes the GEMM's blocking,
/// so a row stays within float rounding of its stream alone instead of equal to the bit (the CPU
/// keeps the bit-exact rows its tests check). Not for the transposed convolution, whose batched
/// product candle folds wrongly (see [`row_by_row`]).
pub fn per_row_on_cpu(x: &Tensor, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
    if x.device().is_cuda() {
        f(x)
    } else {
        row_by_row(x, f)
    }
}

/// `rows` (each `[1, ...]`, or `None` for zeros) stacked into `[rows.len(), ...]`; `None` when
/// every row is `None`.
fn stack_rows(rows: &[Option<&Tensor>]) -> Result<Option<Tensor>> {
    let Some(like) = rows.iter().flatten().next() else {
        return Ok(None);
    };
    if rows.len() == 1 {
        return Ok(Some((*like).clone()));
    }
    let zeros = like.zeros_like()?;
    let parts: Vec<&Tensor> = rows.iter().map(|r| r.unwrap_or(&zeros)).collect();
    if let Some(p) = parts.iter().find(|p| p.dims() != like.dims()) {
        bail!(
            "streaming state: cannot stack a {:?} state with a {:?} one",
            p.shape(),
            like.shape()
        )
    }
    #[cfg(feature = "cuda")]
    if like.device().is_cuda()
        && matches!(
            like.dtype(),
            candle_core::DType::BF16 | candle_core::DType::F32
        )
        && crate::nn::switches::Switches::get().decoder_kernels
        && parts.iter().all(|p| p.is_contiguous())
    {
        return Ok(Some(crate::nn::cuda_kernels::gather_rows::gather_rows(
            &parts,
        )?));
    }
    Ok(Some(Tensor::cat(&parts, 0)?))
}

/// Row `i` of `[n, ...]` as `[1, ...]` for each `i < n` (`n` times `None` for `None`).
fn split_rows(t: Option<Tensor>, n: usize) -> Result<Vec<Option<Tensor>>> {
    match t {
        None => Ok(vec![None; n]),
        Some(t) if t.dim(0)? == n => (0..n).map(|i| t.narrow(0, i, 1).map(Some)).collect(),
        Some(t) => bail!(
            "streaming state: a {:?} state cannot be split into {n} streams",
            t.shape()
        ),
    }
}

impl StreamingCausalConv1d {
    /// Builds the layer from a `[c_out, c_in / groups, k]` weight and an optional `[c_out]` bias.
    ///
    /// Errors if the shapes disagree, `dilation` is 0, or `groups` is neither 1 nor depthwise.
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        dilation: usize,
        groups: usize,
    ) -> Result<Self> {
        let (out_channels, in_per_group, kernel_size) = weight.dims3()?;
        if dilation == 0 || kernel_size == 0 {
            bail!(
                "causal conv: dilation and kernel size must be > 0 (got {dilation}, {kernel_size})"
            )
        }
        let in_channels = in_per_group * groups;
        let kernel = if groups == 1 {
            if kernel_size == 1 {
                ConvKernel::Pointwise(weight.squeeze(2)?.contiguous()?)
            } else {
                if product_kernel(&weight) {
                    // [c_out, c_in, k] -> [c_out, k, c_in] -> [1, c_out, k · c_in]
                    let w = weight.transpose(1, 2)?.contiguous()?;
                    ConvKernel::Product(w.reshape((1, out_channels, kernel_size * in_per_group))?)
                } else {
                    ConvKernel::Dense(weight.contiguous()?)
                }
            }
        } else if in_per_group == 1 && groups == out_channels {
            let taps = (0..kernel_size)
                .map(|j| weight.narrow(2, j, 1)?.reshape((1, out_channels, 1)))
                .collect::<Result<Vec<_>>>()?;
            ConvKernel::Depthwise(taps)
        } else {
            bail!(
                "causal conv: only groups = 1 or depthwise are supported (groups {groups}, weight {:?})",
                weight.shape()
            )
        };
        let bias = match bias {
            Some(b) => {
                let n = b.dims1()?;
                if n != out_channels {
                    bail!("causal conv: bias has {n} entries, weight has {out_channels} outputs")
                }
                Some(b.reshape((1, out_channels, 1))?)
            }
            None => None,
        };
        Ok(Self {
            kernel,
            bias,
            in_channels,
            out_channels,
            kernel_size,
            dilation,
        })
    }

    /// Input samples of past context the layer needs: `(k - 1) * dilation`.
    pub fn context(&self) -> usize {
        (self.kernel_size - 1) * self.dilation
    }

    /// Number of input channels.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// Number of output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// Convolves the next chunk `x` `[b, c_in, n]` → `[b, c_out, n]`, updating `state`.
    pub fn forward(&self, x: &Tensor, state: &mut CausalConvState) -> Result<Tensor> {
        self.forward_then(x, state, Then::Nothing)
    }

    /// [`Self::forward`] followed by `then` (fused with the bias add on CUDA).
    pub fn forward_then(
        &self,
        x: &Tensor,
        state: &mut CausalConvState,
        then: Then<'_>,
    ) -> Result<Tensor> {
        let (b, c, n) = x.dims3()?;
        if c != self.in_channels {
            bail!(
                "causal conv: input has {c} channels, expected {}",
                self.in_channels
            )
        }
        let ctx = self.context();
        #[cfg(feature = "cuda")]
        if let ConvKernel::Product(w) = &self.kernel
            && x.device().is_cuda()
        {
            return self.forward_product(w, x, state, then);
        }
        let padded = if ctx == 0 {
            x.clone()
        } else {
            let history = take_history(&mut state.history, x, ctx, "causal conv")?;
            let padded = Tensor::cat(&[&history, x], 2)?;
            state.history = Some(padded.narrow(2, n, ctx)?.contiguous()?);
            padded
        };
        let y = match &self.kernel {
            ConvKernel::Dense(w) => {
                per_row_on_cpu(&padded, |p| p.conv1d(w, 0, 1, self.dilation, 1))?
            }
            ConvKernel::Pointwise(w) => w.broadcast_left(b)?.matmul(&padded.contiguous()?)?,
            ConvKernel::Depthwise(taps) => {
                let mut acc = padded.narrow(2, 0, n)?.broadcast_mul(&taps[0])?;
                for (j, tap) in taps.iter().enumerate().skip(1) {
                    acc = (acc + padded.narrow(2, j * self.dilation, n)?.broadcast_mul(tap)?)?;
                }
                acc
            }
            // On the CPU: per stream, the product input `[1, k · c_in, n]` stacked from the taps'
            // views of the padded chunk (tap j at offset j · dilation), then one matmul whose
            // output is already `[1, c_out, n]`. A stream at a time keeps that input in cache.
            ConvKernel::Product(w) => row_by_row(&padded, |p| {
                let taps = (0..self.kernel_size)
                    .map(|j| p.narrow(2, j * self.dilation, n))
                    .collect::<Result<Vec<_>>>()?;
                w.matmul(&Tensor::cat(&taps, 1)?)
            })?,
        };
        bias_then(y, self.bias.as_ref(), then)
    }

    /// [`Self::forward_then`] as one product over the history and the chunk read in place (`w`
    /// `[1, c_out, k · c_in]`, on CUDA): the product input written tap-major
    /// ([`shift_cols`](crate::nn::cuda_kernels::shift_cols::shift_cols)), one batched GEMM whose
    /// output is already `[b, c_out, n]`, then the bias epilogue. No concatenation with the
    /// history and no transposing copy (candle's `conv1d` makes both).
    #[cfg(feature = "cuda")]
    fn forward_product(
        &self,
        w: &Tensor,
        x: &Tensor,
        state: &mut CausalConvState,
        then: Then<'_>,
    ) -> Result<Tensor> {
        use crate::nn::cuda_kernels::shift_cols::{ConvShape, shift_cols};
        let ctx = self.context();
        let x = x.contiguous()?;
        let history = take_history(&mut state.history, &x, ctx, "causal conv")?;
        let shape = ConvShape {
            taps: self.kernel_size,
            dilation: self.dilation,
            phases: 1,
        };
        let cols = shift_cols(Some(&history), &x, shape)?; // [b, k · c_in, n]
        let (_, c_out, k_cin) = w.dims3()?;
        let y = w.broadcast_as((x.dim(0)?, c_out, k_cin))?.matmul(&cols)?; // [b, c_out, n]
        state.history = Some(next_history(&history, &x, ctx)?);
        bias_then(y, self.bias.as_ref(), then)
    }
}

/// Causal transposed 1-D convolution: `conv_transpose1d` with stride `s` and kernel `k ≥ s`, of which
/// the last `k - s` output samples are dropped, so `L` input frames give exactly `L * s` samples.
///
/// Input `[batch, c_in, L]`, output `[batch, c_out, L * s]`. Weight `[c_in, c_out, k]` (PyTorch
/// `ConvTranspose1d` layout, the same as candle's), bias `[c_out]`.
#[derive(Debug, Clone)]
pub struct StreamingCausalConvTranspose1d {
    weight: Tensor,
    /// On CUDA: the weight zero-padded to `⌈k / s⌉ · s` taps and viewed as one matrix,
    /// `[c_in, c_out · ⌈k / s⌉ · s]`, for [`Self::full_output_gemm`].
    weight_gemm: Option<Tensor>,
    /// On CUDA: the weight of the product by phases ([`Self::forward_product`]), `[c_out · s,
    /// q · c_in]` with `q = ⌈k / s⌉`: row `co · s + r`, tap `j` holds the weight's tap
    /// `(q - 1 - j) · s + r` (zero past `k`). The layer then keeps the last `q - 1` input frames as
    /// its state instead of the overlap tail, and `weight_gemm` is not built.
    #[cfg(feature = "cuda")]
    product: Option<Tensor>,
    /// `[c_out]`: the bias, or zeros without one (the product's epilogue adds it).
    #[cfg(feature = "cuda")]
    bias_flat: Tensor,
    /// `[1, c_out, 1]`.
    bias: Option<Tensor>,
    in_channels: usize,
    out_channels: usize,
    kernel_size: usize,
    stride: usize,
}

/// Streaming state of a [`StreamingCausalConvTranspose1d`]: the `k - s` output samples (without
/// bias) that earlier input frames contribute to the next chunk, `[batch, c_out, k - s]`.
#[derive(Debug, Clone, Default)]
pub struct ConvTransposeState {
    tail: Option<Tensor>,
    /// On the product by phases (CUDA): the last `⌈k / s⌉ - 1` input frames, `[batch, c_in, q - 1]`.
    history: Option<Tensor>,
}

impl ConvTransposeState {
    /// Forget the past (the next chunk starts a new signal).
    pub fn reset(&mut self) {
        self.tail = None;
        self.history = None;
    }

    /// Stacks the states of streams (each of batch 1) along the batch dimension, in order, for
    /// one pass over `[states.len(), c_in, n]`: `[states.len(), c_out, k - s]`, with zeros (no
    /// overlap yet) for a stream that has seen nothing yet.
    ///
    /// Errors if the tails differ in shape (states of different layers).
    pub fn stack(states: &[&Self]) -> Result<Self> {
        let tails: Vec<_> = states.iter().map(|s| s.tail.as_ref()).collect();
        let histories: Vec<_> = states.iter().map(|s| s.history.as_ref()).collect();
        Ok(Self {
            tail: stack_rows(&tails)?,
            history: stack_rows(&histories)?,
        })
    }

    /// Splits a state of batch `n` into the `n` per-stream states, in order (the inverse of
    /// [`Self::stack`]).
    pub fn split(self, n: usize) -> Result<Vec<Self>> {
        Ok(split_rows(self.tail, n)?
            .into_iter()
            .zip(split_rows(self.history, n)?)
            .map(|(tail, history)| Self { tail, history })
            .collect())
    }
}

impl StreamingCausalConvTranspose1d {
    /// Builds the layer from a `[c_in, c_out, k]` weight, optional `[c_out]` bias and the stride.
    ///
    /// Errors if `stride` is 0 or larger than the kernel, or the bias length is wrong.
    pub fn new(weight: Tensor, bias: Option<Tensor>, stride: usize) -> Result<Self> {
        let (in_channels, out_channels, kernel_size) = weight.dims3()?;
        if stride == 0 || stride > kernel_size {
            bail!(
                "causal transposed conv: need 0 < stride ≤ kernel (stride {stride}, kernel {kernel_size})"
            )
        }
        let bias = match bias {
            Some(b) => {
                let n = b.dims1()?;
                if n != out_channels {
                    bail!(
                        "causal transposed conv: bias has {n} entries, weight has {out_channels} outputs"
                    )
                }
                Some(b.reshape((1, out_channels, 1))?)
            }
            None => None,
        };
        #[cfg(feature = "cuda")]
        let product = if product_kernel(&weight) {
            Some(product_weight(&weight, stride)?)
        } else {
            None
        };
        #[cfg(feature = "cuda")]
        let by_phases = product.is_some();
        #[cfg(not(feature = "cuda"))]
        let by_phases = false;
        let weight_gemm = if weight.device().is_cuda() && !by_phases {
            Some(gemm_weight(&weight, stride)?)
        } else {
            None
        };
        #[cfg(feature = "cuda")]
        let bias_flat = match &bias {
            Some(b) => b.flatten_all()?,
            None => Tensor::zeros(out_channels, weight.dtype(), weight.device())?,
        };
        Ok(Self {
            weight: weight.contiguous()?,
            weight_gemm,
            #[cfg(feature = "cuda")]
            product,
            #[cfg(feature = "cuda")]
            bias_flat,
            bias,
            in_channels,
            out_channels,
            kernel_size,
            stride,
        })
    }

    /// The whole transposed convolution of `x` `[b, c_in, n]` (contiguous), without bias:
    /// `[b, c_out, (n - 1) · s + k]`.
    fn full_output(&self, x: &Tensor) -> Result<Tensor> {
        match &self.weight_gemm {
            Some(w) if crate::nn::switches::Switches::get().decoder_kernels => {
                self.full_output_gemm(x, w)
            }
            _ => row_by_row(x, |x| {
                x.conv_transpose1d(&self.weight, 0, 0, self.stride, 1, 1)
            }),
        }
    }

    /// [`Self::full_output`] as one product for all rows, then an overlap-add (CUDA): with
    /// `q = ⌈k / s⌉`, `Z = xᵀ · W` (`[b · n, c_in] × [c_in, c_out · q · s]`) holds, for each input
    /// frame `t`, the `q` blocks of `s` output samples it contributes; block `m` of frame `t` is
    /// added into output block `t + m`. Candle's own CUDA transposed convolution does the same
    /// product and overlap-add, but one batch row per call here (its batched product is folded
    /// wrongly, see [`row_by_row`]): at 64 streams that is 64 small products a layer instead of
    /// one. A row is within float rounding of its stream alone (the product's blocking depends
    /// on the row count).
    fn full_output_gemm(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let (b, c_in, n) = x.dims3()?;
        let (s, k, c_out) = (self.stride, self.kernel_size, self.out_channels);
        let q = k.div_ceil(s);
        let z = x
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b * n, c_in))?
            .matmul(w)?
            .reshape((b, n, c_out, q, s))?;
        let mut blocks: Option<Tensor> = None; // [b, n + q - 1, c_out, s]
        for m in 0..q {
            let part = z.narrow(3, m, 1)?.squeeze(3)?;
            let part = if q > 1 {
                part.pad_with_zeros(1, m, q - 1 - m)?
            } else {
                part
            };
            blocks = Some(match blocks {
                None => part,
                Some(acc) => (acc + part)?,
            });
        }
        let Some(blocks) = blocks else {
            bail!("causal transposed conv: kernel size 0")
        };
        blocks
            .permute((0, 2, 1, 3))?
            .contiguous()?
            .reshape((b, c_out, (n + q - 1) * s))?
            .narrow(2, 0, (n * s + k).saturating_sub(s))
    }

    /// Upsampling factor (output samples per input frame).
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Number of output channels.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// Upsamples the next chunk `x` `[b, c_in, n]` → `[b, c_out, n * stride]`, updating `state`.
    pub fn forward(&self, x: &Tensor, state: &mut ConvTransposeState) -> Result<Tensor> {
        let (b, c, n) = x.dims3()?;
        if c != self.in_channels {
            bail!(
                "causal transposed conv: input has {c} channels, expected {}",
                self.in_channels
            )
        }
        #[cfg(feature = "cuda")]
        if let Some(w) = &self.product {
            return self.forward_product(w, x, state);
        }
        let s = self.stride;
        let overlap = self.kernel_size - s;
        // [b, c_out, (n - 1) * s + k] = [b, c_out, n * s + overlap]
        let mut y = self.full_output(&x.contiguous()?)?;
        if overlap > 0 {
            if let Some(tail) = state.tail.take() {
                if tail.dims3()? != (b, self.out_channels, overlap) {
                    bail!(
                        "causal transposed conv: state shape {:?} does not fit input {:?}",
                        tail.shape(),
                        x.shape()
                    )
                }
                let head = (y.narrow(2, 0, overlap)? + tail)?;
                let rest = y.narrow(2, overlap, n * s)?;
                y = Tensor::cat(&[&head, &rest], 2)?;
            }
            state.tail = Some(y.narrow(2, n * s, overlap)?.contiguous()?);
        }
        let y = y.narrow(2, 0, n * s)?;
        match &self.bias {
            Some(_) => bias_then(y, self.bias.as_ref(), Then::Nothing),
            None => y.contiguous(),
        }
    }
}

impl StreamingCausalConvTranspose1d {
    /// [`Self::forward`] as one product by phases (`w` from [`product_weight`], on CUDA): output
    /// sample `n · s + r` is `Σ_m W[:, :, m · s + r] · x[n - m]`, a causal convolution of
    /// `q = ⌈k / s⌉` taps over the input frames with `s` output phases, so the state is the last
    /// `q - 1` input frames and each output sample is computed the same way however the signal is
    /// cut into chunks: the tap-major product input
    /// ([`shift_cols`](crate::nn::cuda_kernels::shift_cols::shift_cols)), one GEMM
    /// `[b, c_out · s, n]`, and the bias epilogue interleaving the phases
    /// ([`bias_epilogue_phased`](crate::nn::cuda_kernels::bias_epilogue::bias_epilogue_phased)).
    #[cfg(feature = "cuda")]
    fn forward_product(
        &self,
        w: &Tensor,
        x: &Tensor,
        state: &mut ConvTransposeState,
    ) -> Result<Tensor> {
        use crate::nn::cuda_kernels::bias_epilogue::{Then, bias_epilogue_phased};
        use crate::nn::cuda_kernels::shift_cols::{ConvShape, shift_cols};
        let shape = ConvShape {
            taps: self.kernel_size.div_ceil(self.stride),
            dilation: 1,
            phases: self.stride,
        };
        let ctx = shape.context();
        let x = x.contiguous()?;
        let history = if ctx == 0 {
            None
        } else {
            Some(take_history(
                &mut state.history,
                &x,
                ctx,
                "causal transposed conv",
            )?)
        };
        let cols = shift_cols(history.as_ref(), &x, shape)?; // [b, q · c_in, n]
        let z = w.broadcast_left(x.dim(0)?)?.matmul(&cols)?; // [b, c_out · s, n]
        if let Some(h) = &history {
            state.history = Some(next_history(h, &x, ctx)?);
        }
        bias_epilogue_phased(&z, self.stride, &self.bias_flat, Then::Nothing)
    }
}

/// A causal transposed convolution's `[c_in, c_out, k]` weight as its product by phases takes it
/// (see [`StreamingCausalConvTranspose1d::forward_product`]): zero-padded to `q · s` taps
/// (`q = ⌈k / s⌉`), then `[c_out · s, q · c_in]` with row `co · s + r` and column `j · c_in + ci`
/// holding tap `(q - 1 - j) · s + r` of `[ci, co]`.
#[cfg(feature = "cuda")]
pub fn product_weight(weight: &Tensor, stride: usize) -> Result<Tensor> {
    let (c_in, c_out, k) = weight.dims3()?;
    let q = k.div_ceil(stride);
    let reversed: Vec<u32> = (0..q as u32).rev().collect();
    let reversed = Tensor::new(reversed.as_slice(), weight.device())?;
    weight
        .pad_with_zeros(2, 0, q * stride - k)?
        .reshape((c_in, c_out, q, stride))? // tap m · s + r at [.., m, r]
        .permute((1, 3, 2, 0))? // [c_out, s, q (m), c_in]
        .contiguous()?
        .index_select(&reversed, 2)? // m = q - 1 - j
        .reshape((c_out * stride, q * c_in))?
        .contiguous()
}

/// A transposed convolution's `[c_in, c_out, k]` weight zero-padded to `⌈k / s⌉ · s` taps and
/// viewed as one matrix `[c_in, c_out · ⌈k / s⌉ · s]` (for
/// [`StreamingCausalConvTranspose1d::full_output_gemm`]).
fn gemm_weight(weight: &Tensor, stride: usize) -> Result<Tensor> {
    let (c_in, c_out, k) = weight.dims3()?;
    let padded_taps = k.div_ceil(stride) * stride;
    weight
        .pad_with_zeros(2, 0, padded_taps - k)?
        .reshape((c_in, c_out * padded_taps))?
        .contiguous()
}

#[cfg(test)]
mod tests {
    //! Streaming against one pass and against the direct formulas (as moshi tests its streaming
    //! modules): every (kernel, stride, dilation) combination, chunked in several ways, must give
    //! the signal that the non-streaming layer gives; stacked states must keep their streams apart.

    use super::*;
    use crate::nn::test_util::max_diff;
    use candle_core::Device;

    /// Deterministic values in [-1, 1) (xorshift), `n` of them.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    fn tensor(dims: &[usize], seed: u64) -> Tensor {
        let n = dims.iter().product();
        Tensor::from_vec(values(n, seed), dims, &Device::Cpu).unwrap()
    }

    fn rows(t: &Tensor) -> Vec<Vec<Vec<f32>>> {
        t.to_vec3().unwrap()
    }

    /// `x` `[b, c, len]` cut into chunks of `chunk` samples along time.
    fn chunks(x: &Tensor, chunk: usize) -> Vec<Tensor> {
        let len = x.dim(2).unwrap();
        (0..len)
            .step_by(chunk)
            .map(|s| x.narrow(2, s, chunk.min(len - s)).unwrap())
            .collect()
    }

    /// The causal conv by its definition: `y[o][t] = b[o] + Σ_i Σ_j w[o][i][j] · x[i][t - (k-1-j)·d]`
    /// (zero before the start), groups 1 or depthwise.
    fn causal_conv_direct(x: &Tensor, w: &Tensor, b: &Tensor, dilation: usize) -> Tensor {
        let (batch, c_in, len) = x.dims3().unwrap();
        let (c_out, in_per_group, k) = w.dims3().unwrap();
        let (xs, ws, bs) = (rows(x), rows(w), b.to_vec1::<f32>().unwrap());
        let mut out = vec![0f32; batch * c_out * len];
        for n in 0..batch {
            for o in 0..c_out {
                for t in 0..len {
                    let mut acc = bs[o] as f64;
                    for (ig, taps) in ws[o].iter().enumerate() {
                        let i = if in_per_group == c_in { ig } else { o };
                        for (j, &tap) in taps.iter().enumerate() {
                            let back = (k - 1 - j) * dilation;
                            if t >= back {
                                acc += (tap * xs[n][i][t - back]) as f64;
                            }
                        }
                    }
                    out[(n * c_out + o) * len + t] = acc as f32;
                }
            }
        }
        Tensor::from_vec(out, (batch, c_out, len), &Device::Cpu).unwrap()
    }

    /// The causal transposed conv by its definition: `y[o][l·s + j] += w[i][o][j] · x[i][l]`, plus
    /// the bias, keeping the first `len · s` samples.
    fn causal_conv_transpose_direct(x: &Tensor, w: &Tensor, b: &Tensor, stride: usize) -> Tensor {
        let (batch, c_in, len) = x.dims3().unwrap();
        let (_, c_out, k) = w.dims3().unwrap();
        let (xs, ws, bs) = (rows(x), rows(w), b.to_vec1::<f32>().unwrap());
        let out_len = len * stride;
        let mut acc = vec![0f64; batch * c_out * (out_len + k)];
        for n in 0..batch {
            for i in 0..c_in {
                for o in 0..c_out {
                    for l in 0..len {
                        for j in 0..k {
                            acc[(n * c_out + o) * (out_len + k) + l * stride + j] +=
                                (ws[i][o][j] * xs[n][i][l]) as f64;
                        }
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(batch * c_out * out_len);
        for n in 0..batch {
            for (o, bias) in bs.iter().enumerate() {
                let row = (n * c_out + o) * (out_len + k);
                out.extend((0..out_len).map(|t| (acc[row + t] + *bias as f64) as f32));
            }
        }
        Tensor::from_vec(out, (batch, c_out, out_len), &Device::Cpu).unwrap()
    }

    /// Runs `x` through `forward` in chunks of `chunk` on one state, concatenating the outputs.
    fn streamed<S: Default>(
        x: &Tensor,
        chunk: usize,
        mut forward: impl FnMut(&Tensor, &mut S) -> Result<Tensor>,
    ) -> Tensor {
        let mut state = S::default();
        let outs: Vec<Tensor> = chunks(x, chunk)
            .iter()
            .map(|c| forward(c, &mut state).unwrap())
            .collect();
        Tensor::cat(&outs, 2).unwrap()
    }

    const TOL: f32 = 1e-5;

    #[test]
    fn causal_conv_streams_like_one_pass_and_the_formula() {
        let len = 37;
        for (kernel, dilation, groups) in [
            (1, 1, 1),
            (2, 1, 1),
            (3, 1, 1),
            (3, 2, 1),
            (7, 1, 1),
            (7, 3, 1),
            (7, 9, 1),
            (7, 1, 4),
            (5, 2, 4),
        ] {
            let (c_in, c_out) = (4, if groups == 1 { 3 } else { 4 });
            let seed = (kernel * 100 + dilation * 10 + groups) as u64;
            let w = tensor(&[c_out, c_in / groups, kernel], seed);
            let b = tensor(&[c_out], seed + 1);
            let conv =
                StreamingCausalConv1d::new(w.clone(), Some(b.clone()), dilation, groups).unwrap();
            assert_eq!(conv.context(), (kernel - 1) * dilation);
            let x = tensor(&[2, c_in, len], seed + 2);
            let want = causal_conv_direct(&x, &w, &b, dilation);
            let whole = conv.forward(&x, &mut CausalConvState::default()).unwrap();
            let label = format!("kernel {kernel}, dilation {dilation}, groups {groups}");
            assert!(
                max_diff(&whole, &want) < TOL,
                "{label}: one pass vs formula"
            );
            for chunk in [1, 2, 5, 16, 19, len] {
                let got = streamed(&x, chunk, |c, s| conv.forward(c, s));
                let d = max_diff(&got, &whole);
                assert!(d < TOL, "{label}, chunk {chunk}: streamed differs by {d}");
            }
        }
    }

    #[test]
    fn the_cpu_product_matches_candles_conv1d_and_keeps_rows_apart() {
        use crate::nn::switches::{DecoderConv, Switches};
        let (c_in, c_out, len) = (6, 5, 29);
        for (kernel, dilation) in [(2, 1), (3, 2), (7, 1), (7, 3), (7, 9)] {
            let seed = (kernel * 10 + dilation) as u64 + 500;
            let w = tensor(&[c_out, c_in, kernel], seed);
            let b = tensor(&[c_out], seed + 1);
            let product = StreamingCausalConv1d::new(w.clone(), Some(b), dilation, 1).unwrap();
            if Switches::get().decoder_conv == DecoderConv::Cols {
                assert!(matches!(product.kernel, ConvKernel::Product(_)));
            }
            let mut dense = product.clone();
            dense.kernel = ConvKernel::Dense(w.contiguous().unwrap());
            let x = tensor(&[3, c_in, len], seed + 2);
            let label = format!("kernel {kernel}, dilation {dilation}");
            for chunk in [1, 4, len] {
                let got = streamed(&x, chunk, |c, s| product.forward(c, s));
                let want = streamed(&x, chunk, |c, s| dense.forward(c, s));
                let d = max_diff(&got, &want);
                assert!(d < TOL, "{label}, chunk {chunk}: product vs conv1d {d}");
                // Each row of a pass is its stream alone, to the bit.
                for r in 0..3 {
                    let row = x.narrow(0, r, 1).unwrap();
                    let alone = streamed(&row, chunk, |c, s| product.forward(c, s));
                    assert_eq!(
                        rows(&got.narrow(0, r, 1).unwrap()),
                        rows(&alone),
                        "{label}, chunk {chunk}, row {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn causal_conv_transpose_streams_like_one_pass_and_the_formula() {
        let len = 23;
        for (kernel, stride) in [(1, 1), (2, 2), (3, 1), (4, 2), (10, 5), (16, 8), (6, 3)] {
            let (c_in, c_out) = (3, 2);
            let seed = (kernel * 10 + stride) as u64;
            let w = tensor(&[c_in, c_out, kernel], seed);
            let b = tensor(&[c_out], seed + 1);
            let conv =
                StreamingCausalConvTranspose1d::new(w.clone(), Some(b.clone()), stride).unwrap();
            let x = tensor(&[2, c_in, len], seed + 2);
            let want = causal_conv_transpose_direct(&x, &w, &b, stride);
            let whole = conv
                .forward(&x, &mut ConvTransposeState::default())
                .unwrap();
            assert_eq!(whole.dims(), &[2, c_out, len * stride]);
            let label = format!("kernel {kernel}, stride {stride}");
            assert!(
                max_diff(&whole, &want) < TOL,
                "{label}: one pass vs formula"
            );
            for chunk in [1, 2, 3, 7, len] {
                let got = streamed(&x, chunk, |c, s| conv.forward(c, s));
                let d = max_diff(&got, &whole);
                assert!(d < TOL, "{label}, chunk {chunk}: streamed differs by {d}");
            }
        }
    }

    /// The one-product form of the transposed conv (CUDA's, forced here on the CPU), including
    /// kernels that are not a multiple of the stride, streamed and stacked like the default form.
    #[test]
    fn causal_conv_transpose_as_one_product_matches_the_formula() {
        let len = 13;
        for (kernel, stride) in [(1, 1), (2, 2), (3, 1), (5, 2), (10, 5), (16, 8), (7, 3)] {
            let (c_in, c_out) = (3, 2);
            let seed = (kernel * 10 + stride) as u64 + 500;
            let w = tensor(&[c_in, c_out, kernel], seed);
            let b = tensor(&[c_out], seed + 1);
            let mut conv =
                StreamingCausalConvTranspose1d::new(w.clone(), Some(b.clone()), stride).unwrap();
            conv.weight_gemm = Some(gemm_weight(&w, stride).unwrap());
            let x = tensor(&[3, c_in, len], seed + 2);
            let want = causal_conv_transpose_direct(&x, &w, &b, stride);
            let label = format!("kernel {kernel}, stride {stride}");
            let full = conv
                .full_output_gemm(&x, conv.weight_gemm.as_ref().unwrap())
                .unwrap();
            assert_eq!(
                full.dims(),
                &[3, c_out, (len - 1) * stride + kernel],
                "{label}"
            );
            for chunk in [1, 4, len] {
                let got = streamed(&x, chunk, |c, s| conv.forward(c, s));
                let d = max_diff(&got, &want);
                assert!(
                    d < TOL,
                    "{label}, chunk {chunk}: one-product form differs by {d}"
                );
            }
        }
    }

    /// Three streams (11 samples seen, none, 4 samples) decode their next 6 samples in one
    /// stacked pass and then 3 more apart; each must match the stream run alone throughout.
    fn check_stacking<S: Clone + Default>(
        c_in: usize,
        forward: impl Fn(&Tensor, &mut S) -> Tensor,
        stack: impl Fn(&[&S]) -> Result<S>,
        split: impl Fn(S, usize) -> Result<Vec<S>>,
    ) {
        let mut states = [S::default(), S::default(), S::default()];
        forward(&tensor(&[1, c_in, 11], 5), &mut states[0]);
        forward(&tensor(&[1, c_in, 4], 6), &mut states[2]);
        let next = tensor(&[3, c_in, 6], 7);
        let after = tensor(&[1, c_in, 3], 8);
        let row = |i| next.narrow(0, i, 1).unwrap();
        let mut stacked = stack(&[&states[0], &states[1], &states[2]]).unwrap();
        let got = forward(&next, &mut stacked);
        let parts = split(stacked, 3).unwrap();
        for (i, (mut alone, mut part)) in states.into_iter().zip(parts).enumerate() {
            let want = forward(&row(i), &mut alone);
            assert_eq!(rows(&got.narrow(0, i, 1).unwrap()), rows(&want), "row {i}");
            let want = forward(&after, &mut alone);
            assert_eq!(
                rows(&forward(&after, &mut part)),
                rows(&want),
                "row {i} after split"
            );
        }
    }

    #[test]
    fn stacked_states_keep_streams_apart() {
        let conv =
            StreamingCausalConv1d::new(tensor(&[3, 2, 7], 1), Some(tensor(&[3], 2)), 3, 1).unwrap();
        check_stacking(
            2,
            |x, s| conv.forward(x, s).unwrap(),
            CausalConvState::stack,
            CausalConvState::split,
        );
        let tconv =
            StreamingCausalConvTranspose1d::new(tensor(&[2, 3, 10], 3), Some(tensor(&[3], 4)), 5)
                .unwrap();
        check_stacking(
            2,
            |x, s| tconv.forward(x, s).unwrap(),
            ConvTransposeState::stack,
            ConvTransposeState::split,
        );
        // All fresh stacks to fresh; stacking states of two layers, or splitting into the wrong
        // number of streams, is an error.
        let fresh = CausalConvState::default();
        let both = CausalConvState::stack(&[&fresh, &fresh]).unwrap();
        assert!(both.history.is_none());
        assert_eq!(both.split(2).unwrap().len(), 2);
        let mut used = CausalConvState::default();
        conv.forward(&tensor(&[1, 2, 5], 9), &mut used).unwrap();
        let mut other = CausalConvState::default();
        StreamingCausalConv1d::new(tensor(&[2, 2, 3], 10), None, 1, 1)
            .unwrap()
            .forward(&tensor(&[1, 2, 5], 11), &mut other)
            .unwrap();
        assert!(CausalConvState::stack(&[&used, &other]).is_err());
        let pair = CausalConvState::stack(&[&used, &used]).unwrap();
        assert!(pair.split(3).is_err());
    }
}
