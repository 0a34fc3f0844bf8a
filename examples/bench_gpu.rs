//! GPU benchmark of both stages on the real Qwen3-TTS CustomVoice shapes, with random weights made
//! on the machine that runs it (nothing is carried): TTFA, ms/frame per stage, RTF and peak device
//! memory, as a table and a JSON document. Meant to run side by side with the official PyTorch
//! reference (`shared/bench/ref_bench.py`, same shapes, same text, same frame count, greedy, EOS
//! made unreachable the same way); `scripts/gpu-bench.sh` runs both and prints the ratios.
//!
//! ```sh
//! scripts/build-cuda.sh --example bench_gpu
//! target-cuda/release/examples/bench_gpu --sizes 0.6b,1.7b --frames 250 --json bench.json
//! # stage 1 on a second GPU
//! target-cuda/release/examples/bench_gpu --ar-device cuda:0 --decoder-device cuda:1
//! ```
//!
//! What is measured (single thread, both stages called in turn, every timed region ends with a
//! device-to-host copy, so wall clock = device work + host overhead):
//! - **batch**: `ArModel::start` (tokenize + prefill) and exactly `--frames` frames, then
//!   `Code2Wav::decode` of all frames. `ar_ms_per_frame` = AR wall time / frames (prefill included,
//!   as the reference reports it); `cp_ms_per_frame` / `talker_ms_per_frame` split the per-frame
//!   step ([`StepTiming`]); RTF = wall time / audio duration.
//! - **streaming k** (k = `--first-chunks`): prefill, k frames, `Code2WavStream::decode_chunk` of
//!   those k frames → TTFA; then the rest in chunks of `--chunk` frames. RTF is for this serial
//!   schedule (the engine overlaps the two stages on two threads, so its RTF is lower).
//! - Peak device memory: `cuMemGetInfo` (total − free, so the CUDA context is included) polled after
//!   every frame and decode, minus the reading before the model was loaded, after the memory pool
//!   was trimmed (`peak_model_gib`: weights, KV caches, activations, graph memory and lazily loaded
//!   kernel modules; the figure closest to PyTorch's `max_memory_allocated`), and the absolute
//!   peak (`peak_used_gib`, context included).
//!
//! Random weights (as `ref_bench.py`'s `init_random_`): every tensor N(0, 0.02²) except norm
//! weights 1, codebook `cluster_usage` 1; the `codec_head` row of the EOS id is zero so greedy never
//! picks EOS and every run has exactly `--frames` frames. Talker + code predictor are stored bf16,
//! the codec decoder f32, in the real checkpoint layout (config, tokenizer files from the tiny
//! CustomVoice fixture, which uses the same tokenizer files as `shared/bench/tok`) in a temp dir.
//! The tensor layout is derived from the configs and first checked against the tiny fixture.

#[path = "common/cuda_profiler.rs"]
mod cuda_profiler;
mod random_checkpoint;
mod stage0_rows;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use gstomnitts::engine::DeviceSpec;
use gstomnitts::models::qwen3_tts::code2wav::Code2Wav;
use gstomnitts::models::qwen3_tts::{
    ArModel, ArStep, Checkpoint, PromptMode, SamplingParams, VoiceRequest,
};
use random_checkpoint::{Init, TensorSpec, decoder_layout, talker_layout, write_configs};
use serde_json::{Value, json};

const FRAME_MS: f64 = 80.0;
const CODEC_EOS: usize = 2150;
const DEFAULT_TEXT: &str = "The quick brown fox jumps over the lazy dog. The weather is nice today, and the park is full of people. Please read the following sentence slowly and clearly. This is a test of the speech synthesis system. We are going to the station at seven o'clock in the morning; the train leaves at 7:45 from platform 3.";

