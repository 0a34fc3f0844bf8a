//! Qwen3-TTS (12 Hz family) in candle, loading the published checkpoints unchanged.
//!
//! Stage 0 ([`ArModel`]): text tokenizer, dual-track prompt, talker and code predictor, producing
//! codec frames of `num_code_groups` codes. Stage 1 (`code2wav`): the codec decoder.
//!
//! Reference: QwenLM/Qwen3-TTS `qwen_tts/core/models/modeling_qwen3_tts.py`,
//! `qwen_tts/inference/qwen3_tts_model.py` and
//! `qwen_tts/core/tokenizer_12hz/modeling_qwen3_tts_tokenizer_v2.py`; the spec is
//! docs/qwen3-tts.md.

pub mod code2wav;
pub mod code_predictor;
pub mod codec_encoder;
pub mod config;
pub mod device_sampler;
pub mod mel;
pub mod prompt;
pub mod sampling;
pub mod speaker_encoder;
pub mod talker;
pub mod talker_graphs;
pub mod tokenizer;

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

pub use config::{GenerationConfig, ModelVariant, Qwen3TtsConfig};
pub use prompt::{CodecPart, Prompt, PromptRow, ResolvedRequest, VoiceClonePrompt};

use crate::nn::{LayerCaches, WeightError, Weights};
use code_predictor::CodePredictor;
use codec_encoder::CodecEncoder;
use sampling::{TalkerProcessors, TokenChooser};
use speaker_encoder::{EcapaConfig, SpeakerEncoder};
use talker::Talker;
use talker_graphs::TalkerGraphs;
use tokenizer::TextTokenizer;

/// Errors of loading and running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {msg}")]
    Json { path: PathBuf, msg: String },
    #[error("{file}: missing tensor `{name}`")]
    MissingTensor { file: PathBuf, name: String },
    #[error("{file}: tensor `{name}` has shape {got:?}, expected {expected:?}")]
    Shape {
        file: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    #[error("{file}: field `{field}`: {msg}")]
    Config {
        file: PathBuf,
        field: String,
        msg: String,
    },
    #[error("invalid request: {field} = {value:?}: {msg}")]
    InvalidRequest {
        field: String,
        value: String,
        msg: String,
    },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl From<WeightError> for ModelError {
    fn from(e: WeightError) -> Self {
        match e {
            WeightError::Missing { file, name } => ModelError::MissingTensor { file, name },
            WeightError::Shape {
                file,
                name,
                expected,
                got,
            } => ModelError::Shape {
                file,
                name,
                expected,
                got,
            },
            WeightError::Load { file, name, source } => ModelError::Candle(
                candle_core::Error::Msg(format!("{}: tensor `{name}`: {source}", file.display())),
            ),
        }
    }
}

/// A checkpoint directory, JSON parsed and validated (no weights loaded yet).
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Qwen3TtsConfig,
    pub generation: GenerationConfig,
}

impl Checkpoint {
    /// Reads `config.json` and `generation_config.json` (both required, as in the reference).
    pub fn open(dir: &Path) -> Result<Checkpoint, ModelError> {
        let config = Qwen3TtsConfig::from_file(&dir.join("config.json"))?;
        let generation = GenerationConfig::from_file(&dir.join("generation_config.json"))?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            generation,
        })
    }

    /// The weight files: `model.safetensors`, or the shards listed by
    /// `model.safetensors.index.json`. Returns `(files, path for messages)`.
    fn weight_files(&self) -> Result<(Vec<PathBuf>, PathBuf), ModelError> {
        let single = self.dir.join("model.safetensors");
        if single.is_file() {
            return Ok((vec![single.clone()], single));
        }
        let index = self.dir.join("model.safetensors.index.json");
        if index.is_file() {
            let v = config::read_json(&index)?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| ModelError::Config {
                    file: index.clone(),
                    field: "weight_map".into(),
                    msg: "missing or not an object".into(),
                })?;
            let mut files: Vec<PathBuf> = Vec::new();
            for (name, f) in map {
                let f = f.as_str().ok_or_else(|| ModelError::Config {
                    file: index.clone(),
                    field: format!("weight_map.{name}"),
                    msg: "expected a file name".into(),
                })?;
                let p = self.dir.join(f);
                if !files.contains(&p) {
                    files.push(p);
                }
            }
            files.sort();
            return Ok((files, index));
        }
        Err(ModelError::Io {
            path: single,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no model weights"),
        })
    }
}

/// Where the text goes: all in the prefill (`NonStreaming`) or one token per frame (`Streaming`,
/// the reference's `non_streaming_mode=False`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptMode {
    Streaming,
    NonStreaming,
}

impl std::str::FromStr for PromptMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "streaming" => Ok(PromptMode::Streaming),
            "non-streaming" | "nonstreaming" => Ok(PromptMode::NonStreaming),
            other => Err(format!(
                "unknown prompt mode {other:?} (streaming | non-streaming)"
            )),
        }
    }
}

/// What to say and how. `None` fields take the reference default for the variant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VoiceRequest {
    pub text: String,
    /// CustomVoice preset speaker (case-insensitive). `None`/empty: no speaker row.
    pub speaker: Option<String>,
    /// Language (case-insensitive name, or its ISO 639-1 code: `en`, `zh`, …); `None` = `auto`.
    pub language: Option<String>,
    /// Instruct / voice description (CustomVoice 1.7B, VoiceDesign); ignored for 0.6B
    /// CustomVoice like the reference wrapper.
    pub instruct: Option<String>,
    /// `None` = the variant's reference default (non-streaming for CustomVoice/VoiceDesign,
    /// streaming for Base).
    pub prompt_mode: Option<PromptMode>,
    /// Base checkpoints: the voice to clone (required for Base, refused otherwise); see
    /// [`ArModel::create_voice_clone_prompt`].
    pub voice_clone: Option<VoiceClonePrompt>,
}

