//! A fresh stream's one-frame first chunk on a CUDA graph ([`FirstFrameGraph`]).
//!
//! With the chunk ramp, every request's first chunk is one frame decoded from a fresh state:
//! always the same shapes and the same work, a few hundred small kernels (the quantizer, the
//! pre-transformer's eight layers, the upsampling and the vocoder) whose launches take several
//! times their GPU time. Captured once, the decode is one graph launch (1.46 against 2.61 ms
//! eager for f32 on an H100; on by default, `OMNITTS_DECODER_FIRST_GRAPH=0` turns it off;
//! docs/cuda.md, "The first chunk on a graph, and arrivals after a step alone").
//!
//! The graph computes the audio only: its state after the frame lives in graph memory and is not
//! kept. The stream instead remembers the frame ([`super::Code2WavStream`]'s `replay`), and its
//! next chunk is decoded with that frame in front of it, whose samples are dropped: the state is
//! then the one an eager decode of the frames would have, so streaming stays exact (the chunk
//! schedule changes, which streaming does not see beyond rounding).
//!
//! Without a capture (no CUDA device, a build without `cuda`, a failed capture) the same work
//! runs directly, which is how the CPU tests check it.

use candle_core::{DType, Result, Tensor};

use super::Code2Wav;

/// The captured one-frame decode and its static input and output.
pub(crate) struct FirstFrameGraph {
    /// The frame's codes as rows of the quantizer's table (`q × codebook_size + id`),
    /// `[num_quantizers]` u32.
    ids: Tensor,
    /// The frame's samples, unclamped, `[1, 1, samples_per_frame]` f32.
    out: Tensor,
    #[cfg(feature = "cuda")]
    graph: Option<crate::nn::cuda_graph::Graph>,
}

impl std::fmt::Debug for FirstFrameGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FirstFrameGraph")
            .field("captured", &self.captured())
            .finish()
    }
}

impl FirstFrameGraph {
    /// The static tensors for `c2w`, on its device; nothing captured yet.
    pub(crate) fn new(c2w: &Code2Wav) -> Result<Self> {
        let dev = c2w.device();
        Ok(Self {
            ids: Tensor::zeros(c2w.num_quantizers(), DType::U32, dev)?,
            out: Tensor::zeros((1, 1, c2w.samples_per_frame()), DType::F32, dev)?,
            #[cfg(feature = "cuda")]
            graph: None,
        })
    }

    /// Whether the decode replays a captured graph (else it runs directly).
    pub(crate) fn captured(&self) -> bool {
        #[cfg(feature = "cuda")]
        {
            self.graph.is_some()
        }
        #[cfg(not(feature = "cuda"))]
        {
            false
        }
    }

    /// Captures the graph after one direct run under the parameter upload cache. Errors: not a
    /// CUDA device, a build without `cuda`, a failed capture (the decode then runs directly).
    pub(crate) fn capture(&mut self, c2w: &Code2Wav) -> Result<()> {
        #[cfg(feature = "cuda")]
        {
            use crate::nn::cuda_graph::{Graph, htod_cache};
            let dev = c2w.device().clone();
            if !dev.is_cuda() {
                candle_core::bail!("CUDA graphs need a CUDA device, Code2Wav is on {dev:?}");
            }
            let _htod = htod_cache(&dev)?;
            self.run(c2w)?;
            dev.synchronize()?;
            let graph = Graph::capture(&dev, || self.run(c2w))?;
            dev.synchronize()?;
            self.graph = Some(graph);
            Ok(())
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = c2w;
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }

    /// Decodes one validated `frame` (`num_quantizers` ids) from a fresh state: its
    /// `samples_per_frame` samples, unclamped, as a fresh stream's `decode_chunk(&[frame])`
    /// computes them.
    pub(crate) fn decode(&mut self, c2w: &Code2Wav, frame: &[u32]) -> Result<Vec<f32>> {
        let ids = c2w.quantizer.table_rows(&[&[frame.to_vec()]]);
        let ids = Tensor::from_vec(ids, frame.len(), c2w.device())?;
        self.ids.slice_set(&ids, 0, 0)?;
        self.launch(c2w)?;
        crate::nn::readback::to_vec::<f32>(&self.out)
    }

    fn launch(&mut self, c2w: &Code2Wav) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(g) = &self.graph {
            return g.launch();
        }
        self.run(c2w)
    }

