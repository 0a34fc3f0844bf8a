//! Command-line synthesis with the stage-0 model (talker + code predictor; for a Fish S2 Pro
//! checkpoint, chosen by config.json's `model_type`, the slow and fast ARs) and the codec.
//!
//! ```sh
//! cargo run --release --example synth -- --model DIR --text "Hello." --speaker vivian \
//!     --language english --codes-out codes.json --wav-out out.wav
//! ```
//!
//! Unset options default like the reference's generate call for the checkpoint's variant
//! (`generation_config.json` sampling, `auto` language, non-streaming prompt for
//! CustomVoice/VoiceDesign). Writes the codes as JSON (array of frames, `num_code_groups` ints
//! each, EOS excluded) and a WAV at the model's rate (24 kHz for Qwen3-TTS, 44.1 kHz for Fish S2
//! Pro), each when asked for. Random-weight checkpoints (the repository's fixtures) may never
//! choose their end (the Qwen3-TTS fixtures do not; the tiny Fish one stops after a few frames):
//! give them `--max-new-tokens` (e.g. 50), or they may run to the checkpoint's limit (8192
//! frames, minutes on a CPU).
//!
//! Base checkpoints clone a voice from `--ref-audio REF` (a file path or URI in any format
//! GStreamer decodes, resampled to 24 kHz mono by the element's own reader,
//! `gstomnitts::element_common::ref_audio`; 0.5 s to 60 s) with `--ref-text "transcript"` (ICL mode) or
//! `--x-vector-only` (speaker embedding only):
//!
//! ```sh
//! cargo run --release --example synth -- --model BASE_DIR --text "Hello." \
//!     --ref-audio ref.wav --ref-text "What the reference says." --codes-out c.json --wav-out o.wav
//! ```
//!
//! Fish S2 Pro: the text (with `<|speaker:N|>` tags if wanted) as the reference's
//! `generate_long` takes it, optionally cloned from `--ref-audio` (resampled to 44.1 kHz) with
//! `--ref-text`; `--greedy` or the reference's sampling (temperature 1.0, top_p 0.9, top_k 30),
//! `--seed`; `--max-new-tokens` frames at most (default: up to the position limit). The codes
//! JSON holds the frames (10 codes each) and the WAV is 44.1 kHz. Qwen3-TTS-only options
//! (`--speaker`, `--language`, `--instruct`, `--prompt-mode`, `--x-vector-only`,
//! `--quantization` other than `auto`) are refused.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use clap::Parser;
use gstomnitts::element_common::ref_audio::{decode_ref_audio, decode_ref_audio_at};
use gstomnitts::engine::DeviceSpec;
use gstomnitts::models::fish_speech::codec::Codec;
use gstomnitts::models::fish_speech::rules::MAX_REF_SAMPLES as FISH_MAX_REF_SAMPLES;
use gstomnitts::models::fish_speech::{
    FishModel, GenerateOptions, SamplingParams as FishSampling, VoiceReference,
};
use gstomnitts::models::qwen3_tts::code2wav::{
    Code2Wav, REFERENCE_CHUNK_FRAMES, REFERENCE_LEFT_CONTEXT_FRAMES,
};
use gstomnitts::models::qwen3_tts::{
    ArModel, ArStep, Checkpoint, MAX_REF_AUDIO_SAMPLES, PromptMode, SamplingParams, VoiceRequest,
    WeightForm,
};
use gstomnitts::models::registry;
use gstomnitts::models::tts::text::unspeakable;
use gstomnitts::nn::QuantizationSpec;