/// Decoding parameters (reference `generate` kwargs).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub do_sample: bool,
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
    pub repetition_penalty: f64,
    pub subtalker_do_sample: bool,
    pub subtalker_temperature: f64,
    pub subtalker_top_k: usize,
    pub subtalker_top_p: f64,
    /// Maximum codebook-0 tokens sampled (frames = tokens − 1 when the limit is hit).
    pub max_new_tokens: usize,
    /// Seed of the ChaCha20 stream used for all sampling of one utterance.
    pub seed: u64,
}

impl SamplingParams {
    /// The checkpoint's `generation_config.json` values (seed 0).
    pub fn from_generation_config(g: &GenerationConfig) -> Self {
        Self {
            do_sample: g.do_sample,
            temperature: g.temperature,
            top_k: g.top_k,
            top_p: g.top_p,
            repetition_penalty: g.repetition_penalty,
            subtalker_do_sample: g.subtalker_dosample,
            subtalker_temperature: g.subtalker_temperature,
            subtalker_top_k: g.subtalker_top_k,
            subtalker_top_p: g.subtalker_top_p,
            max_new_tokens: g.max_new_tokens,
            seed: 0,
        }
    }

    /// Greedy for both the talker and the code predictor (the exact-parity setting).
    pub fn greedy(mut self) -> Self {
        self.do_sample = false;
        self.subtalker_do_sample = false;
        self
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &str, value: String, msg: &str| ModelError::InvalidRequest {
            field: field.into(),
            value,
            msg: msg.into(),
        };
        if self.max_new_tokens == 0 {
            return Err(bad("max_new_tokens", "0".into(), "must be at least 1"));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(bad(
                "repetition_penalty",
                self.repetition_penalty.to_string(),
                "must be > 0",
            ));
        }
        for (on, name, t, p) in [
            (self.do_sample, "", self.temperature, self.top_p),
            (
                self.subtalker_do_sample,
                "subtalker_",
                self.subtalker_temperature,
                self.subtalker_top_p,
            ),
        ] {
            if on && !(t > 0.0 && t.is_finite()) {
                return Err(bad(
                    &format!("{name}temperature"),
                    t.to_string(),
                    "must be > 0 when sampling",
                ));
            }
            if on && !(p > 0.0 && p <= 1.0) {
                return Err(bad(
                    &format!("{name}top_p"),
                    p.to_string(),
                    "must be in (0, 1]",
                ));
            }
        }
        Ok(())
    }
}

/// Why an utterance ended (model level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// Codebook 0 produced the codec EOS id.
    Eos,
    /// `max_new_tokens` codebook-0 tokens were sampled.
    Length,
}

/// Result of one [`ArSession::next_frame`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArStep {
    /// One codec frame: `num_code_groups` codes, each below the codebook size.
    Frame(Vec<u32>),
    Finished(FinishReason),
}

/// Stage 0: talker + code predictor + text tokenizer, on one device/dtype.
pub struct ArModel {
    config: Qwen3TtsConfig,
    tokenizer: TextTokenizer,
    talker: Talker,
    code_predictor: CodePredictor,
    /// `T(tts_pad)`, `T(tts_bos)`, `T(tts_eos)`: `[1, hidden]` each, computed once.
    tts_pad_embed: Tensor,
    /// Base only: `speaker_encoder.*` (f32) and the codec encoder (`speech_tokenizer/`, f32).
    speaker_encoder: Option<SpeakerEncoder>,
    codec_encoder: Option<CodecEncoder>,
    device: Device,
    dtype: DType,
    /// The code predictor's frame as CUDA graphs, when enabled ([`ArModel::enable_cuda_graphs`]).
    cp_graphs: Option<std::sync::Mutex<code_predictor::CpGraphs>>,
    /// The talker's decode step at a device-side position (graphs captured on CUDA), with its own
    /// KV cache: leased by one session at a time (`None` while leased or when not enabled).
    talker_graphs: std::sync::Mutex<Option<TalkerGraphs>>,
}

/// Positions (prompt + frames) of the KV cache that the talker decode graphs own
/// ([`ArModel::enable_cuda_graphs`]); a longer utterance continues eagerly past it.
pub const TALKER_GRAPH_POSITIONS: usize = 4096;

/// Shortest reference audio [`ArModel::create_voice_clone_prompt`] accepts: 0.5 s at 24 kHz.
pub const MIN_REF_AUDIO_SAMPLES: usize = 12_000;
/// Longest reference audio: 60 s at 24 kHz (750 codec frames of prompt and decoder context).
pub const MAX_REF_AUDIO_SAMPLES: usize = 60 * 24_000;
/// A reference whose peak |sample| is below this (−60 dBFS) is rejected as silent.
pub const SILENT_REF_PEAK: f32 = 1e-3;

