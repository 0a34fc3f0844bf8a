//! The code predictor's frame replayed from CUDA graphs ([`CpGraphs`]).

use candle_core::{DType, Result, Tensor};
use rand_chacha::ChaCha20Rng;

use crate::models::qwen3_tts::code_predictor::CodePredictor;
#[cfg(feature = "cuda")]
use crate::models::qwen3_tts::device_sampler::DeviceSampler;
use crate::models::qwen3_tts::sampling::TokenChooser;
#[cfg(feature = "cuda")]
use crate::nn::LayerCaches;
#[cfg(feature = "cuda")]
use crate::nn::readback;

/// The code predictor's frame as CUDA graphs, captured once at start-up (docs/field-lessons.md §5:
/// positions and shapes are the same in every frame; graph output = eager output). Two kinds:
///
/// - **whole frame** (the default; docs/cuda.md has its GPU parity and speed): all
///   `num_code_groups - 1` steps in one graph with the codes
///   chosen on the device ([`CodePredictor::frame_on_device`]); two graphs, greedy and sampling.
///   Per frame the host uploads the prefill `[1, 2, talker hidden]` into a static buffer (and, when
///   sampling, the warper parameters and one pre-drawn uniform per step, f64
///   `[PARAM_HEADER + steps]`), replays once and copies the `steps` u32 codes back: one host round
///   trip per frame instead of one per step.
/// - **per step** (`OMNITTS_CP_FRAME_GRAPH=0`): one graph per step (the prefill of 2
///   positions with head 0, then 1 position with head q at position q + 1), the f32 logits
///   `[1, 1, vocab]` copied back after each and the code picked on the host.
///
/// The graphs own their KV cache and the device sampler's constants.
pub struct CpGraphs {
    #[cfg(feature = "cuda")]
    kind: GraphKind,
    #[cfg(feature = "cuda")]
    input2: Tensor,
    /// Holds the KV buffers the graphs write (kept alive, never touched on the host again).
    #[cfg(feature = "cuda")]
    _cache: LayerCaches,
}

#[cfg(feature = "cuda")]
enum GraphKind {
    Frame {
        greedy: crate::nn::cuda_graph::Graph,
        sample: crate::nn::cuda_graph::Graph,
        /// f64 `[PARAM_HEADER + steps]`, read by the sampling graph.
        params: Tensor,
        /// u32 `[steps]`, written by both graphs.
        codes: Tensor,
        /// Constants the sampling graph reads (kept alive).
        _sampler: DeviceSampler,
    },
    Steps {
        steps: Vec<crate::nn::cuda_graph::Graph>,
        input1: Tensor,
        logits: Tensor,
    },
}

impl std::fmt::Debug for CpGraphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CpGraphs")
    }
}

impl CpGraphs {
    /// Captures a frame of `cp` as CUDA graphs (the kind per `OMNITTS_CP_FRAME_GRAPH`,
    /// [`crate::nn::switches`]). `dtype` is the activation dtype (the model's). Runs eager frames
    /// first to allocate the KV buffers and upload the kernel parameters. Errors on a non-CUDA
    /// device or a build without the `cuda` feature.
    pub fn capture(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        #[cfg(feature = "cuda")]
        return Self::capture_on_device(cp, dtype);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (cp, dtype);
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }

    /// [`CodePredictor::generate`] by replaying the graphs: the same model kernels on the same
    /// data, so the same logits bit for bit. With whole-frame graphs the codes are chosen on the
    /// device by [`DeviceSampler`] (greedy: the same codes as the host; sampling: the host's codes
    /// for the same uniforms, which are drawn from `rng` as the host sampler would, except for
    /// float-rounding ties at a CDF boundary); with per-step graphs the host picks every code with
    /// `chooser`. `talker_hidden` and `code0_embed`: `[1, 1, talker hidden]`.
    pub fn generate(
        &mut self,
        cp: &CodePredictor,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        chooser: &TokenChooser,
        rng: &mut ChaCha20Rng,
    ) -> Result<Vec<u32>> {
        #[cfg(feature = "cuda")]
        return self.replay(cp, talker_hidden, code0_embed, chooser, rng);
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (cp, talker_hidden, code0_embed, chooser, rng);
            candle_core::bail!("CUDA graphs need a build with the `cuda` feature")
        }
    }
}

#[cfg(feature = "cuda")]
impl CpGraphs {
    fn capture_on_device(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        let dev = cp.device();
        if !dev.is_cuda() {
            candle_core::bail!("CUDA graphs need a CUDA device, the code predictor is on {dev:?}");
        }
        let whole_frame = crate::nn::switches::Switches::get().cp_frame_graph;
        if whole_frame {
            Self::capture_frame(cp, dtype)
        } else {
            Self::capture_steps(cp, dtype)
        }
    }