#[derive(Parser, Debug)]
#[command(about = "omnitts GPU benchmark: real CustomVoice shapes, random weights")]
struct Args {
    /// Model sizes, comma separated: 0.6b, 1.7b.
    #[arg(long, default_value = "0.6b,1.7b", value_delimiter = ',')]
    sizes: Vec<String>,
    /// Device of stage 0 (talker + code predictor): cuda:N or cpu.
    #[arg(long, default_value = "cuda:0")]
    ar_device: String,
    /// Device of stage 1 (Code2Wav, always f32). Default: the stage-0 device.
    #[arg(long)]
    decoder_device: Option<String>,
    /// Stage-0 dtype: bf16 or f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Frames per utterance (80 ms each).
    #[arg(long, default_value_t = 250)]
    frames: usize,
    /// Timed repeats of each mode (after one warm-up utterance); the median is reported.
    #[arg(long, default_value_t = 2)]
    repeats: usize,
    /// Frames of the warm-up utterance.
    #[arg(long, default_value_t = 16)]
    warmup_frames: usize,
    /// First-chunk sizes of the streaming modes (frames), comma separated.
    #[arg(long, default_value = "1,2", value_delimiter = ',')]
    first_chunks: Vec<usize>,
    /// Chunk size after the first chunk (frames).
    #[arg(long, default_value_t = 25)]
    chunk: usize,
    /// The tiny CustomVoice fixture (config + tokenizer template).
    #[arg(long, default_value = "tests/fixtures/tiny-customvoice")]
    template: PathBuf,
    /// Where to write the random checkpoints (default: the system temp dir); removed afterwards.
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Only write the random checkpoints, one folder per size under this one (kept), and exit:
    /// for benchmarks that take a model directory (`bench_streams`).
    #[arg(long)]
    build_only: Option<PathBuf>,
    #[arg(long, default_value = DEFAULT_TEXT)]
    text: String,
    #[arg(long, default_value = "Vivian")]
    speaker: String,
    #[arg(long, default_value = "English")]
    language: String,
    /// Sample (talker and code predictor, the checkpoint's warpers: temperature 0.9, top-k 50,
    /// seed 1234) instead of greedy decoding, as the released generation configs do. A sampled
    /// EOS can end an utterance before --frames.
    #[arg(long)]
    sample: bool,
    /// Code predictor CUDA graphs: off, on, or both (every mode is run without, then with).
    #[arg(long, default_value = "both")]
    graphs: String,
    /// Also write the JSON document here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Instead of the modes above: stage 0 alone stepping this many streams together
    /// (comma separated, e.g. 16,64; batched frame graphs on CUDA), `--frames` timed steps each
    /// (`stage0_rows`).
    #[arg(long, value_delimiter = ',')]
    rows: Vec<usize>,
    /// With `--rows`: what is the CUDA profiler's range: `step` (also `--profile` alone), one
    /// batched step in the middle of each run; `prefill`, the start's batched prefill.
    #[arg(long, num_args = 0..=1, default_missing_value = "step")]
    profile: Option<stage0_rows::Profiled>,
}

/// `cpu`, `cuda:N` or `auto`, opened as the engine opens a stage's device
/// ([`DeviceSpec::open`]).
fn open_device(spec: &str) -> Result<Device> {
    let spec: DeviceSpec = spec.parse()?;
    Ok(spec.open()?)
}

/// Bytes of device memory in use (total − free) on `dev`; `None` on the CPU.
fn mem_used(dev: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = dev {
        let (free, total) = c.cuda_stream().context().mem_get_info().ok()?;
        return Some((total - free) as u64);
    }
    let _ = dev;
    None
}

/// Waits for `dev` and returns the unused memory of its default memory pool (where candle's
/// stream-ordered allocations come from) to the driver, so that [`mem_used`] counts live tensors,
/// the context and loaded kernels only.
fn trim_pool(dev: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = dev {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let _ = dev.synchronize();
        let stream = c.cuda_stream();
        let ctx = stream.context();
        if ctx.bind_to_thread().is_ok() {
            // SAFETY: plain driver calls on the bound context's device with a valid out-pointer.
            unsafe {
                let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
                if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                    == sys::CUresult::CUDA_SUCCESS
                {
                    sys::cuMemPoolTrimTo(pool, 0);
                }
            }
        }
    }
    let _ = dev;
}

/// Peak of [`mem_used`] over the points where it is polled.
struct MemPeak {
    devs: Vec<Device>,
    base: Vec<u64>,
    peak: Vec<u64>,
}