impl ArModel {
    /// The talker's next decode input `[1, 1, hidden]` (model dtype) after frame `codes`
    /// (`num_code_groups` codes): `C(a0) + Σ_q cp_table[q](a_{q+1})`, summed in f32 in codebook
    /// order and rounded, `+ text` (`[1, hidden]`: the frame's trailing text row or `T(tts_pad)`),
    /// as the reference's `inputs_embeds` of a decode step. `c0` = `C(a0)` `[1, hidden]`, already
    /// looked up for the code predictor. On CUDA one upload and one kernel (`embed_sum`).
    fn talker_input(
        &self,
        codes: &[u32],
        c0: &Tensor,
        text: &Tensor,
    ) -> candle_core::Result<Tensor> {
        #[cfg(feature = "cuda")]
        if crate::nn::cuda_kernels::all_usable_for(text)
            && text.is_contiguous()
            && text.dtype() == self.dtype
            && codes.len() <= crate::nn::cuda_kernels::embed_sum::MAX_TABLES
        {
            let mut tables = vec![self.talker.model.codec_embedding.embeddings()];
            tables.extend(
                self.code_predictor
                    .model
                    .codec_embedding
                    .iter()
                    .map(|e| e.embeddings()),
            );
            if tables.len() == codes.len() {
                return crate::nn::cuda_kernels::embed_sum::embed_sum(codes, &tables, text);
            }
        }
        let mut parts = vec![c0.clone()];
        for (q, &c) in codes.iter().skip(1).enumerate() {
            parts.push(self.code_predictor.codec_embed(q, c)?);
        }
        let sum = Tensor::cat(&parts, 0)?
            .to_dtype(DType::F32)?
            .sum_keepdim(0)?
            .to_dtype(self.dtype)?;
        (sum + text)?.unsqueeze(0)
    }

    /// Loads the tokenizer and the `talker.*` weights (converted to `dtype`) onto `device`.
    /// Unknown tensors (e.g. `speaker_encoder.*`) are ignored; a missing tensor or a wrong shape
    /// is an error naming the file and tensor.
    pub fn load(ckpt: &Checkpoint, device: &Device, dtype: DType) -> Result<ArModel, ModelError> {
        let config = ckpt.config.clone();
        let tokenizer = TextTokenizer::from_dir(&ckpt.dir)?;
        let (files, display) = ckpt.weight_files()?;
        let w = Weights::from_files(&files, &display, device, dtype)?;
        let talker = Talker::new(&config.talker_config, &w.pp("talker"))?;
        let code_predictor =
            CodePredictor::new(&config.talker_config, &w.pp("talker.code_predictor"))?;
        let tts_pad_embed = talker.text_embed(&[config.tts_pad_token_id])?;
        // Base: the voice-clone front end, kept in f32 whatever the talker dtype (it runs once
        // per reference; the x-vector is cast to the talker dtype in the prompt).
        let (speaker_encoder, codec_encoder) = if config.variant == ModelVariant::Base {
            let sc = config
                .speaker_encoder_config
                .as_ref()
                .ok_or_else(|| ModelError::Config {
                    file: ckpt.dir.join("config.json"),
                    field: "speaker_encoder_config".into(),
                    msg: "missing (a Base checkpoint needs its speaker encoder)".into(),
                })?;
            let ecfg = EcapaConfig::from_config(&ckpt.dir.join("config.json"), sc)?;
            if ecfg.enc_dim != config.talker_config.transformer.hidden_size {
                return Err(ModelError::Config {
                    file: ckpt.dir.join("config.json"),
                    field: "speaker_encoder_config.enc_dim".into(),
                    msg: format!(
                        "{} must equal the talker hidden size {}",
                        ecfg.enc_dim, config.talker_config.transformer.hidden_size
                    ),
                });
            }
            let se = SpeakerEncoder::new(&ecfg, &w.with_dtype(DType::F32).pp("speaker_encoder"))?;
            let ce = CodecEncoder::load(&ckpt.dir, device)?;
            (Some(se), Some(ce))
        } else {
            (None, None)
        };
        Ok(ArModel {
            config,
            tokenizer,
            talker,
            code_predictor,
            tts_pad_embed,
            speaker_encoder,
            codec_encoder,
            device: device.clone(),
            dtype,
            cp_graphs: None,
            talker_graphs: std::sync::Mutex::new(None),
        })
    }

    /// Captures the code predictor's frame as CUDA graphs, replayed by every later frame instead
    /// of launching each kernel (same kernels, same data: identical logits; by default one graph per
    /// frame with the codes chosen on the device, one graph per step with `OMNITTS_CP_FRAME_GRAPH=0`,
    /// see `CpGraphs`). Call it
    /// once at start-up, before serving (capture needs the stream to itself). On error nothing
    /// changes and frames keep running eagerly. Errors: not a CUDA device, a build without the
    /// `cuda` feature, or a failed capture (the message names the CUDA call).
    ///
    /// Two sets are captured: the code predictor's frame, and the talker's decode step (one
    /// graph per attention bucket over an owned KV cache of [`TALKER_GRAPH_POSITIONS`] positions;
    /// see `talker_graphs.rs`). One utterance at a time replays the talker graphs; others run
    /// eagerly meanwhile.
    pub fn enable_cuda_graphs(&mut self) -> Result<(), ModelError> {
        let cp = self.code_predictor.capture_graphs(self.dtype)?;
        let mut talker = TalkerGraphs::new(&self.talker, self.dtype, TALKER_GRAPH_POSITIONS)?;
        talker.capture(&self.talker)?;
        self.cp_graphs = Some(std::sync::Mutex::new(cp));
        self.talker_graphs = std::sync::Mutex::new(Some(talker));
        Ok(())
    }

