//! Stage 1 of Qwen3-TTS: Code2Wav, the 12 Hz codec decoder (codes → 24 kHz waveform), in f32.
//!
//! Pipeline (docs/qwen3-tts.md §7.2), for `T` frames of `num_quantizers` (16) codes:
//! RVQ lookup `[1, 512, T]` → `pre_conv` (causal k3) `[1, 1024, T]` → `pre_transformer`
//! (8 layers, causal sliding window 72) → `upsample.{0,1}` (×2 each, ConvNeXt) `[1, 1024, 4T]` →
//! `decoder.0..6` (SnakeBeta vocoder, ×8·5·4·3) `[1, 1, 1920T]` → clamp to [-1, 1].
//!
//! Every layer is causal, and each one that needs the past keeps it in an explicit streaming state
//! (conv input history, transposed-conv overlap tail, per-layer KV window with absolute RoPE
//! positions). [`Code2WavStream::decode_chunk`] therefore decodes any chunk schedule exactly like a
//! single pass; [`Code2Wav::decode`] is one `decode_chunk` on a fresh stream, so whole and streamed
//! decoding share one code path.
//!
//! Reference: `Qwen3TTSTokenizerV2Decoder` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`. Note that the reference's
//! `Qwen3TTSTokenizer.decode` decodes in windows of 300 frames with 25 frames of left context
//! (`chunked_decode`); that is [`Code2Wav::decode_window`], not [`Code2Wav::decode`], and the two
//! differ beyond 300 frames.

mod config;
mod decoder;
mod quantizer;
mod transformer;
mod weights;

use std::path::Path;

use candle_core::{DType, Device, Tensor};

pub use super::ModelError;
pub use config::{DecoderConfig, SpeechTokenizerConfig};

use decoder::{UpsampleStage, UpsampleState, Vocoder, VocoderState, causal_conv};
use quantizer::SplitResidualVectorQuantizer;
use transformer::{PreTransformer, PreTransformerState};
use weights::WeightFile;

use crate::nn::conv::{CausalConvState, StreamingCausalConv1d};

/// Frames decoded per pass inside one call (bounds the activation memory: the vocoder's last
/// stage holds `96 × 1920 × frames` floats, and candle's CPU conv builds a 7× larger im2col).
/// Chunking is exact, so this only trades memory against per-pass overhead.
pub const DEFAULT_MAX_FRAMES_PER_PASS: usize = 32;

/// The Code2Wav decoder, loaded from `<checkpoint>/speech_tokenizer/{config.json,model.safetensors}`.
pub struct Code2Wav {
    config: SpeechTokenizerConfig,
    quantizer: SplitResidualVectorQuantizer,
    pre_conv: StreamingCausalConv1d,
    pre_transformer: PreTransformer,
    upsample: Vec<UpsampleStage>,
    decoder: Vocoder,
    device: Device,
    max_frames_per_pass: usize,
}

impl Code2Wav {
    /// Loads the decoder of the checkpoint directory `dir` (reads `dir/speech_tokenizer/config.json`
    /// and the `decoder.*` tensors of `dir/speech_tokenizer/model.safetensors`, as f32, onto `device`;
    /// `encoder.*` and unknown tensors are ignored).
    ///
    /// Errors: [`ModelError::Io`] (missing file), [`ModelError::Json`] / [`ModelError::Config`]
    /// (config, naming the field), [`ModelError::MissingTensor`] / [`ModelError::Shape`] (naming file
    /// and tensor).
    pub fn load(dir: &Path, device: &Device) -> Result<Self, ModelError> {
        Self::load_with_dtype(dir, device, DType::F32)
    }

