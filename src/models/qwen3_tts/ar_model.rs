//! Stage 0's network ([`ArModel`]): the text tokenizer, the talker, the code predictor and (Base)
//! the voice-clone front end, loaded from a checkpoint onto one device and dtype, and the prompt
//! embeddings a request starts from. Generation state lives in `session.rs`; the CUDA graphs in
//! `graphs/`; voice-clone prompts in `voice_clone.rs`.

use candle_core::{DType, Device, Tensor};

use super::checkpoint::Checkpoint;
use super::code_predictor::CodePredictor;
use super::codec_encoder::CodecEncoder;
use super::config::{ModelVariant, Qwen3TtsConfig};
use super::graphs::ArGraphs;
use super::prompt::{CodecPart, Prompt};
use super::speaker_encoder::{EcapaConfig, SpeakerEncoder};
use super::talker::Talker;
use super::tokenizer::TextTokenizer;
use crate::models::tts::ModelError;
use crate::models::tts::VoiceRequest;
pub use crate::nn::WeightForm;
use crate::nn::{Linear, Quantization, QuantizationSpec, Weights};

/// Stage 0: talker + code predictor + text tokenizer, on one device/dtype.
///
/// The network only: the per-utterance state (KV cache, sampling state) lives in the sessions it
/// starts ([`ArSession`](super::ArSession), `session.rs`), so one model serves many streams.
pub struct ArModel {
    pub(super) config: Qwen3TtsConfig,
    pub(super) tokenizer: TextTokenizer,
    pub(super) talker: Talker,
    pub(super) code_predictor: CodePredictor,
    /// `T(tts_pad)`: `[1, hidden]`, computed once.
    pub(super) tts_pad_embed: Tensor,
    /// Base only: `speaker_encoder.*` (f32) and the codec encoder (`speech_tokenizer/`, f32).
    pub(super) speaker_encoder: Option<SpeakerEncoder>,
    pub(super) codec_encoder: Option<CodecEncoder>,
    pub(super) device: Device,
    pub(super) dtype: DType,
    /// The CUDA graphs, when enabled ([`ArModel::enable_cuda_graphs`], `graphs/`).
    pub(super) graphs: ArGraphs,
}

impl ArModel {
    /// The talker's next decode input `[1, 1, hidden]` (model dtype) after frame `codes`
    /// (`num_code_groups` codes): `C(a0) + Σ_q cp_table[q](a_{q+1})`, summed in f32 in codebook
    /// order and rounded, `+ text` (`[1, hidden]`: the frame's trailing text row or `T(tts_pad)`),
    /// as the reference's `inputs_embeds` of a decode step. `c0` = `C(a0)` `[1, hidden]`, already
    /// looked up for the code predictor. On CUDA one upload and one kernel (`embed_sum`).
    pub(super) fn talker_input(
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

    /// Loads the tokenizer and the `talker.*` weights (converted to `dtype`) onto `device`, every
    /// weight dense. Unknown tensors (e.g. `speaker_encoder.*`) are ignored; a missing tensor or
    /// a wrong shape is an error naming the file and tensor.
    pub fn load(ckpt: &Checkpoint, device: &Device, dtype: DType) -> Result<ArModel, ModelError> {
        Self::load_with(ckpt, device, dtype, QuantizationSpec::DENSE)
    }

    /// [`Self::load`] with the talker's and code predictor's linear layers (all but the output
    /// heads) in the form `quantization` asks for ([`QuantizationSpec::for_layer`]). Quantized
    /// forms need the CPU and f32 activations: asked for elsewhere they are an error
    /// ([`QuantizationSpec::resolve`]), and `auto` is dense there.
    pub fn load_with(
        ckpt: &Checkpoint,
        device: &Device,
        dtype: DType,
        quantization: QuantizationSpec,
    ) -> Result<ArModel, ModelError> {
        let config = ckpt.config.clone();
        let tokenizer = TextTokenizer::from_dir(&ckpt.dir)?;
        let (files, display) = ckpt.weight_files()?;
        let w = Weights::from_files(&files, &display, device, dtype)?;
        let w = w.with_quantization(quantization.resolve(device, dtype).map_err(|msg| {
            ModelError::Config {
                file: ckpt.dir.clone(),
                field: "quantization".into(),
                msg,
            }
        })?);
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
            let se = SpeakerEncoder::new(
                &ecfg,
                &w.with_dtype(DType::F32).dense().pp("speaker_encoder"),
            )?;
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
            graphs: ArGraphs::default(),
        })
    }

    /// Every linear layer of the talker and code predictor (decoder layers, text projection,
    /// code predictor input projection, output heads).
    pub fn linears(&self) -> Vec<&Linear> {
        let (t, cp) = (&self.talker, &self.code_predictor);
        let mut all: Vec<&Linear> = t.model.layers.iter().flat_map(|l| l.linears()).collect();
        all.extend(cp.model.layers.iter().flat_map(|l| l.linears()));
        all.extend([&t.text_projection.linear_fc1, &t.text_projection.linear_fc2]);
        all.extend(cp.small_to_mtp_projection.iter());
        all.push(&t.codec_head);
        all.extend(cp.lm_head.iter());
        all
    }

    /// How the linear layers' weights are stored: for each form present, the number of layers
    /// and their bytes ([`Linear::weight_bytes`]), dense first.
    pub fn weight_forms(&self) -> Vec<WeightForm> {
        let mut forms: Vec<WeightForm> = Vec::new();
        for l in self.linears() {
            match forms.iter_mut().find(|f| f.form == l.form()) {
                Some(f) => {
                    f.layers += 1;
                    f.bytes += l.weight_bytes();
                }
                None => forms.push(WeightForm {
                    form: l.form(),
                    layers: 1,
                    bytes: l.weight_bytes(),
                }),
            }
        }
        forms.sort_by_key(|f| f.form != Quantization::None);
        forms
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
        Prompt::plan(&self.config, &self.tokenizer, req)
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
}