    /// The talker decode step at a device-side position without capturing graphs (any device):
    /// the graphs' work run directly, so tests can compare it with the eager step.
    #[cfg(test)]
    fn enable_slot_decode(&mut self, positions: usize) -> Result<(), ModelError> {
        let g = TalkerGraphs::new(&self.talker, self.dtype, positions)?;
        self.talker_graphs = std::sync::Mutex::new(Some(g));
        Ok(())
    }

    /// Back to eager execution (drops the graphs).
    pub fn disable_cuda_graphs(&mut self) {
        self.cp_graphs = None;
        self.talker_graphs = std::sync::Mutex::new(None);
    }

    /// Whether frames replay CUDA graphs.
    pub fn cuda_graphs_enabled(&self) -> bool {
        self.cp_graphs.is_some()
    }

    /// Leases the talker decode graphs for an utterance of `prefill_len` prompt positions, if
    /// enabled, free and large enough.
    fn lease_talker_graphs(&self, prefill_len: usize) -> Option<TalkerGraphs> {
        let mut slot = self.talker_graphs.lock().ok()?;
        match slot.take() {
            Some(g) if prefill_len < g.capacity() => Some(g),
            other => {
                *slot = other;
                None
            }
        }
    }

    fn return_talker_graphs(&self, g: TalkerGraphs) {
        if let Ok(mut slot) = self.talker_graphs.lock() {
            *slot = Some(g);
        }
    }

    pub fn config(&self) -> &Qwen3TtsConfig {
        &self.config
    }

    pub fn variant(&self) -> ModelVariant {
        self.config.variant
    }

    pub fn num_code_groups(&self) -> usize {
        self.config.talker_config.num_code_groups
    }

    /// Preset speakers (lower case; empty unless CustomVoice).
    pub fn speakers(&self) -> Vec<String> {
        self.config.supported_speakers()
    }