    /// [`Code2Wav::load`] with an explicit compute dtype: `F32` (the default and the production
    /// setting, docs/field-lessons.md §2) or `F64` (for verification: it removes the f32 rounding
    /// noise that the vocoder amplifies, so exactness of streaming can be tested tightly).
    ///
    /// Errors as [`Code2Wav::load`], plus [`ModelError::InvalidRequest`] for any other dtype.
    pub fn load_with_dtype(dir: &Path, device: &Device, dtype: DType) -> Result<Self, ModelError> {
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(ModelError::InvalidRequest {
                field: "dtype".into(),
                value: format!("{dtype:?}"),
                msg: "the codec decoder runs in F32 (or F64 for verification)".into(),
            });
        }
        let st_dir = dir.join("speech_tokenizer");
        let config = SpeechTokenizerConfig::from_file(&st_dir.join("config.json"))?;
        let file = WeightFile::open(&st_dir.join("model.safetensors"), device, dtype)?;
        Self::from_weights(config, &file, device)
    }

    fn from_weights(
        config: SpeechTokenizerConfig,
        file: &WeightFile,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let cfg = &config.decoder_config;
        let w = file.root("decoder");
        let quantizer = SplitResidualVectorQuantizer::new(cfg, &w.pp("quantizer"))?;
        let pre_conv = causal_conv(&w.pp("pre_conv"), cfg.codebook_dim, cfg.latent_dim, 3, 1, 1)?;
        let pre_transformer = PreTransformer::new(cfg, &w.pp("pre_transformer"))?;
        let upsample = cfg
            .upsampling_ratios
            .iter()
            .enumerate()
            .map(|(i, &r)| UpsampleStage::new(cfg.latent_dim, r, &w.pp(format!("upsample.{i}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let decoder = Vocoder::new(cfg, &w.pp("decoder"))?;
        Ok(Self {
            config,
            quantizer,
            pre_conv,
            pre_transformer,
            upsample,
            decoder,
            device: device.clone(),
            max_frames_per_pass: DEFAULT_MAX_FRAMES_PER_PASS,
        })
    }

    /// Output samples per codec frame (`decode_upsample_rate`, 1920).
    pub fn samples_per_frame(&self) -> usize {
        self.config.decode_upsample_rate
    }

    /// Output sample rate in Hz (`output_sample_rate`, 24000).
    pub fn sample_rate(&self) -> u32 {
        self.config.output_sample_rate
    }

    /// Codebooks per frame (`decoder_config.num_quantizers`, 16).
    pub fn num_quantizers(&self) -> usize {
        self.config.decoder_config.num_quantizers
    }

    /// Entries per codebook (`decoder_config.codebook_size`, 2048); valid ids are `0..codebook_size`.
    pub fn codebook_size(&self) -> usize {
        self.config.decoder_config.codebook_size
    }

    /// The parsed `speech_tokenizer/config.json`.
    pub fn config(&self) -> &SpeechTokenizerConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Frames decoded per internal pass (default [`DEFAULT_MAX_FRAMES_PER_PASS`]); larger passes use
    /// more memory and fewer kernel launches. Results do not depend on it beyond f32 rounding.
    pub fn set_max_frames_per_pass(&mut self, frames: usize) {
        self.max_frames_per_pass = frames.max(1);
    }

    /// Whole decode: `codes` `[frames][num_quantizers]` → exactly `frames × samples_per_frame`
    /// samples in [-1, 1] (one single-pass decode, not the reference's 300/25 windowing).
    ///
    /// Errors: [`ModelError::InvalidRequest`] for a frame with the wrong number of codes or an id
    /// ≥ `codebook_size`; [`ModelError::Candle`] if the output is NaN/Inf.
    pub fn decode(&self, codes: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
        self.stream().decode_chunk(codes)
    }

    /// A fresh streaming decoder (no past frames) borrowing this model.
    pub fn stream(&self) -> Code2WavStream<'_> {
        Code2WavStream {
            model: self,
            state: self.init_state(),
        }
    }

    /// Stateless windowed decode (vLLM-Omni style): decodes `left_context ++ new` from scratch and
    /// returns the **last** `new.len() × samples_per_frame` samples. Approximate: it equals the
    /// exact stream only when `left_context` covers the receptive field (≈ 568 frames for the real
    /// checkpoint: 8 layers × 71 frames); see the measurements in the crate docs.
    ///
    /// Errors as [`Code2Wav::decode`] (validation covers both slices).
    pub fn decode_window(
        &self,
        left_context: &[Vec<u32>],
        new: &[Vec<u32>],
    ) -> Result<Vec<f32>, ModelError> {
        let all: Vec<Vec<u32>> = left_context.iter().chain(new).cloned().collect();
        let wav = self.decode(&all)?;
        let keep = new.len() * self.samples_per_frame();
        Ok(wav[wav.len() - keep..].to_vec())
    }

    fn init_state(&self) -> StreamState {
        StreamState {
            pre_conv: CausalConvState::default(),
            pre_transformer: self.pre_transformer.init_state(),
            upsample: vec![UpsampleState::default(); self.upsample.len()],
            decoder: self.decoder.init_state(),
        }
    }

    /// Checks every frame has `num_quantizers` ids below `codebook_size`.
    fn validate(&self, codes: &[Vec<u32>]) -> Result<(), ModelError> {
        let nq = self.num_quantizers();
        let cb = self.codebook_size();
        for (t, frame) in codes.iter().enumerate() {
            if frame.len() != nq {
                return Err(ModelError::InvalidRequest {
                    field: format!("codes[{t}].len()"),
                    value: frame.len().to_string(),
                    msg: format!("each frame needs {nq} codes (one per codebook)"),
                });
            }
            if let Some((q, &id)) = frame.iter().enumerate().find(|&(_, &id)| id as usize >= cb) {
                return Err(ModelError::InvalidRequest {
                    field: format!("codes[{t}][{q}]"),
                    value: id.to_string(),
                    msg: format!("codec ids must be < codebook_size {cb}"),
                });
            }
        }
        Ok(())
    }

    /// One pass over validated frames: `[1, 1, n × samples_per_frame]`, unclamped.
    fn forward(&self, codes: &[Vec<u32>], state: &mut StreamState) -> candle_core::Result<Tensor> {
        let x = self.quantizer.decode(codes).map_err(|e| match e {
            ModelError::Candle(c) => c,
            other => candle_core::Error::Msg(other.to_string()),
        })?;
        let x = self.pre_conv.forward(&x, &mut state.pre_conv)?; // [1, latent, n]
        let x = self.pre_transformer.forward(
            &x.transpose(1, 2)?.contiguous()?,
            &mut state.pre_transformer,
        )?;
        let mut x = x.transpose(1, 2)?.contiguous()?; // [1, latent, n]
        for (stage, s) in self.upsample.iter().zip(state.upsample.iter_mut()) {
            x = stage.forward(&x, s)?;
        }
        self.decoder.forward(&x, &mut state.decoder)
    }
}

/// All per-layer streaming state of one stream.
#[derive(Debug, Clone)]
struct StreamState {
    pre_conv: CausalConvState,
    pre_transformer: PreTransformerState,
    upsample: Vec<UpsampleState>,
    decoder: VocoderState,
}

/// An exact, stateful streaming decode over one utterance (see the module docs).
pub struct Code2WavStream<'a> {
    model: &'a Code2Wav,
    state: StreamState,
}

impl Code2WavStream<'_> {
    /// Decodes the next frames `new` `[n][num_quantizers]` → exactly `n × samples_per_frame` samples
    /// in [-1, 1]. The concatenation over any chunk schedule equals [`Code2Wav::decode`] of all
    /// frames up to f32 rounding. An empty `new` returns no samples and leaves the state unchanged.
    ///
    /// Errors: [`ModelError::InvalidRequest`] (bad codes; the state is untouched),
    /// [`ModelError::Candle`] (a tensor op failed, or NaN/Inf in the output). After a `Candle`
    /// error the stream state is undefined: call [`Code2WavStream::reset`].
    pub fn decode_chunk(&mut self, new: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
        let model = self.model;
        model.validate(new)?;
        let spf = model.samples_per_frame();
        let mut out = Vec::with_capacity(new.len() * spf);
        for (i, pass) in new.chunks(model.max_frames_per_pass).enumerate() {
            let wav = model
                .forward(pass, &mut self.state)?
                .flatten_all()?
                .to_dtype(DType::F32)?;
            let wav: Vec<f32> = wav.to_vec1()?;
            if wav.len() != pass.len() * spf {
                return Err(candle_core::Error::Msg(format!(
                    "code2wav produced {} samples for {} frames, expected {}",
                    wav.len(),
                    pass.len(),
                    pass.len() * spf
                ))
                .into());
            }
            if let Some(j) = wav.iter().position(|v| !v.is_finite()) {
                let frame = i * model.max_frames_per_pass + j / spf;
                return Err(candle_core::Error::Msg(format!(
                    "code2wav output is not finite ({}) at sample {j} of the pass starting at frame {} \
                     of this chunk (frame {frame})",
                    wav[j],
                    i * model.max_frames_per_pass
                ))
                .into());
            }
            out.extend(wav.into_iter().map(|v| v.clamp(-1.0, 1.0)));
        }
        Ok(out)
    }

    /// Frames decoded since the stream started (or was reset).
    pub fn frames_decoded(&self) -> usize {
        self.state.pre_transformer.position()
    }

    /// Forgets all past frames: the next chunk starts a new utterance.
    pub fn reset(&mut self) {
        self.state = self.model.init_state();
    }
}