#[derive(Parser, Debug)]
#[command(about = "Qwen3-TTS or Fish S2 Pro synthesis (stage 0 + codec decode)")]
struct Args {
    /// Checkpoint directory (config.json, generation_config.json, model.safetensors, ...).
    #[arg(long)]
    model: PathBuf,
    /// Text to speak.
    #[arg(long)]
    text: String,
    /// Qwen3-TTS CustomVoice preset speaker (case-insensitive); unset: none in the prompt, as the
    /// reference's direct call (the elements take the alphabetically first speaker instead).
    #[arg(long)]
    speaker: Option<String>,
    /// Language (case-insensitive); default `auto`.
    #[arg(long)]
    language: Option<String>,
    /// Instruct / voice description (CustomVoice 1.7B, VoiceDesign).
    #[arg(long)]
    instruct: Option<String>,
    /// Greedy decoding for both the talker and the code predictor.
    #[arg(long)]
    greedy: bool,
    /// Sampling seed (42, as the elements' `seed` property).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Maximum codebook-0 tokens (default: generation_config.json).
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// `streaming` or `non-streaming` (default: the variant's reference default).
    #[arg(long)]
    prompt_mode: Option<PromptMode>,
    /// Compute dtype of the weights: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Qwen3-TTS: stored form of the talker's and code predictor's linear weights: auto, none,
    /// q8-0 or q4-k (also spelled q8_0, q4_k: `engine_args.quantization`, docs/cpu.md;
    /// quantized forms need the CPU and f32).
    #[arg(long, default_value = "auto")]
    quantization: String,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Where to write the codes JSON (optional).
    #[arg(long)]
    codes_out: Option<PathBuf>,
    /// Where to write the mono WAV, at the model's rate (24 kHz Qwen3-TTS, 44.1 kHz Fish S2 Pro).
    #[arg(long)]
    wav_out: Option<PathBuf>,
    /// Checkpoints that clone (Qwen3-TTS Base, Fish S2 Pro): reference audio, a file path or URI
    /// in any format GStreamer decodes (resampled to the model's reference rate, mixed down).
    #[arg(long)]
    ref_audio: Option<String>,
    /// Transcript of the reference audio (ICL mode; required unless --x-vector-only).
    #[arg(long)]
    ref_text: Option<String>,
    /// Qwen3-TTS Base: clone from the speaker embedding only (no reference text/codes in the
    /// prompt).
    #[arg(long)]
    x_vector_only: bool,
}

fn device(spec: &str) -> Result<Device> {
    let spec: DeviceSpec = spec
        .parse()
        .map_err(|e| anyhow::anyhow!("device {spec:?}: {e}"))?;
    Ok(spec.open()?)
}

fn dtype(s: &str) -> Result<DType> {
    Ok(match s {
        "f32" => DType::F32,
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        other => bail!("unknown dtype {other:?} (f32 | bf16 | f16)"),
    })
}