    /// Accepted languages: `auto` plus the non-dialect languages (lower case).
    pub fn languages(&self) -> Vec<String> {
        self.config.supported_languages()
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// Resolves, tokenizes and builds the prompt plan of `req` (no model computation).
    pub fn plan(&self, req: &VoiceRequest) -> Result<Prompt, ModelError> {
        let r = prompt::resolve(&self.config, req)?;
        let input_ids = self.tokenizer.encode(&r.assistant_text)?;
        let instruct_ids = match &r.instruct_text {
            Some(t) => Some(self.tokenizer.encode(t)?),
            None => None,
        };
        let ref_ids = match &r.ref_text {
            Some(t) => Some(self.tokenizer.encode(t)?),
            None => None,
        };
        let mut p = Prompt::build_with_ref(&self.config, &r, input_ids, instruct_ids, ref_ids)?;
        p.voice_clone = req.voice_clone.clone();
        Ok(p)
    }

    /// `[1, rows, hidden]`: `T(text) + codec part` for each prompt row (`C(id)`, the x-vector,
    /// or the 16-way sum of a reference frame's code embeddings; nothing for role/instruct rows).
    pub fn prompt_embeds(&self, p: &Prompt) -> Result<Tensor, ModelError> {
        let text_ids: Vec<u32> = p.rows.iter().map(|r| r.text).collect();
        let text = self.talker.text_embed(&text_ids)?;
        // One table of codec vectors, indexed per row: [C(id rows); zero; x-vector?; frames?].
        let ids: Vec<u32> = p.rows.iter().filter_map(|r| r.codec.id()).collect();
        let d = self.talker.hidden_size();
        let mut table = vec![self.talker.codec_embed(&ids)?];
        let zero = ids.len();
        table.push(Tensor::zeros((1, d), self.dtype, &self.device)?);
        let xvec_row = zero + 1;
        let needs = |f: fn(&CodecPart) -> bool| p.rows.iter().any(|r| f(&r.codec));
        let vc = p.voice_clone.as_ref();
        let missing = |what: &str| ModelError::InvalidRequest {
            field: "voice_clone".into(),
            value: "None".into(),
            msg: format!("the prompt has {what} rows but no voice-clone prompt"),
        };
        if needs(|c| matches!(c, CodecPart::XVector)) {
            let vc = vc.ok_or_else(|| missing("x-vector"))?;
            let x = Tensor::from_slice(&vc.x_vector, (1, vc.x_vector.len()), &self.device)?;
            table.push(x.to_dtype(self.dtype)?);
        }
        let frames_row = zero + table.len() - 1;
        if needs(|c| matches!(c, CodecPart::RefFrame(_))) {
            let codes = vc
                .and_then(|v| v.ref_codes.as_ref())
                .ok_or_else(|| missing("reference-frame"))?;
            table.push(self.ref_frame_embeds(codes)?);
        }
        let idx: Vec<u32> = {
            let mut next_id = 0u32;
            p.rows
                .iter()
                .map(|r| match r.codec {
                    CodecPart::Id(_) => {
                        next_id += 1;
                        next_id - 1
                    }
                    CodecPart::None => zero as u32,
                    CodecPart::XVector => xvec_row as u32,
                    CodecPart::RefFrame(f) => (frames_row + f) as u32,
                })
                .collect()
        };
        let n = idx.len();
        let table = Tensor::cat(&table, 0)?;
        let codec = table.index_select(&Tensor::from_vec(idx, n, &self.device)?, 0)?;
        Ok((text + codec)?.unsqueeze(0)?)
    }

    /// `Σ_q Emb_q(codes[f][q])` for each reference frame: `[frames, hidden]` in the model dtype
    /// (reference `generate_icl_prompt`; `Emb_0` = talker codec embedding, `Emb_q` = code
    /// predictor table q−1). Summed in f32.
    fn ref_frame_embeds(&self, codes: &[Vec<u32>]) -> Result<Tensor, ModelError> {
        let groups = self.num_code_groups();
        let column = |q: usize| -> Vec<u32> { codes.iter().map(|f| f[q]).collect() };
        let mut sum = self.talker.codec_embed(&column(0))?.to_dtype(DType::F32)?;
        for q in 1..groups {
            let ids = Tensor::new(column(q).as_slice(), &self.device)?;
            let e = candle_core::Module::forward(
                &self.code_predictor.model.codec_embedding[q - 1],
                &ids,
            )?;
            sum = (sum + e.to_dtype(DType::F32)?)?;
        }
        Ok(sum.to_dtype(self.dtype)?)
    }

    /// The Base speaker encoder (`None` for other variants).
    pub fn speaker_encoder(&self) -> Option<&SpeakerEncoder> {
        self.speaker_encoder.as_ref()
    }

    /// The Base codec encoder (`None` for other variants).
    pub fn codec_encoder(&self) -> Option<&CodecEncoder> {
        self.codec_encoder.as_ref()
    }

    /// Builds a voice-clone prompt from reference audio, like the reference wrapper's
    /// `create_voice_clone_prompt` (`inference/qwen3_tts_model.py`): the x-vector of the speaker
    /// encoder and, unless `x_vector_only`, the reference codes (codec encoder,
    /// `ceil(samples / 1920)` frames) and `ref_text` for ICL.
    ///
    /// `audio_24k`: mono samples at 24 kHz, nominally in [-1, 1] (resample first).
    ///
    /// Errors ([`ModelError::InvalidRequest`]): not a Base checkpoint (`model`); audio shorter
    /// than [`MIN_REF_AUDIO_SAMPLES`] (0.5 s) or longer than [`MAX_REF_AUDIO_SAMPLES`] (60 s),
    /// non-finite samples, or silent (peak below [`SILENT_REF_PEAK`], −60 dBFS) (`ref_audio`);
    /// missing/empty `ref_text` in ICL mode (`ref_text`).
    pub fn create_voice_clone_prompt(
        &self,
        audio_24k: &[f32],
        ref_text: Option<&str>,
        x_vector_only: bool,
    ) -> Result<VoiceClonePrompt, ModelError> {
        let bad = |field: &str, value: String, msg: String| ModelError::InvalidRequest {
            field: field.into(),
            value,
            msg,
        };
        let (Some(se), Some(ce)) = (&self.speaker_encoder, &self.codec_encoder) else {
            return Err(bad(
                "model",
                self.config.tts_model_type.clone(),
                "voice cloning needs a Base checkpoint".into(),
            ));
        };
        let n = audio_24k.len();
        let secs = |n: usize| n as f64 / 24_000.0;
        if n < MIN_REF_AUDIO_SAMPLES {
            return Err(bad(
                "ref_audio",
                format!("{n} samples ({:.2} s)", secs(n)),
                format!(
                    "reference audio too short (at least {MIN_REF_AUDIO_SAMPLES} samples = {:.1} s at 24 kHz)",
                    secs(MIN_REF_AUDIO_SAMPLES)
                ),
            ));
        }
        if n > MAX_REF_AUDIO_SAMPLES {
            return Err(bad(
                "ref_audio",
                format!("{n} samples ({:.2} s)", secs(n)),
                format!(
                    "reference audio too long (at most {MAX_REF_AUDIO_SAMPLES} samples = {:.0} s at 24 kHz)",
                    secs(MAX_REF_AUDIO_SAMPLES)
                ),
            ));
        }
        if let Some(i) = audio_24k.iter().position(|x| !x.is_finite()) {
            return Err(bad(
                "ref_audio",
                format!("sample {i} = {}", audio_24k[i]),
                "non-finite sample".into(),
            ));
        }
        let peak = audio_24k.iter().fold(0f32, |m, x| m.max(x.abs()));
        if peak < SILENT_REF_PEAK {
            return Err(bad(
                "ref_audio",
                format!("peak {peak:e}"),
                format!("reference audio is silent (peak below {SILENT_REF_PEAK:e}, −60 dBFS)"),
            ));
        }
        let ref_text = ref_text.filter(|t| !t.trim().is_empty());
        if !x_vector_only && ref_text.is_none() {
            return Err(bad(
                "ref_text",
                String::new(),
                "ICL voice cloning needs the transcript of the reference audio (or use x-vector-only mode)"
                    .into(),
            ));
        }
        let x_vector = se.embed_audio(audio_24k)?.to_vec1::<f32>()?;
        let ref_codes = if x_vector_only {
            None
        } else {
            Some(ce.encode(audio_24k)?)
        };
        Ok(VoiceClonePrompt {
            ref_codes,
            x_vector,
            ref_text: if x_vector_only {
                None
            } else {
                ref_text.map(str::to_string)
            },
            icl: !x_vector_only,
        })
    }

    /// Validates the request (unknown speaker/language, empty text, a prompt beyond the talker's
    /// position budget → [`ModelError::InvalidRequest`] naming the field and value), tokenizes,
    /// builds the dual-track prompt and runs the prefill.
    pub fn start(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
    ) -> Result<ArSession<'_>, ModelError> {
        self.start_until(req, sampling, &|| false)
    }

