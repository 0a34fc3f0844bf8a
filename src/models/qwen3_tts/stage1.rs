//! Qwen3-TTS's stage 1 through the model seam: [`Code2Wav`] as a [`Stage1Model`], its
//! [`Code2WavStream`] as the exact stream.

use std::path::Path;

use candle_core::Device;

use super::code2wav::{Code2Wav, Code2WavStream};
use crate::models::tts::{ModelError, Stage1Model, Stage1Options, Stage1Stream};

impl Stage1Model for Code2Wav {
    const REFERENCE_CONTEXT: bool = true;
    const NAME: &'static str = "code2wav";
    type Stream<'c> = Code2WavStream<'c>;

    fn load(dir: &Path, device: &Device, opts: &Stage1Options) -> Result<Self, ModelError> {
        Code2Wav::load_with_dtype(dir, device, opts.dtype)
    }

    fn sample_rate(&self) -> u32 {
        Code2Wav::sample_rate(self)
    }

    fn samples_per_frame(&self) -> usize {
        Code2Wav::samples_per_frame(self)
    }

    fn num_codebooks(&self) -> usize {
        self.num_quantizers()
    }

    fn max_batch_frames(&self) -> usize {
        Code2Wav::max_batch_frames(self)
    }

    fn set_max_batch_frames(&mut self, frames: usize) {
        Code2Wav::set_max_batch_frames(self, frames)
    }

    fn enable_cuda_graphs(&mut self) -> Result<bool, ModelError> {
        if !crate::nn::switches::Switches::get().decoder_first_graph {
            return Ok(false);
        }
        self.enable_first_frame_graph()?;
        Ok(true)
    }

    fn stream(&self) -> Code2WavStream<'_> {
        Code2Wav::stream(self)
    }

    fn decode_chunks<'c>(
        &'c self,
        streams: &mut [&mut Code2WavStream<'c>],
        chunks: &[&[Vec<u32>]],
    ) -> Vec<Result<Vec<f32>, ModelError>> {
        Code2Wav::decode_chunks(self, streams, chunks)
    }

    fn decode_window(
        &self,
        context: &[Vec<u32>],
        frames: &[Vec<u32>],
    ) -> Result<Vec<f32>, ModelError> {
        Code2Wav::decode_window(self, context, frames)
    }
}

impl Stage1Stream for Code2WavStream<'_> {
    fn decode_chunk(&mut self, frames: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
        Code2WavStream::decode_chunk(self, frames)
    }
}
