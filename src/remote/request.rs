//! The JSON body of `POST /v1/audio/speech`, as vLLM-Omni's `OpenAICreateSpeechRequest` defines
//! it for Qwen3-TTS (vllm-project/vllm-omni, vllm_omni/entrypoints/openai/protocol/audio.py,
//! commit 0131cb5560450800b800e889fb849ea2c851bd3f; how the Qwen3-TTS builder maps it:
//! serving_speech.py `_build_tts_params`, commit 12651860e57754e73712ce1785cda4ef82c8bb7e).
//!
//! | field | what it carries |
//! |---|---|
//! | `input` | the text of one utterance |
//! | `model` | the served model name (the server's own when absent) |
//! | `voice` | a preset speaker (CustomVoice) |
//! | `language` | `Auto`, `English`, ... (the server title-cases it) |
//! | `instructions` | style instruction (1.7B CustomVoice) or voice description (VoiceDesign) |
//! | `task_type` | `CustomVoice`, `VoiceDesign` or `Base`; the server takes `Base` when `ref_audio` is given |
//! | `ref_audio`, `ref_text`, `x_vector_only_mode` | the reference voice of a Base checkpoint |
//! | `max_new_tokens` | frame cap of the utterance |
//! | `seed` | random seed (int64) |
//! | `initial_codec_chunk_frames` | frames in the first Code2Wav chunk |
//! | `non_streaming_mode` | the prompt mode: all of the text in the prompt (true) or one token per frame |
//! | `extra_params` | stage-0 sampling overrides (`temperature`, `top_p`, `top_k`), merged into the talker's `extra_args` |
//! | `stream`, `stream_format`, `response_format`, `sample_rate` | always `true`, `"audio"`/`"sse"`, `"pcm"`, 24000 |

use std::fmt;
use std::io::Cursor;

use base64::Engine as _;
use serde::Serialize;

use super::SAMPLE_RATE;
use super::options::StreamProtocol;

/// The request's `task_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TaskType {
    /// Preset speakers.
    CustomVoice,
    /// A voice described in `instructions`.
    VoiceDesign,
    /// A voice cloned from `ref_audio`.
    Base,
}

/// One utterance for the server. `None` fields are left out of the JSON (the server's defaults).
#[derive(Clone, PartialEq, Serialize)]
pub struct SpeechRequest {
    /// The text.
    pub input: String,
    /// The served model name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Preset speaker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voice: Option<String>,
    /// Language name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Style instruction or voice description.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The checkpoint variant the request is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_type: Option<TaskType>,
    /// The reference recording as a data URL ([`reference_data_url`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_audio: Option<String>,
    /// Transcript of the reference (ICL cloning).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_text: Option<String>,
    /// Clone from the speaker embedding alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub x_vector_only_mode: Option<bool>,
    /// Frame cap.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<u32>,
    /// Random seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// Frames in the first audio chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_codec_chunk_frames: Option<u32>,
    /// Prompt mode: true = all of the text in the prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub non_streaming_mode: Option<bool>,
    /// Model-specific parameters (vLLM-Omni merges them into stage 0's `extra_args`): the
    /// sampling overrides `temperature`, `top_p`, `top_k`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_params: Option<serde_json::Map<String, serde_json::Value>>,
    /// Always true: the audio streams as it is decoded.
    stream: bool,
    /// `"audio"` (raw PCM) or `"sse"`.
    stream_format: &'static str,
    /// Always `"pcm"`: 16-bit little-endian mono.
    response_format: &'static str,
    /// Always 24000: the rate the element produces.
    sample_rate: u32,
}

impl SpeechRequest {
    /// A streaming request for `input` with the server's defaults for everything else.
    pub fn new(input: impl Into<String>, protocol: StreamProtocol) -> SpeechRequest {
        SpeechRequest {
            input: input.into(),
            model: None,
            voice: None,
            language: None,
            instructions: None,
            task_type: None,
            ref_audio: None,
            ref_text: None,
            x_vector_only_mode: None,
            max_new_tokens: None,
            seed: None,
            initial_codec_chunk_frames: None,
            non_streaming_mode: None,
            extra_params: None,
            stream: true,
            stream_format: protocol.stream_format(),
            response_format: "pcm",
            sample_rate: SAMPLE_RATE,
        }
    }

    /// The stream form asked for.
    pub fn protocol(&self) -> StreamProtocol {
        if self.stream_format == "sse" {
            StreamProtocol::Sse
        } else {
            StreamProtocol::Pcm
        }
    }

    /// Asks for `protocol`.
    pub fn set_protocol(&mut self, protocol: StreamProtocol) {
        self.stream_format = protocol.stream_format();
    }