    /// [`Self::start`] whose prefill asks `stop` before each chunk of
    /// [`PREFILL_CHUNK`](crate::nn::transformer::PREFILL_CHUNK) prompt positions and gives up with
    /// an error ([`PREFILL_STOPPED`](crate::nn::transformer::PREFILL_STOPPED)) when it answers
    /// true: the engine's cancel, so a long prompt does not hold up a cancelled request.
    pub fn start_until(
        &self,
        req: &VoiceRequest,
        sampling: &SamplingParams,
        stop: &dyn Fn() -> bool,
    ) -> Result<ArSession<'_>, ModelError> {
        sampling.validate()?;
        let prompt = self.plan(req)?;
        prompt.check_position_budget(&self.config, &req.text, sampling.max_new_tokens)?;
        let prefill = self.prompt_embeds(&prompt)?;
        let trailing = self.talker.text_embed(&prompt.trailing)?;
        let (cache, (hidden, logits)) = match self.lease_talker_graphs(prompt.rows.len()) {
            Some(mut g) => match g.prefill(&self.talker, &prefill, stop) {
                Ok(out) => (TalkerCache::Graphs(g), out),
                Err(e) => {
                    self.return_talker_graphs(g);
                    return Err(e.into());
                }
            },
            None => {
                let mut cache = self
                    .talker
                    .new_cache(prompt.rows.len() + sampling.max_new_tokens.min(4096) + 1);
                let out = self.talker.forward_until(&prefill, &mut cache, stop)?;
                (TalkerCache::Own(cache), out)
            }
        };
        let tc = &self.config.talker_config;
        Ok(ArSession {
            model: self,
            processors: TalkerProcessors {
                repetition_penalty: sampling.repetition_penalty as f32,
                min_new_tokens: 2,
                eos: tc.codec_eos_token_id,
            },
            talker_chooser: TokenChooser {
                do_sample: sampling.do_sample,
                temperature: sampling.temperature as f32,
                top_k: sampling.top_k,
                top_p: sampling.top_p as f32,
            },
            cp_chooser: TokenChooser {
                do_sample: sampling.subtalker_do_sample,
                temperature: sampling.subtalker_temperature as f32,
                top_k: sampling.subtalker_top_k,
                top_p: sampling.subtalker_top_p as f32,
            },
            max_new_tokens: sampling.max_new_tokens,
            rng: ChaCha20Rng::seed_from_u64(sampling.seed),
            prompt,
            prefill,
            trailing,
            cache,
            cp_cache: self.code_predictor.new_cache(),
            hidden,
            logits,
            history: Vec::new(),
            frames: 0,
            finished: None,
            timing: StepTiming::default(),
        })
    }
}

/// The talker KV cache of a session: its own (eager steps), or the one of the leased decode graphs.
enum TalkerCache {
    Own(LayerCaches),
    Graphs(TalkerGraphs),
}

/// One utterance in progress: the talker KV cache and the sampling state. Dropping it gives
/// leased talker decode graphs back to the model.
pub struct ArSession<'a> {
    model: &'a ArModel,
    processors: TalkerProcessors,
    talker_chooser: TokenChooser,
    cp_chooser: TokenChooser,
    max_new_tokens: usize,
    rng: ChaCha20Rng,
    prompt: Prompt,
    prefill: Tensor,
    /// `[trailing.len(), hidden]`.
    trailing: Tensor,
    cache: TalkerCache,
    cp_cache: LayerCaches,
    /// Final-normed talker hidden state of the last position, `[1, 1, hidden]`.
    hidden: Tensor,
    /// Codec-head logits of the last position (f32).
    logits: Vec<f32>,
    /// Codebook-0 tokens sampled so far.
    history: Vec<u32>,
    frames: usize,
    finished: Option<FinishReason>,
    timing: StepTiming,
}

/// Wall-clock split of the last [`ArSession::next_frame`] that produced a frame, in ms. Both parts
/// end with a device-to-host copy of logits, so on a GPU they include the device work.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTiming {
    /// The code predictor's 15 steps (codebooks 1..), sampling included.
    pub code_predictor_ms: f64,
    /// The talker decode step that follows (input sum, 1 position, codec-head logits).
    pub talker_ms: f64,
}

