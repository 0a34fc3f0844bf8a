//! Fish S2 Pro's stage 1 through the model seam: the codec decoder ([`FishDecoder`]) as a
//! [`Stage1Model`], exact streaming with [`DecodeState`] (any chunking gives the whole decode's
//! `frames × 2048` samples). `decode_chunks` runs the quantizer half once over the streams whose
//! chunks have the same length and window fill, and the waveform decoder once over the streams
//! whose chunks have the same length ([`Codec::decode_chunks`]: each row as its stream alone); the
//! codec runs in f32 whatever the stage config's dtype.

use crate::models::tts::chunk_count_mismatch;
use std::path::Path;

use candle_core::Device;

use super::codec::{Codec, DecodeState};
use super::stage0::transpose;
use crate::models::tts::{ModelError, Stage1Model, Stage1Options, Stage1Stream};

/// Frames one pass decodes at most by default.
const DEFAULT_MAX_BATCH_FRAMES: usize = 512;

/// The S2 codec's decoder half (the encoder is loaded with it and unused here).
pub struct FishDecoder {
    codec: Codec,
    max_batch_frames: usize,
}

impl FishDecoder {
    /// The codec.
    pub fn codec(&self) -> &Codec {
        &self.codec
    }

    /// A chunk `[frames][codebooks]` as the codec's codes `[codebooks][frames]`. Errors for a
    /// frame of another width.
    fn checked_codes(&self, frames: &[Vec<u32>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let n = self.codec.config.num_codebooks();
        if let Some((i, f)) = frames.iter().enumerate().find(|(_, f)| f.len() != n) {
            return Err(ModelError::InvalidRequest {
                field: "frames".into(),
                value: format!("frame {i}: {} codes", f.len()),
                msg: format!("every frame needs {n} codes"),
            });
        }
        Ok(transpose(frames))
    }

    /// Checks a chunk `[frames][codebooks]` and decodes it on `state`.
    fn decode_on(
        &self,
        frames: &[Vec<u32>],
        state: &mut DecodeState,
    ) -> Result<Vec<f32>, ModelError> {
        Ok(self
            .codec
            .decode_chunk(&self.checked_codes(frames)?, state)?)
    }
}

impl Stage1Model for FishDecoder {
    const REFERENCE_CONTEXT: bool = false;
    const NAME: &'static str = "fish_codec";
    type Stream<'c> = FishStream<'c>;

    /// Loads `dir/codec.pth` (with `codec_config.yaml` when present) in f32.
    fn load(dir: &Path, device: &Device, _opts: &Stage1Options) -> Result<Self, ModelError> {
        Ok(FishDecoder {
            codec: Codec::load(dir, device)?,
            max_batch_frames: DEFAULT_MAX_BATCH_FRAMES,
        })
    }

    fn sample_rate(&self) -> u32 {
        self.codec.sample_rate()
    }

    fn samples_per_frame(&self) -> usize {
        self.codec.samples_per_frame()
    }

    fn num_codebooks(&self) -> usize {
        self.codec.config.num_codebooks()
    }

    fn max_batch_frames(&self) -> usize {
        self.max_batch_frames
    }

    fn set_max_batch_frames(&mut self, frames: usize) {
        self.max_batch_frames = frames.max(1);
    }

    fn stream(&self) -> FishStream<'_> {
        FishStream {
            decoder: self,
            state: DecodeState::default(),
        }
    }

    fn decode_chunks<'c>(
        &'c self,
        streams: &mut [&mut FishStream<'c>],
        chunks: &[&[Vec<u32>]],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        if let Some(errors) = chunk_count_mismatch(streams.len(), chunks.len()) {
            return errors;
        }
        let mut out: Vec<Option<Result<Vec<f32>, ModelError>>> =
            streams.iter().map(|_| None).collect();
        let mut codes = Vec::with_capacity(streams.len());
        let mut states = Vec::with_capacity(streams.len());
        let mut rows = Vec::with_capacity(streams.len());
        for (i, (s, c)) in streams.iter_mut().zip(chunks).enumerate() {
            if !std::ptr::eq(s.decoder, self) {
                out[i] = Some(Err(ModelError::InvalidRequest {
                    field: "streams".into(),
                    value: format!("stream {i}"),
                    msg: "a stream of another decoder".into(),
                }));
                continue;
            }
            match self.checked_codes(c) {
                Ok(k) => {
                    codes.push(k);
                    states.push(&mut s.state);
                    rows.push(i);
                }
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        let refs: Vec<&Vec<Vec<u32>>> = codes.iter().collect();
        let decoded = self
            .codec
            .decode_chunks(&refs, &mut states, self.max_batch_frames);
        for (i, r) in rows.into_iter().zip(decoded) {
            out[i] = Some(r.map_err(ModelError::from));
        }
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(ModelError::Candle(candle_core::Error::Msg(
                        "stream without a result".into(),
                    )))
                })
            })
            .collect()
    }

    fn decode_window(
        &self,
        context: &[Vec<u32>],
        frames: &[Vec<u32>],
    ) -> Result<Vec<f32>, ModelError> {
        let all: Vec<Vec<u32>> = context.iter().chain(frames).cloned().collect();
        let wav = self.decode_on(&all, &mut DecodeState::default())?;
        let keep = frames.len() * self.samples_per_frame();
        Ok(wav[wav.len().saturating_sub(keep)..].to_vec())
    }
}

/// One utterance's exact decoder state.
pub struct FishStream<'c> {
    decoder: &'c FishDecoder,
    state: DecodeState,
}

impl Stage1Stream for FishStream<'_> {
    fn decode_chunk(&mut self, frames: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
        self.decoder.decode_on(frames, &mut self.state)
    }
}
