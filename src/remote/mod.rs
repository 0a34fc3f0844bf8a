//! The remote backend: utterances synthesised by a vLLM-Omni server (or any server speaking its
//! speech API) instead of the local [`engine`](crate::engine). Like the engine it knows nothing
//! of GStreamer; it delivers the same [`EngineEvent`](crate::engine::EngineEvent)s, so that the
//! element turns them into the same buffers and messages.
//!
//! ```text
//! SpeechRequest ─► SpeechClient::submit ─► thread: POST /v1/audio/speech (retries on 503/429)
//!                                                   │ 200: audio/pcm or text/event-stream
//! RemoteHandle ◄── Started · FirstAudio · Audio{samples, offset} · Finished{reason, metrics}
//! ```
//!
//! The wire format is vLLM-Omni's OpenAI-style speech API (vllm-project/vllm-omni):
//! - request fields: vllm_omni/entrypoints/openai/protocol/audio.py `OpenAICreateSpeechRequest`,
//!   commit 0131cb5560450800b800e889fb849ea2c851bd3f (see [`SpeechRequest`]);
//! - the handler: vllm_omni/entrypoints/openai/serving_speech.py `create_speech`, commit
//!   12651860e57754e73712ce1785cda4ef82c8bb7e: `stream=true` with `stream_format: "audio"` and
//!   `response_format: "pcm"` answers `audio/pcm`, the 16-bit little-endian mono samples of each
//!   Code2Wav chunk as they are decoded (`_generate_audio_chunks`); `stream_format: "sse"` answers
//!   `text/event-stream` with `speech.audio.delta` events carrying the same bytes in base64, ending
//!   in `speech.audio.done` or `speech.audio.error` (`_generate_audio_sse_events`);
//! - Qwen3-TTS validation (task type from `ref_audio`, voices, languages, limits):
//!   vllm_omni/entrypoints/openai/tts_adapters/qwen3_tts.py, commit
//!   078de2d14c2fcc670c1e0dd492e1b84a69c69d15.
//!
//! Text that is still being written (`append-text`) goes through vLLM-Omni's streaming-input
//! websocket, `/v1/audio/speech/stream` (`stream_input.rs`, [`SpeechClient::submit_stream`]; the
//! protocol: `docs/vllm-omni-streaming-input.md`), one session per utterance, with
//! [`tungstenite`].
//!
//! HTTP is [`ureq`] (blocking, streaming bodies, rustls). Each request has its own agent: a cancel
//! shuts it down, which closes the socket and unblocks the read at once. The API key goes only in
//! the `Authorization` header; no `Debug` or error shows it.

mod body;
mod client;
mod error;
mod handle;
mod options;
mod pcm;
mod request;
mod sse;
mod stream_input;

pub use body::{AudioDecoder, BodyKind, body_kind, error_message};
pub use client::{FIRST_BACKOFF, MAX_BACKOFF, ServerInfo, SpeechClient};
pub use error::{MAX_SERVER_TEXT, RemoteError};
pub use handle::{CANCEL_REPORT, RemoteCanceller, RemoteHandle};
pub use options::{
    API_KEY_ENV, ApiKey, DEFAULT_RETRIES, DEFAULT_TIMEOUT, ServerOptions, ServerUrl, StreamProtocol,
};
pub use pcm::{S16_SCALE, S16Decoder, s16_to_f32};
pub use request::{SpeechRequest, TaskType, reference_data_url};
pub use sse::{SseEvent, SseParser};
pub use stream_input::{STREAM_PATH, StreamTextSender, session_config};

/// The rate the server is asked for and must send, Hz (Qwen3-TTS 12 Hz codec output).
pub const SAMPLE_RATE: u32 = 24_000;

/// Samples per codec frame at [`SAMPLE_RATE`] (12.5 frames per second): frames are counted from
/// the samples received, as the server does not report them.
pub const SAMPLES_PER_FRAME: usize = 1920;