impl ArSession<'_> {
    /// The prompt plan (token ids, rows, trailing text ids).
    pub fn prompt_ids(&self) -> &Prompt {
        &self.prompt
    }

    /// The prefill `inputs_embeds`, `[1, rows, hidden]` in the model dtype.
    pub fn prefill_embeds(&self) -> &Tensor {
        &self.prefill
    }

    /// The decode-time text vectors, `[trailing, hidden]`.
    pub fn trailing_embeds(&self) -> &Tensor {
        &self.trailing
    }

    pub fn frames_generated(&self) -> usize {
        self.frames
    }

    /// Base ICL: the reference frames in the prompt. They are the codec decoder's left context:
    /// decode `ref_codes ++ frames` (or prime a stream with them) and drop exactly
    /// `ref_frames × samples_per_frame` samples from the front. 0 otherwise.
    pub fn ref_frames(&self) -> usize {
        self.prompt.ref_frames
    }

    /// Base ICL: the reference codes `[ref_frames][num_code_groups]` (see [`Self::ref_frames`]).
    pub fn ref_codes(&self) -> Option<&[Vec<u32>]> {
        self.prompt
            .voice_clone
            .as_ref()
            .filter(|v| v.icl)
            .and_then(|v| v.ref_codes.as_deref())
    }

    /// The talker's codec-head logits (f32, `vocab_size` values, before any logits processor) that
    /// the next [`Self::next_frame`] samples codebook 0 from; right after [`ArModel::start`] these
    /// are the prefill logits. Empty once finished.
    pub fn pending_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Timing of the last frame (see [`StepTiming`]).
    pub fn last_timing(&self) -> StepTiming {
        self.timing
    }

    /// Codebook-0 tokens sampled so far (frames plus a final EOS/limit token).
    pub fn tokens_sampled(&self) -> usize {
        self.history.len() + usize::from(self.finished == Some(FinishReason::Eos))
    }

    /// One AR step: `Ok(ArStep::Frame(codes))` with `codes.len() == num_code_groups`, or
    /// `Ok(ArStep::Finished(reason))` (repeated on later calls). Frames exclude EOS; EOS is masked
    /// until 2 tokens exist; when `max_new_tokens` tokens have been sampled the last one gets no
    /// residual codes and is dropped (frames = tokens − 1), as in the reference.
    pub fn next_frame(&mut self) -> Result<ArStep, ModelError> {
        if let Some(r) = self.finished {
            return Ok(ArStep::Finished(r));
        }
        let mut logits = std::mem::take(&mut self.logits);
        self.processors.apply(&mut logits, &self.history);
        let a0 = self.talker_chooser.choose(&mut logits, &mut self.rng);
        if a0 == self.processors.eos {
            self.finished = Some(FinishReason::Eos);
            return Ok(ArStep::Finished(FinishReason::Eos));
        }
        self.history.push(a0);
        if self.history.len() >= self.max_new_tokens {
            self.finished = Some(FinishReason::Length);
            return Ok(ArStep::Finished(FinishReason::Length));
        }
        let m = self.model;
        let c0 = m.talker.codec_embed(&[a0])?; // [1, d]
        let chooser = self.cp_chooser;
        let rng = &mut self.rng;
        let t_cp = std::time::Instant::now();
        let code0_embed = c0.unsqueeze(0)?;
        let rest = match &m.cp_graphs {
            Some(graphs) => {
                let mut graphs = graphs.lock().map_err(|_| {
                    ModelError::Candle(candle_core::Error::Msg(
                        "code predictor CUDA graphs: lock poisoned by a panic".into(),
                    ))
                })?;
                m.code_predictor.generate_graphed(
                    &mut graphs,
                    &self.hidden,
                    &code0_embed,
                    &chooser,
                    rng,
                )?
            }
            None => m.code_predictor.generate(
                &self.hidden,
                &code0_embed,
                &mut self.cp_cache,
                |_, l| chooser.choose(l, rng),
            )?,
        };
        let t_talker = std::time::Instant::now();
        let mut codes = Vec::with_capacity(m.num_code_groups());
        codes.push(a0);
        codes.extend_from_slice(&rest);

        let n = self.frames;
        let text = if n < self.trailing.dim(0)? {
            self.trailing.narrow(0, n, 1)?
        } else {
            m.tts_pad_embed.clone()
        };
        let input = m.talker_input(&codes, &c0, &text)?;
        if let TalkerCache::Graphs(g) = &self.cache
            && !g.has_room()
        {
            // Past the graphs' cache: continue eagerly on a copy and free the graphs.
            let own = TalkerCache::Own(g.cache_copy());
            if let TalkerCache::Graphs(g) = std::mem::replace(&mut self.cache, own) {
                m.return_talker_graphs(g);
            }
        }
        let (hidden, logits) = match &mut self.cache {
            TalkerCache::Graphs(g) => g.step(&m.talker, &input)?,
            TalkerCache::Own(cache) => m.talker.forward(&input, cache)?,
        };
        self.hidden = hidden;
        self.logits = logits;
        self.frames += 1;
        let done = std::time::Instant::now();
        self.timing = StepTiming {
            code_predictor_ms: (t_talker - t_cp).as_secs_f64() * 1e3,
            talker_ms: (done - t_talker).as_secs_f64() * 1e3,
        };
        Ok(ArStep::Frame(codes))
    }

    /// Whether the talker's decode steps run on the leased decode graphs.
    pub fn uses_talker_graphs(&self) -> bool {
        matches!(self.cache, TalkerCache::Graphs(_))
    }

    /// Runs [`Self::next_frame`] to the end; returns the frames and the reason.
    pub fn run_to_end(&mut self) -> Result<(Vec<Vec<u32>>, FinishReason), ModelError> {
        let mut frames = Vec::new();
        loop {
            match self.next_frame()? {
                ArStep::Frame(f) => frames.push(f),
                ArStep::Finished(r) => return Ok((frames, r)),
            }
        }
    }
}

