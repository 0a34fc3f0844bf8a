//! The Base checkpoints' speaker encoder: ECAPA-TDNN without BatchNorm (docs/qwen3-tts.md §6).
//!
//! Reference: `Qwen3TTSSpeakerEncoder`, `TimeDelayNetBlock`, `Res2NetBlock`,
//! `SqueezeExcitationBlock`, `SqueezeExcitationRes2NetBlock`, `AttentiveStatisticsPooling` and
//! `extract_speaker_embedding` in `qwen_tts/core/models/modeling_qwen3_tts.py`. Weights at
//! `speaker_encoder.*` in `model.safetensors`.
//!
//! Input: the log-mel spectrogram of [`super::mel`], `[frames, mel_dim]`. Output: the x-vector,
//! `[enc_dim]` (= the talker hidden size), which the Base prompt uses unprojected as its speaker
//! row. Every convolution uses PyTorch `padding="same", padding_mode="reflect"`.

use candle_core::{D, DType, Device, Tensor};
use serde::Deserialize;

use super::ModelError;
use super::config::{SpeakerEncoderConfig, from_json, without_nulls};
use super::mel::{MelConfig, MelSpectrogram};
use crate::nn::Weights;

/// Parsed `speaker_encoder_config` (reference `Qwen3TTSSpeakerEncoderConfig`, same defaults:
/// an absent key takes the reference's value).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct EcapaConfig {
    pub mel_dim: usize,
    pub enc_dim: usize,
    pub enc_channels: Vec<usize>,
    pub enc_kernel_sizes: Vec<usize>,
    pub enc_dilations: Vec<usize>,
    pub enc_attention_channels: usize,
    pub enc_res2net_scale: usize,
    pub enc_se_channels: usize,
    pub sample_rate: u32,
}

impl Default for EcapaConfig {
    /// The reference's defaults.
    fn default() -> Self {
        Self {
            mel_dim: 128,
            enc_dim: 1024,
            enc_channels: vec![512, 512, 512, 512, 1536],
            enc_kernel_sizes: vec![5, 3, 3, 3, 1],
            enc_dilations: vec![1, 2, 3, 4, 1],
            enc_attention_channels: 128,
            enc_res2net_scale: 8,
            enc_se_channels: 128,
            sample_rate: 24000,
        }
    }
}

impl EcapaConfig {
    /// Reads the raw `speaker_encoder_config` object of `config.json` (`file` for messages).
    ///
    /// Errors: [`ModelError::Config`] naming `file` and the key
    /// (`speaker_encoder_config.enc_res2net_scale`) of a mistyped or unsupported value.
    pub fn from_config(
        file: &std::path::Path,
        c: &SpeakerEncoderConfig,
    ) -> Result<Self, ModelError> {
        let err = |field: &str, msg: String| ModelError::Config {
            file: file.to_path_buf(),
            field: format!("speaker_encoder_config.{field}"),
            msg,
        };
        let cfg: Self = from_json(file, &without_nulls(&c.raw), "speaker_encoder_config")?;
        let n = cfg.enc_channels.len();
        if n < 3 || cfg.enc_kernel_sizes.len() != n || cfg.enc_dilations.len() != n {
            return Err(err(
                "enc_channels",
                format!(
                    "enc_channels ({n}), enc_kernel_sizes ({}) and enc_dilations ({}) must have the same length ≥ 3",
                    cfg.enc_kernel_sizes.len(),
                    cfg.enc_dilations.len()
                ),
            ));
        }
        let scale = cfg.enc_res2net_scale;
        if scale < 2 || cfg.enc_channels[1..n - 1].iter().any(|c| c % scale != 0) {
            return Err(err(
                "enc_res2net_scale",
                format!("{scale} must be ≥ 2 and divide every SE-Res2Net width"),
            ));
        }
        if cfg.mel_dim != MelConfig::speaker_encoder().n_mels {
            return Err(err(
                "mel_dim",
                format!("{} (the reference front end has 128 mels)", cfg.mel_dim),
            ));
        }
        Ok(cfg)
    }
}

/// Reflect-pads `x` `[B, C, T]` on the time axis (PyTorch `mode="reflect"`: the edge sample is
/// not repeated). Requires `left, right < T`.
pub fn reflect_pad_1d(x: &Tensor, left: usize, right: usize) -> candle_core::Result<Tensor> {
    if left == 0 && right == 0 {
        return Ok(x.clone());
    }
    let t = x.dim(D::Minus1)?;
    if left >= t || right >= t {
        candle_core::bail!("reflect padding ({left}, {right}) needs more than {t} frames");
    }
    let idx: Vec<u32> = (0..left + t + right)
        .map(|i| {
            let j = i as i64 - left as i64;
            let j = if j < 0 {
                -j
            } else if j >= t as i64 {
                2 * (t as i64 - 1) - j
            } else {
                j
            };
            j as u32
        })
        .collect();
    let n = idx.len();
    let idx = Tensor::from_vec(idx, n, x.device())?;
    x.index_select(&idx, D::Minus1)
}

