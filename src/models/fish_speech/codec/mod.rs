//! The S2 codec, a modified DAC (`codec.pth`): 44.1 kHz mono, 2048 samples a frame (~21.5 frames
//! a second), 10 codebooks a frame (one semantic of 4096 entries, nine residual of 1024).
//! Everything is causal, so decoding a stream chunk by chunk with [`DecodeState`] gives the
//! samples of decoding it whole (up to float rounding): exactly `frames × 2048` samples.
//!
//! [`quantizer`]: codes ↔ latent; [`decoder`]: latent → waveform; [`encoder`]: waveform →
//! latent (voice cloning); [`transformer`]: the windowed transformer on both sides of the
//! quantizer; [`weights`]: `codec.pth` with weight norm folded; [`config`]: its dimensions.

pub mod config;
pub mod decoder;
pub mod encoder;
pub mod layers;
pub mod quantizer;
pub mod transformer;
pub mod weights;

use std::path::Path;

use candle_core::{DType, Device, Tensor};

pub use config::CodecConfig;
use decoder::{Decoder, DecoderState};
use encoder::Encoder;
use quantizer::{Quantizer, QuantizerState};
use weights::CodecWeights;

use super::error::{FishError, Result};
use super::prompt::Codes;

/// The exact streaming state of one decoded stream.
#[derive(Debug, Clone, Default)]
pub struct DecodeState {
    quantizer: QuantizerState,
    decoder: DecoderState,
    frames: usize,
}

impl DecodeState {
    /// Frames decoded so far.
    pub fn frames(&self) -> usize {
        self.frames
    }
}

/// The codec's weights (f32).
#[derive(Debug, Clone)]
pub struct Codec {
    pub config: CodecConfig,
    quantizer: Quantizer,
    decoder: Decoder,
    encoder: Encoder,
    device: Device,
}