impl Drop for ArSession<'_> {
    fn drop(&mut self) {
        let own = TalkerCache::Own(LayerCaches::new(0, 1));
        if let TalkerCache::Graphs(g) = std::mem::replace(&mut self.cache, own) {
            self.model.return_talker_graphs(g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> (ArModel, GenerationConfig) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let ckpt = Checkpoint::open(&dir).expect("fixture checkpoint");
        let m = ArModel::load(&ckpt, &Device::Cpu, DType::F32).expect("load");
        (m, ckpt.generation)
    }

    /// Greedy codes, finish reason, the logits before every frame and the prompt length.
    fn generate(
        m: &ArModel,
        g: &GenerationConfig,
        req: &VoiceRequest,
        max: usize,
    ) -> (Vec<Vec<u32>>, FinishReason, Vec<Vec<f32>>, usize, bool) {
        let sampling = SamplingParams {
            max_new_tokens: max,
            ..SamplingParams::from_generation_config(g)
        }
        .greedy();
        let mut s = m.start(req, &sampling).expect("start");
        let prompt = s.prompt_ids().rows.len();
        let mut frames = Vec::new();
        let mut logits = vec![s.pending_logits().to_vec()];
        loop {
            match s.next_frame().expect("frame") {
                ArStep::Frame(f) => {
                    frames.push(f);
                    logits.push(s.pending_logits().to_vec());
                }
                ArStep::Finished(r) => {
                    return (frames, r, logits, prompt, s.uses_talker_graphs());
                }
            }
        }
    }

    /// A prompt longer than the prefill chunk runs in chunks with the result of one piece: the
    /// same hidden states and the same KV cache (checked through the decode step after it).
    #[test]
    fn chunked_prefill_equals_one_piece() {
        let (m, _) = fixture("tiny-customvoice");
        let hidden = m.config.talker_config.transformer.hidden_size;
        let (layers, rope) = (&m.talker.model.layers, m.talker.rope());
        let max_diff = |a: &Tensor, b: &Tensor| -> f32 {
            (a - b)
                .and_then(|d| d.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>())
                .expect("diff")
        };
        let x = Tensor::randn(0f32, 1f32, (1, 37, hidden), &Device::Cpu).expect("x");
        let (mut one, mut chunked) = (m.talker.new_cache(64), m.talker.new_cache(64));
        let a = one
            .run_in_chunks(layers, rope, &x, 37, &|| false)
            .expect("one piece");
        let b = chunked
            .run_in_chunks(layers, rope, &x, 8, &|| false)
            .expect("chunks");
        assert_eq!(b.dims(), &[1, 37, hidden]);
        assert_eq!(chunked.seq_len(), 37);
        let d = max_diff(&a, &b);
        assert!(d <= 1e-5, "prefill differs by {d}");
        let next = Tensor::randn(0f32, 1f32, (1, 1, hidden), &Device::Cpu).expect("next");
        let a = one
            .run(layers, rope, &next)
            .expect("decode after one piece");
        let b = chunked
            .run(layers, rope, &next)
            .expect("decode after chunks");
        let d = max_diff(&a, &b);
        assert!(d <= 1e-5, "decode after the prefill differs by {d}");
    }

    /// The code predictor's whole-frame CUDA graph work (`CodePredictor::frame_on_device`: codes
    /// chosen on the device and embedded for the next step), run directly on the CPU, gives
    /// `CodePredictor::generate`'s codes: greedy exactly; sampling with the uniforms drawn from
    /// the same ChaCha20 stream position, equal up to rare CDF-boundary roundings.
    #[test]
    fn device_frame_equals_host_frame() {
        use device_sampler::{DeviceSampler, frame_params};
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

    /// The talker decode step at a device-side position (the work the CUDA graphs capture: scatter
    /// into the KV slot, bucketed masked attention, RoPE rows by index) gives the eager step's
    /// greedy codes and logits, across bucket boundaries and past its capacity (eager fallback),
    /// and the lease returns to the model after every utterance.
    #[test]
    fn slot_decode_equals_eager_decode() {
        let mut fell_back = false;
        for name in ["tiny-customvoice", "tiny-voicedesign"] {
            let (eager, gen_cfg) = fixture(name);
            let (mut slot, _) = fixture(name);
            // Buckets 64, 128, 150: prompts of ~20-40 positions cross two boundaries in 90 frames,
            // and the 140-frame run outgrows the cache and finishes eagerly.
            slot.enable_slot_decode(150).expect("slot decode");
            let speaker = eager.speakers().into_iter().next();
            let instruct = (name == "tiny-voicedesign").then(|| "A calm low voice.".to_string());
            for (text, max) in [("Hello world, this is a test.", 90), ("Short.", 140)] {
                let req = VoiceRequest {
                    text: text.into(),
                    speaker: speaker.clone(),
                    language: Some("english".into()),
                    instruct: instruct.clone(),
                    ..VoiceRequest::default()
                };
                let (codes_e, reason_e, logits_e, prompt, _) =
                    generate(&eager, &gen_cfg, &req, max);
                let (codes_s, reason_s, logits_s, _, on_graphs) =
                    generate(&slot, &gen_cfg, &req, max);
                let positions = prompt + codes_e.len();
                assert!(
                    positions > 64,
                    "{name}: {positions} positions cross no bucket"
                );
                assert_eq!(on_graphs, positions <= 150, "{name}: {positions} positions");
                fell_back |= !on_graphs;
                assert_eq!(codes_s, codes_e, "{name} '{text}': codes differ");
                assert_eq!(reason_s, reason_e, "{name} '{text}'");
                for (i, (a, b)) in logits_s.iter().zip(&logits_e).enumerate() {
                    let d = a
                        .iter()
                        .zip(b)
                        .map(|(x, y)| (x - y).abs())
                        .fold(0f32, f32::max);
                    assert!(d <= 1e-4, "{name} '{text}' frame {i}: logits differ by {d}");
                }
                assert!(
                    slot.talker_graphs.lock().unwrap().is_some(),
                    "lease not returned"
                );
            }
        }
        assert!(fell_back, "no utterance outgrew the slot cache");
    }
}