/// `nn.Conv1d(..., padding="same", padding_mode="reflect")` with bias. Weight `[out, in, k]`.
#[derive(Debug, Clone)]
struct SameConv {
    weight: Tensor,
    bias: Tensor,
    dilation: usize,
    pad_left: usize,
    pad_right: usize,
}

impl SameConv {
    fn new(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        k: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        let total = dilation * (k - 1);
        Ok(Self {
            weight: w.get(&[c_out, c_in, k], "weight")?,
            bias: w.get(&[c_out], "bias")?,
            dilation,
            pad_left: total / 2,
            pad_right: total - total / 2,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let x = reflect_pad_1d(x, self.pad_left, self.pad_right)?;
        let y = x.conv1d(&self.weight, 0, 1, self.dilation, 1)?;
        y.broadcast_add(&self.bias.reshape((1, (), 1))?)
    }
}

/// `TimeDelayNetBlock`: same-padded conv + ReLU. Weights at `<prefix>.conv.{weight,bias}`.
#[derive(Debug, Clone)]
struct Tdnn {
    conv: SameConv,
}

impl Tdnn {
    fn new(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        k: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            conv: SameConv::new(&w.pp("conv"), c_in, c_out, k, dilation)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.conv.forward(x)?.relu()
    }
}

/// `Res2NetBlock`: `scale` channel slices; slice 0 passes through, slice 1 goes through
/// `blocks.0`, slice i ≥ 2 through `blocks.(i-1)` after adding slice i−1's output.
#[derive(Debug, Clone)]
struct Res2Net {
    blocks: Vec<Tdnn>,
    scale: usize,
}

impl Res2Net {
    fn new(
        w: &Weights,
        channels: usize,
        scale: usize,
        k: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        let width = channels / scale;
        let blocks = (0..scale - 1)
            .map(|i| Tdnn::new(&w.pp(format!("blocks.{i}")), width, width, k, dilation))
            .collect::<Result<_, _>>()?;
        Ok(Self { blocks, scale })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let parts = x.chunk(self.scale, 1)?;
        let mut outs: Vec<Tensor> = Vec::with_capacity(self.scale);
        for (i, part) in parts.iter().enumerate() {
            let o = match i {
                0 => part.clone(),
                1 => self.blocks[0].forward(part)?,
                _ => self.blocks[i - 1].forward(&(part + &outs[i - 1])?)?,
            };
            outs.push(o);
        }
        Tensor::cat(&outs, 1)
    }
}

/// `SqueezeExcitationBlock`: mean over time → conv1 → ReLU → conv2 → sigmoid → scale.
#[derive(Debug, Clone)]
struct SqueezeExcitation {
    conv1: SameConv,
    conv2: SameConv,
}

impl SqueezeExcitation {
    fn new(w: &Weights, channels: usize, se: usize) -> Result<Self, ModelError> {
        Ok(Self {
            conv1: SameConv::new(&w.pp("conv1"), channels, se, 1, 1)?,
            conv2: SameConv::new(&w.pp("conv2"), se, channels, 1, 1)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let m = x.mean_keepdim(2)?;
        let m = self.conv1.forward(&m)?.relu()?;
        let m = candle_nn::ops::sigmoid(&self.conv2.forward(&m)?)?;
        x.broadcast_mul(&m)
    }
}

/// `SqueezeExcitationRes2NetBlock`: tdnn1 → res2net_block → tdnn2 → se_block → + input.
#[derive(Debug, Clone)]
struct SeRes2NetBlock {
    tdnn1: Tdnn,
    res2net_block: Res2Net,
    tdnn2: Tdnn,
    se_block: SqueezeExcitation,
}

impl SeRes2NetBlock {
    fn new(
        w: &Weights,
        c_in: usize,
        c_out: usize,
        cfg: &EcapaConfig,
        k: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            tdnn1: Tdnn::new(&w.pp("tdnn1"), c_in, c_out, 1, 1)?,
            res2net_block: Res2Net::new(
                &w.pp("res2net_block"),
                c_out,
                cfg.enc_res2net_scale,
                k,
                dilation,
            )?,
            tdnn2: Tdnn::new(&w.pp("tdnn2"), c_out, c_out, 1, 1)?,
            se_block: SqueezeExcitation::new(&w.pp("se_block"), c_out, cfg.enc_se_channels)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.tdnn1.forward(x)?;
        let h = self.res2net_block.forward(&h)?;
        let h = self.tdnn2.forward(&h)?;
        let h = self.se_block.forward(&h)?;
        h + x
    }
}

/// `AttentiveStatisticsPooling` (single utterance, no padding mask): `[1, C, T]` → `[1, 2C, 1]`.
#[derive(Debug, Clone)]
struct AttentiveStatsPool {
    tdnn: Tdnn,
    conv: SameConv,
}

const ASP_EPS: f64 = 1e-12;

/// Weighted mean and std over time with weights `m` (`[1, 1|C, T]`, summing to 1):
/// `mean = Σ m x`, `std = sqrt(max(Σ m (x − mean)², eps))`. Returns `[1, C]` each.
fn weighted_stats(x: &Tensor, m: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
    let mean = x.broadcast_mul(m)?.sum(2)?;
    let dev = x.broadcast_sub(&mean.unsqueeze(2)?)?.sqr()?;
    let std = dev
        .broadcast_mul(m)?
        .sum(2)?
        .clamp(ASP_EPS, f64::MAX)?
        .sqrt()?;
    Ok((mean, std))
}

impl AttentiveStatsPool {
    fn new(w: &Weights, channels: usize, attention: usize) -> Result<Self, ModelError> {
        Ok(Self {
            tdnn: Tdnn::new(&w.pp("tdnn"), channels * 3, attention, 1, 1)?,
            conv: SameConv::new(&w.pp("conv"), attention, channels, 1, 1)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (_, _, t) = x.dims3()?;
        let uniform = Tensor::full(1.0 / t as f64, (1, 1, t), x.device())?.to_dtype(x.dtype())?;
        let (mean, std) = weighted_stats(x, &uniform)?;
        let mean = mean.unsqueeze(2)?.repeat((1, 1, t))?;
        let std = std.unsqueeze(2)?.repeat((1, 1, t))?;
        let a = Tensor::cat(&[x, &mean, &std], 1)?;
        let a = self.conv.forward(&self.tdnn.forward(&a)?.tanh()?)?;
        let a = candle_nn::ops::softmax(&a, 2)?;
        let (mean, std) = weighted_stats(x, &a)?;
        Tensor::cat(&[mean, std], 1)?.unsqueeze(2)
    }
}

/// The first block (`blocks.0`) is a plain TDNN; the others are SE-Res2Net blocks.
#[derive(Debug, Clone)]
enum Block {
    Tdnn(Tdnn),
    SeRes2Net(SeRes2NetBlock),
}

/// `Qwen3TTSSpeakerEncoder` at `speaker_encoder.*`.
#[derive(Debug, Clone)]
pub struct SpeakerEncoder {
    cfg: EcapaConfig,
    blocks: Vec<Block>,
    mfa: Tdnn,
    asp: AttentiveStatsPool,
    fc: SameConv,
    mel: std::sync::Arc<MelSpectrogram>,
    device: Device,
    dtype: DType,
}

impl SpeakerEncoder {
    /// Loads the weights at `w` (the `speaker_encoder` prefix) in `w`'s dtype and device.
    pub fn new(cfg: &EcapaConfig, w: &Weights) -> Result<Self, ModelError> {
        let ch = &cfg.enc_channels;
        let ks = &cfg.enc_kernel_sizes;
        let dl = &cfg.enc_dilations;
        let n = ch.len();
        let mut blocks = vec![Block::Tdnn(Tdnn::new(
            &w.pp("blocks.0"),
            cfg.mel_dim,
            ch[0],
            ks[0],
            dl[0],
        )?)];
        for i in 1..n - 1 {
            blocks.push(Block::SeRes2Net(SeRes2NetBlock::new(
                &w.pp(format!("blocks.{i}")),
                ch[i - 1],
                ch[i],
                cfg,
                ks[i],
                dl[i],
            )?));
        }
        let cat: usize = ch[1..n - 1].iter().sum();
        if cat != ch[n - 1] {
            return Err(ModelError::Config {
                file: w.file().to_path_buf(),
                field: "speaker_encoder_config.enc_channels".into(),
                msg: format!(
                    "the last width {} must equal the sum of the SE-Res2Net widths {cat} (mfa input)",
                    ch[n - 1]
                ),
            });
        }
        let mfa = Tdnn::new(&w.pp("mfa"), ch[n - 1], ch[n - 1], ks[n - 1], dl[n - 1])?;
        let asp = AttentiveStatsPool::new(&w.pp("asp"), ch[n - 1], cfg.enc_attention_channels)?;
        let fc = SameConv::new(&w.pp("fc"), ch[n - 1] * 2, cfg.enc_dim, 1, 1)?;
        Ok(Self {
            cfg: cfg.clone(),
            blocks,
            mfa,
            asp,
            fc,
            mel: std::sync::Arc::new(MelSpectrogram::new(MelConfig::speaker_encoder())),
            device: w.device().clone(),
            dtype: w.dtype(),
        })
    }

    pub fn config(&self) -> &EcapaConfig {
        &self.cfg
    }

    /// The front end used by [`Self::embed_audio`].
    pub fn mel(&self) -> &MelSpectrogram {
        &self.mel
    }

    /// The least number of mel frames the convolutions accept (reflect padding needs more
    /// frames than the largest one-sided pad).
    pub fn min_frames(&self) -> usize {
        let c = &self.cfg;
        (0..c.enc_channels.len())
            .map(|i| c.enc_dilations[i] * (c.enc_kernel_sizes[i] - 1) / 2 + 1)
            .max()
            .unwrap_or(1)
            + 1
    }

    /// x-vector of a log-mel spectrogram `mel` `[frames, mel_dim]` (any float dtype; computed in
    /// the encoder's dtype). Returns `[enc_dim]` in f32.
    pub fn forward(&self, mel: &Tensor) -> Result<Tensor, ModelError> {
        let (frames, dim) = mel.dims2()?;
        if dim != self.cfg.mel_dim || frames < self.min_frames() {
            return Err(ModelError::InvalidRequest {
                field: "ref_audio".into(),
                value: format!("mel [{frames}, {dim}]"),
                msg: format!(
                    "the speaker encoder needs [≥{}, {}]",
                    self.min_frames(),
                    self.cfg.mel_dim
                ),
            });
        }
        let mut h = mel
            .to_device(&self.device)?
            .to_dtype(self.dtype)?
            .t()?
            .unsqueeze(0)?
            .contiguous()?;
        let mut outs = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            h = match b {
                Block::Tdnn(t) => t.forward(&h)?,
                Block::SeRes2Net(s) => s.forward(&h)?,
            };
            outs.push(h.clone());
        }
        let h = Tensor::cat(&outs[1..], 1)?;
        let h = self.mfa.forward(&h)?;
        let h = self.asp.forward(&h)?;
        let h = self.fc.forward(&h)?;
        Ok(h.flatten_all()?.to_dtype(DType::F32)?)
    }

    /// Log-mel of mono 24 kHz `audio` as a `[frames, 128]` f32 tensor on the encoder's device.
    pub fn mel_tensor(&self, audio: &[f32]) -> Result<Tensor, ModelError> {
        let m = self.mel.compute(audio)?;
        let frames = m.len() / self.cfg.mel_dim;
        Ok(Tensor::from_vec(
            m,
            (frames, self.cfg.mel_dim),
            &self.device,
        )?)
    }

    /// `extract_speaker_embedding`: mel front end + encoder on mono audio at
    /// [`EcapaConfig::sample_rate`] (24 kHz). Returns the x-vector `[enc_dim]` in f32.
    pub fn embed_audio(&self, audio: &[f32]) -> Result<Tensor, ModelError> {
        self.forward(&self.mel_tensor(audio)?)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::EcapaConfig;
    use crate::models::qwen3_tts::ModelError;
    use crate::models::qwen3_tts::config::SpeakerEncoderConfig;

    fn parse(raw: serde_json::Value) -> Result<EcapaConfig, ModelError> {
        let c = SpeakerEncoderConfig {
            enc_dim: None,
            sample_rate: None,
            raw,
        };
        EcapaConfig::from_config(Path::new("config.json"), &c)
    }

    #[test]
    fn absent_and_null_keys_take_the_reference_defaults() {
        let cfg = parse(json!({"enc_dim": 64, "enc_se_channels": null})).expect("parses");
        assert_eq!(
            cfg,
            EcapaConfig {
                enc_dim: 64,
                ..EcapaConfig::default()
            }
        );
    }

    #[test]
    fn errors_name_the_key() {
        let field = |r: Result<EcapaConfig, ModelError>| match r {
            Err(ModelError::Config { field, .. }) => field,
            other => panic!("expected a config error, got {other:?}"),
        };
        assert_eq!(
            field(parse(json!({"enc_res2net_scale": "eight"}))),
            "speaker_encoder_config.enc_res2net_scale"
        );
        assert_eq!(
            field(parse(json!({"enc_kernel_sizes": [5, 3]}))),
            "speaker_encoder_config.enc_channels"
        );
        assert_eq!(
            field(parse(json!({"enc_res2net_scale": 7}))),
            "speaker_encoder_config.enc_res2net_scale"
        );
        assert_eq!(
            field(parse(json!({"mel_dim": 80}))),
            "speaker_encoder_config.mel_dim"
        );
    }
}
