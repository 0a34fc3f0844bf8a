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
//!   chunk's last input frames contribute beyond the chunk (the overlap tail).
//!
//! Reference: `Qwen3TTSTokenizerV2CausalConvNet` and `Qwen3TTSTokenizerV2CausalTransConvNet` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`.

use candle_core::{Result, Tensor, bail};

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
                ConvKernel::Dense(weight.contiguous()?)
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
        let (b, c, n) = x.dims3()?;
        if c != self.in_channels {
            bail!(
                "causal conv: input has {c} channels, expected {}",
                self.in_channels
            )
        }
        let ctx = self.context();
        let padded = if ctx == 0 {
            x.clone()
        } else {
            let history = match state.history.take() {
                Some(h) if h.dims3()? == (b, c, ctx) => h,
                Some(h) => bail!(
                    "causal conv: state shape {:?} does not fit input {:?}",
                    h.shape(),
                    x.shape()
                ),
                None => Tensor::zeros((b, c, ctx), x.dtype(), x.device())?,
            };
            let padded = Tensor::cat(&[&history, x], 2)?;
            state.history = Some(padded.narrow(2, n, ctx)?.contiguous()?);
            padded
        };
        let y = match &self.kernel {
            ConvKernel::Dense(w) => padded.conv1d(w, 0, 1, self.dilation, 1)?,
            ConvKernel::Pointwise(w) => w.broadcast_left(b)?.matmul(&padded.contiguous()?)?,
            ConvKernel::Depthwise(taps) => {
                let mut acc = padded.narrow(2, 0, n)?.broadcast_mul(&taps[0])?;
                for (j, tap) in taps.iter().enumerate().skip(1) {
                    acc = (acc + padded.narrow(2, j * self.dilation, n)?.broadcast_mul(tap)?)?;
                }
                acc
            }
        };
        match &self.bias {
            Some(bias) => y.broadcast_add(bias),
            None => Ok(y),
        }
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
}

impl ConvTransposeState {
    /// Forget the past (the next chunk starts a new signal).
    pub fn reset(&mut self) {
        self.tail = None;
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
        Ok(Self {
            weight: weight.contiguous()?,
            bias,
            in_channels,
            out_channels,
            kernel_size,
            stride,
        })
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
        let s = self.stride;
        let overlap = self.kernel_size - s;
        // [b, c_out, (n - 1) * s + k] = [b, c_out, n * s + overlap]
        let mut y = x
            .contiguous()?
            .conv_transpose1d(&self.weight, 0, 0, s, 1, 1)?;
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
            Some(bias) => y.broadcast_add(bias),
            None => y.contiguous(),
        }
    }
}