    /// The captured work: the frame of `ids` through every layer from a fresh state into `out`.
    fn run(&mut self, c2w: &Code2Wav) -> Result<()> {
        let x = c2w.quantizer.decode_rows(&self.ids, 1, 1)?;
        let mut state = c2w.init_state();
        let wav = c2w.forward_latent(x, &mut state)?;
        self.out.slice_set(&wav.to_dtype(DType::F32)?, 2, 0)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Mutex;

    use candle_core::{DType, Device};

    use super::*;
    use crate::models::qwen3_tts::code2wav::Code2WavStream;
    use crate::models::tts::ModelError;

    /// The tiny checkpoint's decoder in `dtype`, with the first-frame path on (uncaptured on the
    /// CPU: the graph's work runs directly) when `first_frame`.
    fn decoder(dtype: DType, first_frame: bool) -> Code2Wav {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        let mut c2w = Code2Wav::load_with_dtype(&dir, &Device::Cpu, dtype).expect("load");
        if first_frame {
            let g = FirstFrameGraph::new(&c2w).expect("static tensors");
            assert!(!g.captured());
            c2w.first_frame = Some(Mutex::new(g));
        }
        c2w
    }

    /// `frames` frames of pseudo-random valid codes (xorshift from `seed`).
    fn codes(c2w: &Code2Wav, frames: usize, seed: u64) -> Vec<Vec<u32>> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..frames)
            .map(|_| {
                (0..c2w.num_quantizers())
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        (s % c2w.codebook_size() as u64) as u32
                    })
                    .collect()
            })
            .collect()
    }

    fn max_abs(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The chunks after a one-frame first chunk as the default ramp cuts them (each as long as
    /// the frames before it: 1, 2, 4, then 8s), over the `frames` after the first: the second
    /// chunk is one frame, decoded right after the replayed first frame.
    fn ramp(frames: usize) -> Vec<usize> {
        let mut out = Vec::new();
        let mut done = 0;
        while done < frames {
            let n = (1 + done).min(8).min(frames - done);
            out.push(n);
            done += n;
        }
        out
    }

    #[test]
    fn a_first_frame_on_the_graph_path_is_the_eager_first_frame_and_the_stream_stays_exact() {
        for dtype in [DType::F32, DType::F64] {
            let tol = if dtype == DType::F64 { 1e-9 } else { 1e-4 };
            let eager = decoder(dtype, false);
            let fast = decoder(dtype, true);
            let all = codes(&eager, 40, 7);
            let whole = eager.decode(&all).expect("whole");
            // The one-frame first chunk: the same samples as the eager decode of that frame.
            let alone = eager.decode(&all[..1]).expect("eager frame");
            let mut s = fast.stream();
            let first = s.decode_chunk(&all[..1]).expect("graph frame");
            assert_eq!(first.len(), fast.samples_per_frame());
            let d = max_abs(&first, &alone);
            assert!(d <= tol, "{dtype:?}: first frame: max abs diff {d:e}");
            assert_eq!(s.replay.len(), 1, "the frame is kept to replay");
            assert_eq!(s.frames_decoded(), 1);
            // An empty chunk changes nothing; a bad one is refused and leaves the stream.
            assert!(s.decode_chunk(&[]).expect("empty").is_empty());
            let mut bad = all[1].clone();
            bad[0] = fast.codebook_size() as u32;
            assert!(matches!(
                s.decode_chunk(&[bad]),
                Err(ModelError::InvalidRequest { .. })
            ));
            assert_eq!(s.frames_decoded(), 1);
            // The rest on the chunk ramp: the stream gives the whole decode's samples.
            let mut out = first;
            let mut done = 1;
            for n in ramp(all.len() - 1) {
                let wav = s.decode_chunk(&all[done..done + n]).expect("chunk");
                assert_eq!(wav.len(), n * fast.samples_per_frame());
                out.extend(wav);
                done += n;
                assert_eq!(s.frames_decoded(), done);
                assert!(s.replay.is_empty(), "replayed once, with the second chunk");
            }
            let d = max_abs(&out, &whole);
            assert!(d <= tol, "{dtype:?}: streamed vs whole: max abs diff {d:e}");
            // A reset stream takes the graph path again.
            s.reset();
            assert!(s.is_fresh());
            let again = s.decode_chunk(&all[..1]).expect("after reset");
            assert!(max_abs(&again, &alone) <= tol);
        }
    }

    #[test]
    fn a_batch_with_first_frames_on_the_graph_path_gives_each_stream_its_audio_alone() {
        let eager = decoder(DType::F32, false);
        let fast = decoder(DType::F32, true);
        let utterances: Vec<Vec<Vec<u32>>> = (0..4).map(|k| codes(&eager, 12, 100 + k)).collect();
        let alone: Vec<Vec<f32>> = utterances
            .iter()
            .map(|u| eager.decode(u).expect("alone"))
            .collect();
        // Stream 0 and 1 start with one frame (graph path), stream 2 with three, stream 3 starts
        // one round later: passes mix first frames, replays and plain chunks.
        let schedules: [&[usize]; 4] = [&[1, 2, 4, 5], &[1, 1, 10], &[3, 9], &[0, 1, 2, 9]];
        let mut streams: Vec<Code2WavStream<'_>> = (0..4).map(|_| fast.stream()).collect();
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); 4];
        let mut done = [0usize; 4];
        for round in 0..4 {
            let chunks: Vec<&[Vec<u32>]> = (0..4)
                .map(|k| {
                    let n = schedules[k].get(round).copied().unwrap_or(0);
                    &utterances[k][done[k]..done[k] + n]
                })
                .collect();
            let mut refs: Vec<&mut Code2WavStream<'_>> = streams.iter_mut().collect();
            for (k, r) in fast
                .decode_chunks(&mut refs, &chunks)
                .into_iter()
                .enumerate()
            {
                let wav = r.expect("chunk");
                assert_eq!(wav.len(), chunks[k].len() * fast.samples_per_frame());
                out[k].extend(wav);
                done[k] += chunks[k].len();
            }
        }
        for k in 0..4 {
            assert_eq!(done[k], 12, "stream {k}");
            let d = max_abs(&out[k], &alone[k]);
            assert!(d <= 1e-4, "stream {k}: max abs diff {d:e}");
        }
    }
}