impl Codec {
    /// Loads `dir/codec.pth` with `dir/codec_config.yaml` (or S2 Pro's dimensions). Errors:
    /// the config's or the weights' file; a missing tensor or one of another shape names
    /// `codec.pth`, and says when S2 Pro's dimensions were assumed for want of the config.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        let config = CodecConfig::load(dir)?;
        let w = CodecWeights::load(&dir.join("codec.pth"), device)?;
        let parts = (|| {
            Ok((
                Quantizer::new(&w, &config)?,
                Decoder::new(&w, &config)?,
                Encoder::new(&w, &config)?,
            ))
        })();
        let assumed = !dir.join(CodecConfig::FILE).exists();
        let (quantizer, decoder, encoder) = parts.map_err(|e| match e {
            FishError::Checkpoint { file, msg } if assumed => FishError::Checkpoint {
                file,
                msg: format!(
                    "{msg} (there is no {} beside it, so S2 Pro's codec dimensions were \
                     assumed)",
                    CodecConfig::FILE
                ),
            },
            e => e,
        })?;
        Ok(Self {
            quantizer,
            decoder,
            encoder,
            config,
            device: device.clone(),
        })
    }

    /// Output sample rate (44100).
    pub fn sample_rate(&self) -> u32 {
        self.config.sample_rate
    }

    /// Samples a frame (2048).
    pub fn samples_per_frame(&self) -> usize {
        self.config.samples_per_frame()
    }

    fn codes_tensor(&self, codes: &Codes) -> Result<Tensor> {
        let n = self.config.num_codebooks();
        let t = codes.first().map_or(0, Vec::len);
        if codes.len() != n || codes.iter().any(|c| c.len() != t) {
            return Err(FishError::InvalidRequest {
                field: "codes",
                msg: format!("expected {n} codebooks of equal length"),
            });
        }
        let flat: Vec<u32> = codes.iter().flatten().copied().collect();
        Ok(Tensor::from_vec(flat, (1, n, t), &self.device)?)
    }

    /// Decodes `codes` `[10][frames]` whole: `frames × 2048` samples.
    pub fn decode(&self, codes: &Codes) -> Result<Vec<f32>> {
        self.decode_chunk(codes, &mut DecodeState::default())
    }

    /// Decodes the next chunk of a stream; the chunks' samples, concatenated, are the whole
    /// decode's.
    pub fn decode_chunk(&self, codes: &Codes, state: &mut DecodeState) -> Result<Vec<f32>> {
        let frames = codes.first().map_or(0, Vec::len);
        if frames == 0 {
            return Ok(Vec::new());
        }
        let z = self
            .quantizer
            .decode(&self.codes_tensor(codes)?, &mut state.quantizer)?;
        let y = self.decoder.forward(&z, &mut state.decoder)?;
        state.frames += frames;
        Ok(y.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?)
    }

    /// Decodes the next chunk of several streams: `chunks[i]` `[10][frames_i]` on `states[i]`.
    /// The quantizer half runs once over the streams whose chunks have the same length and
    /// whose post transformers the same window fill ([`QuantizerState::fill`]); the waveform
    /// decoder then runs once over the streams whose chunks have the same length; both in
    /// passes of at most `max_batch_frames` frames (rows × frames), the states stacked along
    /// the batch ([`DecoderState::stack`]). Rows never mix: each computes what its stream
    /// computes alone (on the CPU to the bit, the products run row by row; on CUDA one product
    /// for all rows, within float rounding). Returns per stream what
    /// `decode_chunk(chunks[i], states[i])` returns. Errors, per stream: bad codes (that stream
    /// only, its state untouched), or a failed pass (every stream in it; their states are then
    /// undefined).
    pub fn decode_chunks(
        &self,
        chunks: &[&Codes],
        states: &mut [&mut DecodeState],
        max_batch_frames: usize,
    ) -> Vec<Result<Vec<f32>>> {
        let mut out: Vec<Option<Result<Vec<f32>>>> = chunks.iter().map(|_| None).collect();
        // The quantizer half, by chunk length and window fill; the latents wait by chunk length.
        let mut by_fill: std::collections::BTreeMap<(usize, usize), Vec<(usize, Tensor)>> =
            Default::default();
        for (i, (codes, state)) in chunks.iter().zip(states.iter()).enumerate() {
            let frames = codes.first().map_or(0, Vec::len);
            if frames == 0 {
                out[i] = Some(Ok(Vec::new()));
                continue;
            }
            match self.codes_tensor(codes) {
                Ok(c) => {
                    let fill = state.quantizer.fill(&self.quantizer);
                    by_fill.entry((frames, fill)).or_default().push((i, c));
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let mut by_len: std::collections::BTreeMap<usize, Vec<(usize, Tensor)>> =
            Default::default();
        for ((frames, _), rows) in by_fill {
            let per_pass = (max_batch_frames / frames).max(1);
            for pass in rows.chunks(per_pass) {
                // `pass` is in increasing stream order (built so above), as the states picked
                // below are: row r of the codes is the r-th picked state.
                debug_assert!(pass.windows(2).all(|w| w[0].0 < w[1].0));
                let run = |states: &mut [&mut DecodeState]| -> Result<Tensor> {
                    let codes = Tensor::cat(&pass.iter().map(|(_, c)| c).collect::<Vec<_>>(), 0)?;
                    let mut qs: Vec<&mut QuantizerState> = states
                        .iter_mut()
                        .enumerate()
                        .filter(|(i, _)| pass.iter().any(|(j, _)| j == i))
                        .map(|(_, s)| &mut s.quantizer)
                        .collect();
                    self.quantizer.decode_rows(&codes, &mut qs)
                };
                match run(states) {
                    Ok(z) => {
                        for (r, (i, _)) in pass.iter().enumerate() {
                            match z.narrow(0, r, 1) {
                                Ok(zr) => by_len.entry(frames).or_default().push((*i, zr)),
                                Err(e) => out[*i] = Some(Err(e.into())),
                            }
                        }
                    }
                    Err(e) => {
                        let msg =
                            format!("batched quantizer decode of {} streams: {e}", pass.len());
                        for (i, _) in pass {
                            out[*i] =
                                Some(Err(FishError::Candle(candle_core::Error::Msg(msg.clone()))));
                        }
                    }
                }
            }
        }
        let blocks = self.decoder.blocks();
        for (frames, rows) in by_len {
            let per_pass = (max_batch_frames / frames).max(1);
            for pass in rows.chunks(per_pass) {
                let mut run = || -> Result<Vec<Vec<f32>>> {
                    let z = Tensor::cat(&pass.iter().map(|(_, z)| z).collect::<Vec<_>>(), 0)?;
                    let parts: Vec<&DecoderState> =
                        pass.iter().map(|(i, _)| &states[*i].decoder).collect();
                    let mut stacked = DecoderState::stack(&parts, blocks)?;
                    let y = self.decoder.forward(&z, &mut stacked)?;
                    for ((i, _), s) in pass.iter().zip(stacked.split(pass.len())?) {
                        states[*i].decoder = s;
                        states[*i].frames += frames;
                    }
                    let y = y.flatten_from(1)?.to_dtype(DType::F32)?;
                    Ok(y.to_vec2()?)
                };
                match run() {
                    Ok(audio) => {
                        for ((i, _), a) in pass.iter().zip(audio) {
                            out[*i] = Some(Ok(a));
                        }
                    }
                    Err(e) => {
                        let msg = format!("batched decode of {} streams: {e}", pass.len());
                        for (i, _) in pass {
                            out[*i] =
                                Some(Err(FishError::Candle(candle_core::Error::Msg(msg.clone()))));
                        }
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Ok(Vec::new())))
            .collect()
    }

    /// Encodes mono audio at [`Self::sample_rate`]: padded with zeros to a whole frame,
    /// `⌈samples / 2048⌉` frames of codes `[10][frames]`.
    pub fn encode(&self, audio: &[f32]) -> Result<Codes> {
        if audio.is_empty() {
            return Err(FishError::InvalidRequest {
                field: "reference audio",
                msg: "empty".into(),
            });
        }
        let spf = self.samples_per_frame();
        let frames = audio.len().div_ceil(spf);
        let mut padded = audio.to_vec();
        padded.resize(frames * spf, 0.0);
        let x = Tensor::from_vec(padded, (1, 1, frames * spf), &self.device)?;
        let z = self.encoder.forward(&x)?;
        let codes = self.quantizer.encode(&z)?.squeeze(0)?; // [10, frames']
        let codes = codes.narrow(1, 0, frames.min(codes.dim(1)?))?;
        Ok(codes.to_dtype(DType::U32)?.to_vec2()?)
    }
}