fn main() -> Result<()> {
    let args = Args::parse();
    if registry::detect(&args.model)?.model_type == registry::FISH_SPEECH.model_type {
        return fish(&args);
    }
    let dev = device(&args.device)?;
    let ckpt = Checkpoint::open(&args.model)?;
    let t0 = Instant::now();
    let quantization =
        QuantizationSpec::parse(&args.quantization.replace('-', "_")).with_context(|| {
            format!(
                "--quantization {:?} (auto | none | q8-0 | q4-k)",
                args.quantization
            )
        })?;
    let model = ArModel::load_with(&ckpt, &dev, dtype(&args.dtype)?, quantization)?;
    eprintln!(
        "loaded {} ({}) in {:.2} s; weights: {}",
        args.model.display(),
        model.variant(),
        t0.elapsed().as_secs_f64(),
        WeightForm::summary(&model.weight_forms())
    );

    let mut sampling = SamplingParams::from_generation_config(&ckpt.generation);
    sampling.seed = args.seed;
    if let Some(n) = args.max_new_tokens {
        sampling.max_new_tokens = n;
    }
    if args.greedy {
        sampling = sampling.greedy();
    }
    let voice_clone = match &args.ref_audio {
        Some(location) => {
            let audio = decode_ref_audio(location, MAX_REF_AUDIO_SAMPLES)
                .with_context(|| format!("reference audio {location}"))?;
            let t = Instant::now();
            let vc = model
                .create_voice_clone_prompt(&audio, args.ref_text.as_deref(), args.x_vector_only)
                .with_context(|| format!("reference audio {location}"))?;
            eprintln!(
                "voice clone prompt ({}, {} reference frames) in {:.2} s",
                if vc.icl { "ICL" } else { "x-vector only" },
                vc.ref_frames(),
                t.elapsed().as_secs_f64()
            );
            Some(vc)
        }
        None if args.ref_text.is_some() || args.x_vector_only => {
            bail!("--ref-text / --x-vector-only need --ref-audio")
        }
        None => None,
    };
    let req = VoiceRequest {
        text: args.text.clone(),
        speaker: args.speaker.clone(),
        language: args.language.clone(),
        instruct: args.instruct.clone(),
        prompt_mode: args.prompt_mode,
        voice_clone,
    };

    let t1 = Instant::now();
    let mut session = model.start(&req, &sampling)?;
    let ref_codes: Vec<Vec<u32>> = session.ref_codes().map(<[_]>::to_vec).unwrap_or_default();
    let mut frames: Vec<Vec<u32>> = Vec::new();
    let reason = loop {
        match session.next_frame()? {
            ArStep::Frame(f) => frames.push(f),
            ArStep::Finished(r) => break r,
        }
    };
    let ar_s = t1.elapsed().as_secs_f64();

    if let Some(path) = &args.codes_out {
        std::fs::write(path, serde_json::to_string(&frames)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }

    let t2 = Instant::now();
    let code2wav = Code2Wav::load(&args.model, &dev)?;
    // The reference's own offline decode (300-frame windows, 25 frames of context), so the WAV
    // equals what the official `generate_*` call returns.
    // For Base ICL the reference codes are the decoder's left context: decode them with the
    // utterance, then drop exactly their samples.
    let all: Vec<Vec<u32>> = ref_codes.iter().chain(&frames).cloned().collect();
    let mut wav =
        code2wav.decode_chunked(&all, REFERENCE_CHUNK_FRAMES, REFERENCE_LEFT_CONTEXT_FRAMES)?;
    wav.drain(..ref_codes.len() * code2wav.samples_per_frame());
    Timing::until_now(t0, ar_s, t2).print(
        frames.len(),
        wav.len(),
        code2wav.sample_rate(),
        "stage 0",
        "Code2Wav",
    );
    println!("finish reason: {reason:?}");

    if let Some(path) = &args.wav_out {
        write_pcm(path, &wav, code2wav.sample_rate())?;
    }
    Ok(())
}

/// Fish S2 Pro: the reference's `generate_long` (the text's speaker-turn batches, earlier
/// batches kept in the prompt), then the codec's whole decode.
fn fish(args: &Args) -> Result<()> {
    let qwen_only = [
        ("--speaker", args.speaker.is_some()),
        ("--language", args.language.is_some()),
        ("--instruct", args.instruct.is_some()),
        ("--prompt-mode", args.prompt_mode.is_some()),
        ("--x-vector-only", args.x_vector_only),
        // Fish S2 Pro loads dense weights: none is what it has.
        (
            "--quantization",
            !matches!(args.quantization.as_str(), "auto" | "none"),
        ),
    ];
    if let Some((flag, _)) = qwen_only.iter().find(|(_, set)| *set) {
        bail!(
            "{flag}: a Qwen3-TTS option; Fish S2 Pro ({}) has none",
            args.model.display()
        );
    }
    // The engine's rules for a request (the reference speaks such text all the same, as noise).
    if let Some(why) = unspeakable(&args.text) {
        bail!("invalid request: text = {:?}: {why}", args.text);
    }
    if let Some(t) = &args.ref_text
        && let Some(why) = unspeakable(t)
    {
        bail!("invalid request: ref_text = {t:?}: {why}");
    }
    if args.max_new_tokens == Some(0) {
        bail!("--max-new-tokens: must be at least 1");
    }
    let dev = device(&args.device)?;
    let t0 = Instant::now();
    let model = FishModel::load(&args.model, &dev, dtype(&args.dtype)?)?;
    let codec = Codec::load(&args.model, &dev)?;
    eprintln!(
        "loaded {} (Fish S2 Pro) in {:.2} s",
        args.model.display(),
        t0.elapsed().as_secs_f64()
    );
    let voice = match &args.ref_audio {
        Some(location) => {
            let audio = decode_ref_audio_at(location, FISH_MAX_REF_SAMPLES, codec.sample_rate())
                .with_context(|| format!("reference audio {location}"))?;
            let transcript = args
                .ref_text
                .clone()
                .context("--ref-audio needs --ref-text (its transcript) for Fish S2 Pro")?;
            Some(VoiceReference {
                codes: codec.encode(&audio)?,
                transcript,
            })
        }
        None if args.ref_text.is_some() => bail!("--ref-text needs --ref-audio"),
        None => None,
    };
    let opts = GenerateOptions {
        sampling: if args.greedy {
            FishSampling::GREEDY
        } else {
            FishSampling::REFERENCE_DEFAULT
        },
        max_new_tokens: args.max_new_tokens.unwrap_or(0),
        seed: args.seed,
    };
    let t1 = Instant::now();
    let codes = model.synthesize_codes(&args.text, voice.as_ref(), &opts)?;
    let ar_s = t1.elapsed().as_secs_f64();
    let frames: Vec<Vec<u32>> = (0..codes.first().map_or(0, Vec::len))
        .map(|i| codes.iter().map(|c| c[i]).collect())
        .collect();
    if let Some(path) = &args.codes_out {
        std::fs::write(path, serde_json::to_string(&frames)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let t2 = Instant::now();
    let wav = codec.decode(&codes)?;
    Timing::until_now(t0, ar_s, t2).print(
        frames.len(),
        wav.len(),
        codec.sample_rate(),
        "slow + fast AR",
        "codec",
    );
    if let Some(path) = &args.wav_out {
        write_pcm(path, &wav, codec.sample_rate())?;
    }
    Ok(())
}

/// Where a synthesis' time went, seconds: all of it, stage 0's frames, the codec's decode.
struct Timing {
    total_s: f64,
    ar_s: f64,
    decode_s: f64,
}

impl Timing {
    /// The times of a synthesis that started at `start`, whose frames took `ar_s` and whose
    /// decode started at `decode_start`, both ending now.
    fn until_now(start: Instant, ar_s: f64, decode_start: Instant) -> Self {
        Self {
            total_s: start.elapsed().as_secs_f64(),
            ar_s,
            decode_s: decode_start.elapsed().as_secs_f64(),
        }
    }

    /// Prints the frames, the audio's length (`samples` at `rate` Hz) and the times, naming the
    /// two parts `ar` and `decoder`.
    fn print(&self, frames: usize, samples: usize, rate: u32, ar: &str, decoder: &str) {
        let audio_s = samples as f64 / rate as f64;
        println!("frames: {frames}");
        println!("audio seconds: {audio_s:.2}");
        println!(
            "wall time: {:.2} s ({ar}: {:.2} s, {:.1} ms/frame; {decoder}: {:.2} s; RTF {:.2})",
            self.total_s,
            self.ar_s,
            1000.0 * self.ar_s / frames.max(1) as f64,
            self.decode_s,
            (self.ar_s + self.decode_s) / audio_s.max(f64::EPSILON)
        );
    }
}

/// Writes `samples` (mono, [-1, 1]) as a 32-bit float WAV at `sample_rate` Hz.
fn write_pcm(path: &std::path::Path, samples: &[f32], sample_rate: u32) -> Result<()> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 32,
        sample_format: hound::SampleFormat::Float,
    };
    let mut w = hound::WavWriter::create(path, spec)
        .with_context(|| format!("creating {}", path.display()))?;
    for &x in samples {
        w.write_sample(x)?;
    }
    w.finalize()
        .with_context(|| format!("writing {}", path.display()))?;
    println!(
        "wav: {} ({} samples, {:.2} s)",
        path.display(),
        samples.len(),
        samples.len() as f64 / sample_rate as f64
    );
    Ok(())
}