    fn capture_frame(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        use crate::models::qwen3_tts::device_sampler::PARAM_HEADER;
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let dev = cp.device();
        let d = cp.model.codec_embedding[0].embeddings().dim(1)?;
        let steps = cp.steps();
        let input2 = Tensor::zeros((1, 2, d), dtype, dev)?;
        let codes = Tensor::zeros(steps, DType::U32, dev)?;
        // Valid values for the warm-up (temperature 1, no top-k, no top-p, u = 0.5).
        let mut init = vec![1.0, 0.0, -1.0];
        init.resize(PARAM_HEADER + steps, 0.5);
        let params = Tensor::from_vec(init, PARAM_HEADER + steps, dev)?;
        let sampler = DeviceSampler::new(cp.vocab_size(), dev)?;
        let mut cache = cp.new_cache();
        let _htod = htod_cache(dev)?;
        let frame = |cache: &mut LayerCaches, sample: bool| -> Result<()> {
            let out = cp.frame_on_device(&input2, cache, &sampler, sample.then_some(&params))?;
            codes.slice_set(&out, 0, 0)
        };
        // Eager frames: allocate the KV buffers, upload the parameter vectors, load modules.
        frame(&mut cache, false)?;
        frame(&mut cache, true)?;
        dev.synchronize()?;
        let greedy = Graph::capture(dev, || frame(&mut cache, false))?;
        let sample = Graph::capture(dev, || frame(&mut cache, true))?;
        cache.reset();
        dev.synchronize()?;
        Ok(CpGraphs {
            kind: GraphKind::Frame {
                greedy,
                sample,
                params,
                codes,
                _sampler: sampler,
            },
            input2,
            _cache: cache,
        })
    }

    fn capture_steps(cp: &CodePredictor, dtype: DType) -> Result<CpGraphs> {
        use crate::nn::cuda_graph::{Graph, htod_cache};
        let dev = cp.device();
        let d = cp.model.codec_embedding[0].embeddings().dim(1)?;
        let input2 = Tensor::zeros((1, 2, d), dtype, dev)?;
        let input1 = Tensor::zeros((1, 1, d), dtype, dev)?;
        let logits = Tensor::zeros((1, 1, cp.vocab_size()), DType::F32, dev)?;
        let mut cache = cp.new_cache();
        let steps = cp.steps();
        let _htod = htod_cache(dev)?;
        let step = |q: usize, cache: &mut LayerCaches| -> Result<()> {
            let x = if q == 0 { &input2 } else { &input1 };
            let out = cp.step_logits(x, q, cache)?;
            logits.slice_set(&out, 2, 0)
        };
        // Eager frame: allocates the KV buffers, uploads the parameter vectors, loads modules.
        cache.reset();
        for q in 0..steps {
            step(q, &mut cache)?;
        }
        dev.synchronize()?;
        cache.reset();
        let mut graphs = Vec::with_capacity(steps);
        for q in 0..steps {
            graphs.push(Graph::capture(dev, || step(q, &mut cache))?);
        }
        cache.reset();
        dev.synchronize()?;
        Ok(CpGraphs {
            kind: GraphKind::Steps {
                steps: graphs,
                input1,
                logits,
            },
            input2,
            _cache: cache,
        })
    }