impl MemPeak {
    fn new(devs: &[Device]) -> Self {
        devs.iter().for_each(trim_pool);
        let base: Vec<u64> = devs.iter().map(|d| mem_used(d).unwrap_or(0)).collect();
        Self {
            devs: devs.to_vec(),
            peak: base.clone(),
            base,
        }
    }
    fn poll(&mut self) {
        for (d, p) in self.devs.iter().zip(self.peak.iter_mut()) {
            *p = (*p).max(mem_used(d).unwrap_or(0));
        }
    }
    fn json(&self) -> Value {
        let g = |b: u64| b as f64 / (1u64 << 30) as f64;
        json!({
            "peak_model_gib": self.peak.iter().zip(&self.base).map(|(p, b)| g(p - b)).collect::<Vec<_>>(),
            "peak_used_gib": self.peak.iter().map(|&p| g(p)).collect::<Vec<_>>(),
            "base_used_gib": self.base.iter().map(|&p| g(p)).collect::<Vec<_>>(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Random checkpoint in the real layout
// ---------------------------------------------------------------------------------------------

/// Random tensors made on `maker` (a GPU when there is one), saved as safetensors in `dtype`.
fn write_random(path: &Path, specs: &[TensorSpec], dtype: DType, maker: &Device) -> Result<usize> {
    let mut map = HashMap::new();
    let mut params = 0;
    for s in specs {
        params += s.shape.iter().product::<usize>();
        let t = match s.init {
            Init::Const(c) => Tensor::full(c, s.shape.as_slice(), maker)?,
            Init::Normal(std) => Tensor::randn(0f32, std, s.shape.as_slice(), maker)?,
        };
        let t = if s.name == "talker.codec_head.weight" {
            // EOS row zero: its logit is exactly 0 while the code logits spread around 0, so greedy
            // never picks EOS (same trick as ref_bench.py).
            let rows = s.shape[0];
            Tensor::cat(
                &[
                    t.narrow(0, 0, CODEC_EOS)?,
                    t.narrow(0, CODEC_EOS, 1)?.zeros_like()?,
                    t.narrow(0, CODEC_EOS + 1, rows - CODEC_EOS - 1)?,
                ],
                0,
            )?
        } else {
            t
        };
        map.insert(s.name.clone(), t.to_dtype(dtype)?.to_device(&Device::Cpu)?);
    }
    candle_core::safetensors::save(&map, path).with_context(|| path.display().to_string())?;
    Ok(params)
}

/// Writes a random CustomVoice checkpoint of `size` into `dir` (`random_checkpoint.rs`), its values
/// made on `maker`.
fn build_random(size: &str, template: &Path, dir: &Path, maker: &Device) -> Result<Value> {
    let (cfg, st) = write_configs(size, template, dir)?;
    let t = Instant::now();
    let p_main = write_random(
        &dir.join("model.safetensors"),
        &talker_layout(&cfg)?,
        DType::BF16,
        maker,
    )?;
    let p_dec = write_random(
        &dir.join("speech_tokenizer/model.safetensors"),
        &decoder_layout(&st)?,
        DType::F32,
        maker,
    )?;
    let s = t.elapsed().as_secs_f64();
    eprintln!(
        "random {size} CustomVoice: talker+code predictor {:.1} M params (bf16), decoder {:.1} M (f32), made and written in {s:.1} s",
        p_main as f64 / 1e6,
        p_dec as f64 / 1e6
    );
    Ok(json!({"main_M": p_main as f64 / 1e6, "decoder_M": p_dec as f64 / 1e6, "build_s": s}))
}

// ---------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// One timed utterance.
#[derive(Default, Clone)]
struct Sample {
    ttfa_ms: f64,
    prefill_ms: f64,
    ar_ms: f64,
    cp_ms: f64,
    talker_ms: f64,
    decode_ms: f64,
    total_ms: f64,
    frames: usize,
    samples: usize,
    /// FNV-1a hash of every code of the utterance (greedy: equal in every run and mode).
    codes_hash: u64,
}

fn fnv(h: u64, codes: &[u32]) -> u64 {
    codes.iter().fold(h, |h, &c| {
        c.to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    })
}

struct Stages<'a> {
    ar: &'a ArModel,
    dec: &'a Code2Wav,
    req: VoiceRequest,
    sampling: SamplingParams,
}

impl Stages<'_> {
    /// `first_chunk = None`: batch mode. `Some(k)`: streaming, first chunk k, then `chunk`.
    fn run(
        &self,
        frames: usize,
        first_chunk: Option<usize>,
        chunk: usize,
        mem: &mut MemPeak,
    ) -> Result<Sample> {
        let mut sp = self.sampling.clone();
        sp.max_new_tokens = frames + 1; // the last sampled code-0 token is dropped (reference rule)
        let mut s = Sample {
            codes_hash: 0xcbf29ce484222325,
            ..Sample::default()
        };
        let t0 = Instant::now();
        let mut sess = self.ar.start(&self.req, &sp)?;
        s.prefill_ms = ms(t0);
        mem.poll();
        let mut stream = self.dec.stream();
        let mut pending: Vec<Vec<u32>> = Vec::new();
        let mut all: Vec<Vec<u32>> = Vec::new();
        let mut next_chunk = first_chunk.unwrap_or(usize::MAX);
        loop {
            let t = Instant::now();
            let step = sess.next_frame()?;
            s.ar_ms += ms(t);
            match step {
                ArStep::Frame(f) => {
                    let tm = sess.last_timing();
                    s.cp_ms += tm.code_predictor_ms;
                    s.talker_ms += tm.talker_ms;
                    s.frames += 1;
                    s.codes_hash = fnv(s.codes_hash, &f);
                    mem.poll();
                    if first_chunk.is_some() {
                        pending.push(f);
                        if pending.len() >= next_chunk {
                            let t = Instant::now();
                            let wav = stream.decode_chunk(&pending)?;
                            s.decode_ms += ms(t);
                            mem.poll();
                            if s.samples == 0 {
                                s.ttfa_ms = ms(t0);
                            }
                            s.samples += wav.len();
                            pending.clear();
                            next_chunk = chunk;
                        }
                    } else {
                        all.push(f);
                    }
                }
                ArStep::Finished(_) => break,
            }
        }
        let t = Instant::now();
        let wav = if first_chunk.is_some() {
            if pending.is_empty() {
                Vec::new()
            } else {
                stream.decode_chunk(&pending)?
            }
        } else {
            self.dec.decode(&all)?
        };
        s.decode_ms += ms(t);
        mem.poll();
        if s.samples == 0 {
            s.ttfa_ms = ms(t0);
        }
        s.samples += wav.len();
        s.total_ms = ms(t0);
        s.ar_ms += s.prefill_ms;
        ensure!(
            s.frames == frames,
            "run produced {} frames, expected {frames} (EOS should be unreachable)",
            s.frames
        );
        ensure!(
            s.samples == frames * self.dec.samples_per_frame(),
            "decoded {} samples for {frames} frames",
            s.samples
        );
        Ok(s)
    }
}

fn summarize(mode: &str, v: &[Sample]) -> Value {
    let m = |f: &dyn Fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let n = v.first().map_or(1, |s| s.frames).max(1) as f64;
    let audio_ms = n * FRAME_MS;
    json!({
        "mode": mode,
        "frames": n,
        "ttfa_ms": m(&|s| s.ttfa_ms),
        "prefill_ms": m(&|s| s.prefill_ms),
        "ar_ms_per_frame": m(&|s| s.ar_ms / n),
        "cp_ms_per_frame": m(&|s| s.cp_ms / n),
        "talker_ms_per_frame": m(&|s| s.talker_ms / n),
        "decoder_ms_total": m(&|s| s.decode_ms),
        "decoder_ms_per_frame": m(&|s| s.decode_ms / n),
        "total_ms": m(&|s| s.total_ms),
        "rtf": m(&|s| s.total_ms / audio_ms),
        "runs": v.len(),
        "codes_hash": v.first().map(|s| format!("{:016x}", s.codes_hash)),
        "codes_identical_across_runs": v.windows(2).all(|w| w[0].codes_hash == w[1].codes_hash),
    })
}

fn bench_size(args: &Args, size: &str, ar_dev: &Device, dec_dev: &Device) -> Result<Value> {
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => bail!("--dtype {other:?} (bf16 | f32)"),
    };
    let root = args.workdir.clone().unwrap_or_else(std::env::temp_dir);
    let dir = root.join(format!("omnitts-bench-{size}-{}", std::process::id()));
    let built = build_random(size, &args.template, &dir, ar_dev);
    let result = built.and_then(|params| {
        let mut mem = MemPeak::new(&[ar_dev.clone(), dec_dev.clone()]);
        let t = Instant::now();
        let ckpt = Checkpoint::open(&dir)?;
        let mut ar = ArModel::load(&ckpt, ar_dev, dtype)?;
        let dec = Code2Wav::load(&dir, dec_dev)?;
        let load_ms = ms(t);
        mem.poll();
        let weights = mem.json();
        let graph_settings: Vec<bool> = match args.graphs.as_str() {
            "off" => vec![false],
            "on" => vec![true],
            "both" => vec![false, true],
            other => bail!("--graphs {other:?} (off | on | both)"),
        };
        if !args.rows.is_empty() {
            return bench_rows(args, size, &mut ar, &ckpt);
        }
        let mut modes = Vec::new();
        let mut graph_capture_ms = None;
        let mut warm_ms = 0.0;
        let mut prefill_len = 0;
        for graphs in graph_settings {
            if graphs && !ar.cuda_graphs_enabled() {
                let t = Instant::now();
                ar.enable_cuda_graphs()?;
                graph_capture_ms = Some(ms(t));
                eprintln!(
                    "{size}: CUDA graphs (code predictor + talker) captured in {:.0} ms",
                    ms(t)
                );
            } else if !graphs {
                ar.disable_cuda_graphs();
            }
            let (m, w, p) = run_modes(args, size, &ar, &dec, &ckpt, &mut mem, graphs)?;
            modes.extend(m);
            warm_ms += w;
            prefill_len = p;
        }
        let hashes: Vec<&Value> = modes.iter().map(|m| &m["codes_hash"]).collect();
        let same = hashes.windows(2).all(|w| w[0] == w[1])
            && modes
                .iter()
                .all(|m| m["codes_identical_across_runs"] == true);
        eprintln!("{size}: codes identical in every run, mode and graph setting: {same}");
        Ok(json!({
            "size": size, "dtype": args.dtype, "params": params, "prefill_len": prefill_len,
            "codes_identical_everywhere": same,
            "load_ms": load_ms, "warmup_ms": warm_ms, "graph_capture_ms": graph_capture_ms,
            "memory_after_load": weights, "memory": mem.json(), "modes": modes,
        }))
    });
    if dir.exists() {
        let _ = fs::remove_dir_all(&dir);
    }
    result
}

/// `--rows`: stage 0 alone at each batch size, on the CUDA graphs (one-stream and batched).
fn bench_rows(args: &Args, size: &str, ar: &mut ArModel, ckpt: &Checkpoint) -> Result<Value> {
    if ar.device().is_cuda() {
        ar.enable_cuda_graphs()?;
        let max = args.rows.iter().copied().max().unwrap_or(1);
        eprintln!(
            "{size}: batched frame graphs {:?}",
            ar.enable_batch_graphs(max)?
        );
    }
    let (req, sampling) = request(args, ckpt);
    let rows = stage0_rows::bench_rows(ar, &req, &sampling, &args.rows, args.frames, args.profile)?;
    Ok(json!({ "size": size, "dtype": args.dtype, "sample": args.sample, "rows": rows }))
}

/// The request and sampling every mode runs (`--text`, `--speaker`, `--language`, `--sample`).
fn request(args: &Args, ckpt: &Checkpoint) -> (VoiceRequest, SamplingParams) {
    let req = VoiceRequest {
        text: args.text.clone(),
        speaker: Some(args.speaker.clone()),
        language: Some(args.language.clone()),
        instruct: None,
        prompt_mode: Some(PromptMode::NonStreaming),
        voice_clone: None,
    };
    let s = SamplingParams::from_generation_config(&ckpt.generation);
    let sampling = if args.sample {
        SamplingParams {
            do_sample: true,
            subtalker_do_sample: true,
            seed: 1234,
            ..s
        }
    } else {
        s.greedy()
    };
    (req, sampling)
}

/// Warm-up, then every mode `--repeats` times. Returns (mode summaries, warm-up ms, prefill rows).
fn run_modes(
    args: &Args,
    size: &str,
    ar: &ArModel,
    dec: &Code2Wav,
    ckpt: &Checkpoint,
    mem: &mut MemPeak,
    graphs: bool,
) -> Result<(Vec<Value>, f64, usize)> {
    {
        let (req, sampling) = request(args, ckpt);
        let stages = Stages {
            ar,
            dec,
            req,
            sampling,
        };
        let prefill_len = ar.plan(&stages.req)?.rows.len();
        let t = Instant::now();
        stages.run(args.warmup_frames, Some(2), 3, mem)?;
        stages.run(args.warmup_frames, None, 0, mem)?;
        let warm_ms = ms(t);
        eprintln!(
            "{size} (graphs {graphs}): warm-up {warm_ms:.0} ms, prefill {prefill_len} positions"
        );
        let mut modes = Vec::new();
        let tag = if graphs { "+g" } else { "" };
        let mut list: Vec<(String, Option<usize>)> = vec![(format!("batch{tag}"), None)];
        for &k in &args.first_chunks {
            list.push((format!("stream{k}{tag}"), Some(k)));
        }
        for (name, first) in list {
            let mut v = Vec::new();
            for r in 0..args.repeats {
                let s = stages.run(args.frames, first, args.chunk, mem)?;
                eprintln!(
                    "{size} {name} run {}: total {:.0} ms, TTFA {:.1} ms, AR {:.2} ms/frame (cp {:.2}, talker {:.2}), decode {:.1} ms",
                    r + 1,
                    s.total_ms,
                    s.ttfa_ms,
                    s.ar_ms / s.frames as f64,
                    s.cp_ms / s.frames as f64,
                    s.talker_ms / s.frames as f64,
                    s.decode_ms
                );
                v.push(s);
            }
            let mut m = summarize(&name, &v);
            m["cuda_graphs"] = json!(graphs);
            modes.push(m);
        }
        Ok((modes, warm_ms, prefill_len))
    }
}

fn print_table(results: &[Value]) {
    println!();
    println!(
        "{:<6} {:<9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7} {:>9}",
        "size",
        "mode",
        "TTFA ms",
        "AR ms/f",
        "CP ms/f",
        "talk ms/f",
        "dec ms/f",
        "total ms",
        "RTF",
        "peak GiB"
    );
    for r in results {
        let peak = r["memory"]["peak_model_gib"]
            .as_array()
            .and_then(|a| a.first())
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN);
        for m in r["modes"].as_array().into_iter().flatten() {
            let f = |k: &str| m[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:<6} {:<9} {:>9.1} {:>9.2} {:>9.2} {:>9.2} {:>10.3} {:>10.0} {:>7.3} {:>9.2}",
                r["size"].as_str().unwrap_or("?"),
                m["mode"].as_str().unwrap_or("?"),
                f("ttfa_ms"),
                f("ar_ms_per_frame"),
                f("cp_ms_per_frame"),
                f("talker_ms_per_frame"),
                f("decoder_ms_per_frame"),
                f("total_ms"),
                f("rtf"),
                peak
            );
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let ar_dev = open_device(&args.ar_device)?;
    let dec_spec = args
        .decoder_device
        .clone()
        .unwrap_or(args.ar_device.clone());
    // Each stage gets its own device handle (its own stream), as in the engine.
    let dec_dev = open_device(&dec_spec)?;
    if let Some(root) = &args.build_only {
        for size in &args.sizes {
            build_random(size, &args.template, &root.join(size), &ar_dev)
                .with_context(|| size.clone())?;
        }
        return Ok(());
    }
    let mut results = Vec::new();
    for size in &args.sizes {
        results.push(bench_size(&args, size, &ar_dev, &dec_dev).with_context(|| size.clone())?);
    }
    print_table(&results);
    let doc = json!({
        "bench": "omnitts-gpu", "ar_device": args.ar_device, "decoder_device": dec_spec,
        "frames": args.frames, "repeats": args.repeats, "chunk": args.chunk,
        "decoding": if args.sample { "sampled (seed 1234)" } else { "greedy" },
        "cuda_feature": cfg!(feature = "cuda"), "results": results,
    });
    let line = serde_json::to_string(&doc)?;
    if let Some(p) = &args.json {
        fs::write(p, &line).with_context(|| p.display().to_string())?;
    }
    println!("{line}");
    Ok(())
}
