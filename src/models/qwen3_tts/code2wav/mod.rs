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
//! decoding share one code path. [`Code2Wav::decode_chunks`] decodes the chunks of several streams
//! in shared batched passes (batch.rs); `decode_chunk` is its batch of one.
//!
//! Reference: `Qwen3TTSTokenizerV2Decoder` in
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`. Note that the reference's
//! `Qwen3TTSTokenizer.decode` decodes in windows of 300 frames with 25 frames of left context
//! (`chunked_decode`); that is [`Code2Wav::decode_window`], not [`Code2Wav::decode`], and the two
//! differ beyond 300 frames.

mod batch;
mod config;
mod decoder;
mod first_frame;
mod quantizer;
mod transformer;

use std::path::Path;
use std::sync::Mutex;

use candle_core::{DType, Device, Tensor};

pub use super::ModelError;
pub use config::{DecoderConfig, SpeechTokenizerConfig};

use batch::{BatchState, stack_field};
use decoder::{UpsampleStage, UpsampleState, Vocoder, VocoderState, causal_conv};
use first_frame::FirstFrameGraph;
use quantizer::SplitResidualVectorQuantizer;
use transformer::{PreTransformer, PreTransformerState};

use crate::nn::Weights;
use crate::nn::conv::{CausalConvState, StreamingCausalConv1d};

/// Frames decoded per pass inside one call (bounds the activation memory: the vocoder's last
/// stage holds `96 × 1920 × frames` floats, and candle's CPU conv builds a 7× larger im2col).
/// Chunking is exact, so this only trades memory against per-pass overhead.
pub const DEFAULT_MAX_FRAMES_PER_PASS: usize = 32;

/// Most frames (streams × frames) one batched pass of [`Code2Wav::decode_chunks`] decodes; more
/// streams with passes of the same length run in several passes. Bounds the activation memory as
/// [`DEFAULT_MAX_FRAMES_PER_PASS`] does for one stream: a pass holds at most two streams' worth of
/// it, so streams that start together (and so decode in the same passes) cost little more than
/// one. On the CPU the decoder's cost is its per-frame arithmetic, which larger passes do not
/// lower.
pub const DEFAULT_MAX_BATCH_FRAMES: usize = 2 * DEFAULT_MAX_FRAMES_PER_PASS;

/// [`DEFAULT_MAX_BATCH_FRAMES`] on a CUDA device: a pass costs about the same launches whatever
/// its rows (thousands of small kernels), so many streams' chunks go through in few passes (64
/// streams' 25-frame chunks in 4 passes instead of 13). A pass of this many frames holds a few GB
/// of activations: the last stage's `96 × 1920` f32 a frame (0.38 GB for the pass) several times,
/// and the last convolution's 7-tap im2col (2.6 GB).
pub const GPU_MAX_BATCH_FRAMES: usize = 16 * DEFAULT_MAX_FRAMES_PER_PASS;

/// Window size of the reference's offline decode (`Qwen3TTSTokenizer.decode` → `chunked_decode`).
pub const REFERENCE_CHUNK_FRAMES: usize = 300;
/// Left context of each window of the reference's offline decode.
pub const REFERENCE_LEFT_CONTEXT_FRAMES: usize = 25;

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
    max_batch_frames: usize,
    /// A fresh stream's one-frame first chunk ([`Code2Wav::enable_first_frame_graph`]).
    first_frame: Option<Mutex<FirstFrameGraph>>,
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
    /// setting, docs/field-lessons.md §2), `BF16` (weights and activations in bfloat16 for
    /// tensor-core convolutions on CUDA; SnakeBeta, the norms and the softmax compute in f32 inside
    /// and round once; within a measured bound of f32, docs/cuda.md "Code2Wav in reduced
    /// precision"), or `F64` (for verification: it removes the f32 rounding noise that the vocoder
    /// amplifies, so exactness of streaming can be tested tightly). The samples are f32 in every
    /// case.
    ///
    /// Errors as [`Code2Wav::load`], plus [`ModelError::InvalidRequest`] for any other dtype.
    pub fn load_with_dtype(dir: &Path, device: &Device, dtype: DType) -> Result<Self, ModelError> {
        if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16) {
            return Err(ModelError::InvalidRequest {
                field: "dtype".into(),
                value: format!("{dtype:?}"),
                msg: "the codec decoder runs in F32 (BF16 on CUDA, F64 for verification)".into(),
            });
        }
        let st_dir = dir.join("speech_tokenizer");
        let config = SpeechTokenizerConfig::from_file(&st_dir.join("config.json"))?;
        let file = st_dir.join("model.safetensors");
        if let Err(source) = std::fs::metadata(&file) {
            return Err(ModelError::Io { path: file, source });
        }
        let w = Weights::from_files(std::slice::from_ref(&file), &file, device, dtype)?;
        Self::from_weights(config, &w.pp("decoder"), device)
    }

    /// Builds the decoder from the weights at `w` (the `decoder` prefix).
    fn from_weights(
        config: SpeechTokenizerConfig,
        w: &Weights,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let cfg = &config.decoder_config;
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
            max_batch_frames: if device.is_cuda() {
                GPU_MAX_BATCH_FRAMES
            } else {
                DEFAULT_MAX_BATCH_FRAMES
            },
            first_frame: None,
        })
    }

    /// Captures the CUDA graph of a fresh stream's one-frame first chunk (first_frame.rs):
    /// afterwards [`Code2Wav::decode_chunks`] decodes such a chunk with one graph launch, the
    /// audio the same. Errors: not a CUDA device, a build without `cuda`, a failed capture
    /// (nothing changes then).
    pub fn enable_first_frame_graph(&mut self) -> Result<(), ModelError> {
        let mut g = FirstFrameGraph::new(self)?;
        g.capture(self)?;
        self.first_frame = Some(Mutex::new(g));
        Ok(())
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

    /// Most frames, over all its streams, one batched pass of [`Code2Wav::decode_chunks`] decodes
    /// (default [`DEFAULT_MAX_BATCH_FRAMES`], [`GPU_MAX_BATCH_FRAMES`] on CUDA; at least one stream's pass always runs). Results do
    /// not depend on it.
    pub fn set_max_batch_frames(&mut self, frames: usize) {
        self.max_batch_frames = frames.max(1);
    }

    /// Frames (rows × frames) one batched pass of [`Code2Wav::decode_chunks`] takes at most.
    pub fn max_batch_frames(&self) -> usize {
        self.max_batch_frames
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
            replay: Vec::new(),
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

    /// The reference's offline decode (`Qwen3TTSTokenizerV2Decoder.chunked_decode`, called by
    /// `Qwen3TTSTokenizer.decode` with `chunk_frames` 300 and `left_context_frames` 25): windows of
    /// `chunk_frames` new frames, each decoded with up to `left_context_frames` frames before it
    /// ([`Code2Wav::decode_window`]). Equals [`Code2Wav::decode`] up to `chunk_frames` frames and
    /// differs after; use it to reproduce the official waveform of a long utterance.
    ///
    /// Errors as [`Code2Wav::decode`]; `chunk_frames` 0 is an [`ModelError::InvalidRequest`].
    pub fn decode_chunked(
        &self,
        codes: &[Vec<u32>],
        chunk_frames: usize,
        left_context_frames: usize,
    ) -> Result<Vec<f32>, ModelError> {
        if chunk_frames == 0 {
            return Err(ModelError::InvalidRequest {
                field: "chunk_frames".into(),
                value: "0".into(),
                msg: "must be at least 1".into(),
            });
        }
        let mut wav = Vec::with_capacity(codes.len() * self.samples_per_frame());
        for start in (0..codes.len()).step_by(chunk_frames) {
            let end = (start + chunk_frames).min(codes.len());
            let context = start.saturating_sub(left_context_frames);
            wav.extend(self.decode_window(&codes[context..start], &codes[start..end])?);
        }
        Ok(wav)
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

    /// One pass over validated frames, one row per stream, all rows of equal length `n`, with the
    /// stacked `state` of those streams: `[rows, 1, n × samples_per_frame]`, unclamped.
    fn forward(
        &self,
        rows: &[&[Vec<u32>]],
        state: &mut StreamState,
    ) -> candle_core::Result<Tensor> {
        let x = self.quantizer.decode(rows).map_err(|e| match e {
            ModelError::Candle(c) => c,
            other => candle_core::Error::Msg(other.to_string()),
        })?;
        self.forward_latent(x, state)
    }

    /// [`Code2Wav::forward`] after the quantizer: `x` `[rows, codebook_dim, n]`.
    fn forward_latent(&self, x: Tensor, state: &mut StreamState) -> candle_core::Result<Tensor> {
        let x = self.pre_conv.forward(&x, &mut state.pre_conv)?; // [rows, latent, n]
        let x = self.pre_transformer.forward(
            &x.transpose(1, 2)?.contiguous()?,
            &mut state.pre_transformer,
        )?;
        let mut x = x.transpose(1, 2)?.contiguous()?; // [rows, latent, n]
        for (stage, s) in self.upsample.iter().zip(state.upsample.iter_mut()) {
            x = stage.forward(&x, s)?;
        }
        self.decoder.forward(&x, &mut state.decoder)
    }
}

/// All per-layer streaming state of one stream, or of several stacked for a batched pass.
#[derive(Debug, Clone)]
struct StreamState {
    pre_conv: CausalConvState,
    pre_transformer: PreTransformerState,
    upsample: Vec<UpsampleState>,
    decoder: VocoderState,
}

impl BatchState for StreamState {
    fn stack(states: &[&Self]) -> candle_core::Result<Self> {
        Ok(Self {
            pre_conv: stack_field(states, |s| &s.pre_conv)?,
            pre_transformer: stack_field(states, |s| &s.pre_transformer)?,
            upsample: stack_field(states, |s| &s.upsample)?,
            decoder: stack_field(states, |s| &s.decoder)?,
        })
    }

    fn split(self, rows: usize) -> candle_core::Result<Vec<Self>> {
        let pre_conv = self.pre_conv.split(rows)?;
        let pre_transformer = self.pre_transformer.split(rows)?;
        let upsample = BatchState::split(self.upsample, rows)?;
        let decoder = self.decoder.split(rows)?;
        Ok(pre_conv
            .into_iter()
            .zip(pre_transformer)
            .zip(upsample)
            .zip(decoder)
            .map(|(((pre_conv, pre_transformer), upsample), decoder)| Self {
                pre_conv,
                pre_transformer,
                upsample,
                decoder,
            })
            .collect())
    }
}

/// An exact, stateful streaming decode over one utterance (see the module docs). A clone is an
/// independent stream that continues from the same point (the state's tensors are shared until
/// the next chunk replaces them).
#[derive(Clone)]
pub struct Code2WavStream<'a> {
    model: &'a Code2Wav,
    state: StreamState,
    /// Frames whose audio is out but which `state` has not seen yet (a first chunk decoded on
    /// the first-frame graph): the next chunk is decoded with them in front, their samples
    /// dropped.
    replay: Vec<Vec<u32>>,
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
        model
            .decode_chunks(&mut [self], &[new])
            .pop()
            .unwrap_or_else(|| Err(candle_core::Error::Msg("code2wav: no result".into()).into()))
    }

    /// Frames decoded since the stream started (or was reset).
    pub fn frames_decoded(&self) -> usize {
        self.state.pre_transformer.position() + self.replay.len()
    }

    /// Forgets all past frames: the next chunk starts a new utterance.
    pub fn reset(&mut self) {
        self.state = self.model.init_state();
        self.replay.clear();
    }

    /// Whether nothing has been decoded since the stream started (or was reset).
    fn is_fresh(&self) -> bool {
        self.frames_decoded() == 0
    }
}