    fn replay(
        &mut self,
        cp: &CodePredictor,
        talker_hidden: &Tensor,
        code0_embed: &Tensor,
        chooser: &TokenChooser,
        rng: &mut ChaCha20Rng,
    ) -> Result<Vec<u32>> {
        let groups = cp.steps() + 1;
        let prefill = Tensor::cat(&[talker_hidden, code0_embed], 1)?;
        self.input2.slice_set(&prefill, 1, 0)?;
        let (steps, input1, logits) = match &self.kind {
            GraphKind::Frame {
                greedy,
                sample,
                params,
                codes,
                ..
            } => {
                if chooser.do_sample {
                    let p = crate::models::qwen3_tts::device_sampler::frame_params(
                        chooser,
                        cp.vocab_size(),
                        cp.steps(),
                        rng,
                    );
                    params.slice_set(&Tensor::from_vec(p, params.dims1()?, cp.device())?, 0, 0)?;
                    sample.launch()?;
                } else {
                    greedy.launch()?;
                }
                let codes = readback::to_vec::<u32>(codes)?;
                if let Some(c) = codes.iter().find(|&&c| c as usize >= cp.vocab_size()) {
                    candle_core::bail!("code predictor graph: code {c} >= {}", cp.vocab_size());
                }
                return Ok(codes);
            }
            GraphKind::Steps {
                steps,
                input1,
                logits,
            } => (steps, input1, logits),
        };
        let mut codes = Vec::with_capacity(groups - 1);
        steps[0].launch()?;
        let mut host = readback::to_vec::<f32>(logits)?;
        for q in 1..groups {
            let code = chooser.choose(&mut host, rng);
            if code as usize >= cp.vocab_size() {
                candle_core::bail!("codebook {q}: chosen code {code} >= {}", cp.vocab_size());
            }
            codes.push(code);
            if q + 1 < groups {
                let x = cp.codec_embed(q - 1, code)?.unsqueeze(0)?;
                input1.slice_set(&x, 1, 0)?;
                steps[q].launch()?;
                host = readback::to_vec::<f32>(logits)?;
            }
        }
        Ok(codes)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    use crate::models::qwen3_tts::sampling::{self, TokenChooser};
    use crate::models::qwen3_tts::testing::fixture;

    /// The code predictor's whole-frame CUDA graph work (`CodePredictor::frame_on_device`: codes
    /// chosen on the device and embedded for the next step), run directly on the CPU, gives
    /// `CodePredictor::generate`'s codes: greedy exactly; sampling with the uniforms drawn from
    /// the same ChaCha20 stream position, equal up to rare CDF-boundary roundings.
    #[test]
    fn device_frame_equals_host_frame() {
        use crate::models::qwen3_tts::device_sampler::{DeviceSampler, frame_params};
        use rand::Rng;
        let (m, _) = fixture("tiny-customvoice");
        let cp = &m.code_predictor;
        let dev = Device::Cpu;
        let sampler = DeviceSampler::new(cp.vocab_size(), &dev).expect("sampler");
        let d = m.config.talker_config.transformer.hidden_size;
        let mut data = ChaCha20Rng::seed_from_u64(3);
        let (mut host_cache, mut dev_cache) = (cp.new_cache(), cp.new_cache());
        let choosers = [
            TokenChooser {
                do_sample: true,
                temperature: 0.9,
                top_k: 50,
                top_p: 1.0,
            },
            TokenChooser {
                do_sample: true,
                temperature: 1.0,
                top_k: 0,
                top_p: 0.8,
            },
        ];
        let (mut sampled, mut differ) = (0usize, 0usize);
        for frame in 0..24u32 {
            let h: Vec<f32> = (0..d).map(|_| data.random::<f32>() * 4.0 - 2.0).collect();
            let hidden = Tensor::from_vec(h, (1, 1, d), &dev).expect("hidden");
            let c0 = m
                .talker
                .codec_embed(&[frame * 5])
                .expect("c0")
                .unsqueeze(0)
                .expect("c0");
            let input2 = Tensor::cat(&[&hidden, &c0], 1).expect("input2");
            let host = cp
                .generate(&hidden, &c0, &mut host_cache, |_, l| sampling::argmax(l))
                .expect("host frame");
            let on_dev = cp
                .frame_on_device(&input2, &mut dev_cache, &sampler, None)
                .and_then(|t| t.to_vec1::<u32>())
                .expect("device frame");
            assert_eq!(on_dev, host, "frame {frame}: greedy codes differ");
            assert_eq!(host.len(), m.num_code_groups() - 1);

            let chooser = choosers[frame as usize % choosers.len()];
            let mut rng = ChaCha20Rng::seed_from_u64(100 + u64::from(frame));
            let mut host_rng = rng.clone();
            let host = cp
                .generate(&hidden, &c0, &mut host_cache, |_, l| {
                    chooser.choose(l, &mut host_rng)
                })
                .expect("host frame");
            let params = frame_params(&chooser, cp.vocab_size(), cp.steps(), &mut rng);
            assert_eq!(
                rng.random::<u64>(),
                host_rng.random::<u64>(),
                "streams diverged"
            );
            let params = Tensor::new(params.as_slice(), &dev).expect("params");
            let on_dev = cp
                .frame_on_device(&input2, &mut dev_cache, &sampler, Some(&params))
                .and_then(|t| t.to_vec1::<u32>())
                .expect("device frame");
            // A different pick changes the rest of the frame: count frames, not codes.
            sampled += 1;
            differ += usize::from(on_dev != host);
        }
        eprintln!("device vs host frames, sampled: {differ} / {sampled} differ");
        assert!(differ <= 1, "{differ} / {sampled} sampled frames differ");
    }
}