    /// The JSON body.
    pub fn to_json(&self) -> Vec<u8> {
        // Strings, numbers and booleans only: serialisation cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl fmt::Debug for SpeechRequest {
    /// Like the JSON, with `ref_audio` shown by its size (it is the whole recording).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.clone();
        if let Some(r) = &mut shown.ref_audio {
            *r = format!("<data URL, {} bytes>", r.len());
        }
        f.write_str(&String::from_utf8_lossy(&shown.to_json()))
    }
}

/// Scale of the reference's float → 16-bit conversion: a sample `x` is sent as
/// `round(x × 32768)` (clamped to the 16-bit range), the inverse of the `v / 32768` that readers of
/// 16-bit PCM apply (libsndfile and so Python's soundfile and librosa; GStreamer's audioconvert,
/// which decodes `ref-audio` for the element). A 16-bit recording thus reaches the server sample
/// for sample as it was; a float one within half a step (1 / 65536).
const REFERENCE_S16_SCALE: f32 = 32768.0;

/// The reference recording as the `ref_audio` data URL: a 16-bit PCM WAV of `samples_24k`
/// (mono, 24 kHz, the samples the local engine would clone from; see [`REFERENCE_S16_SCALE`]),
/// base64 in `data:audio/wav;base64,...`: 64 kB of base64 per second of reference, half a float
/// WAV's.
pub fn reference_data_url(samples_24k: &[f32]) -> String {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: SAMPLE_RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut wav = Cursor::new(Vec::with_capacity(64 + samples_24k.len() * 2));
    // Writing to memory cannot fail, and a 16-bit WAV holds any number of samples under 2 GiB.
    if let Ok(mut w) = hound::WavWriter::new(&mut wav, spec) {
        for &x in samples_24k {
            let x = if x.is_finite() { x } else { 0.0 };
            let v = (x * REFERENCE_S16_SCALE)
                .round()
                .clamp(i16::MIN as f32, i16::MAX as f32) as i16;
            let _ = w.write_sample(v);
        }
        let _ = w.finalize();
    }
    format!(
        "data:audio/wav;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(wav.into_inner())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_are_left_out() {
        let r = SpeechRequest::new("Hello.", StreamProtocol::Pcm);
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "input": "Hello.", "stream": true, "stream_format": "audio",
                "response_format": "pcm", "sample_rate": 24000
            })
        );
        let mut r = SpeechRequest::new("Hi", StreamProtocol::Sse);
        r.voice = Some("vivian".into());
        r.task_type = Some(TaskType::VoiceDesign);
        r.non_streaming_mode = Some(true);
        r.seed = Some(-3);
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(v["stream_format"], "sse");
        assert_eq!(v["voice"], "vivian");
        assert_eq!(v["task_type"], "VoiceDesign");
        assert_eq!(v["non_streaming_mode"], true);
        assert_eq!(v["seed"], -3);
        assert_eq!(r.protocol(), StreamProtocol::Sse);
    }

    #[test]
    fn the_reference_is_a_16_bit_pcm_wav_data_url() {
        // A float recording: within half a 16-bit step; full scale and beyond clamp.
        let mut samples: Vec<f32> = (0..2400).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
        samples.extend([1.0, -1.0, 1.5, -1.5, f32::NAN]);
        let url = reference_data_url(&samples);
        let b64 = url.strip_prefix("data:audio/wav;base64,").unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        // A 44-byte header, then 2 bytes a sample.
        assert_eq!(bytes.len(), 44 + 2 * samples.len());
        let mut r = hound::WavReader::new(Cursor::new(bytes)).unwrap();
        let spec = r.spec();
        assert_eq!((spec.sample_rate, spec.channels), (24000, 1));
        assert_eq!(
            (spec.bits_per_sample, spec.sample_format),
            (16, hound::SampleFormat::Int)
        );
        let back: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(back.len(), samples.len());
        for (v, x) in back.iter().zip(&samples[..2400]) {
            assert!((*v as f32 / 32768.0 - x).abs() <= 0.5 / 32768.0, "{v} {x}");
        }
        assert_eq!(back[2400..], [32767, -32768, 32767, -32768, 0]);
        // A 16-bit recording (read as v / 32768) goes out sample for sample.
        let ints: Vec<i16> = vec![i16::MIN, -12345, -1, 0, 1, 16385, 32767];
        let read: Vec<f32> = ints.iter().map(|&v| v as f32 / 32768.0).collect();
        let url = reference_data_url(&read);
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(url.strip_prefix("data:audio/wav;base64,").unwrap())
            .unwrap();
        let mut r = hound::WavReader::new(Cursor::new(bytes)).unwrap();
        let back: Vec<i16> = r.samples::<i16>().map(Result::unwrap).collect();
        assert_eq!(back, ints);
        let mut req = SpeechRequest::new("x", StreamProtocol::Pcm);
        req.ref_audio = Some(url);
        let shown = format!("{req:?}");
        assert!(shown.contains("<data URL,") && shown.len() < 300, "{shown}");
    }
}
