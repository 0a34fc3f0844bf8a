//! Text that is still being written, spoken by the server: one session of vLLM-Omni's
//! streaming-input websocket, `/v1/audio/speech/stream`, per utterance (`append-text` with
//! `server=`). The protocol, as its source defines it, is written down in
//! `docs/vllm-omni-streaming-input.md`; in short:
//!
//! ```text
//! client ─► {"type":"session.config", voice, language, …, "response_format":"pcm",
//!            "stream_audio":true, "split_granularity":"sentence"}
//!        ─► {"type":"input.text","text":…}   (each fragment, as it comes)
//!        ─► {"type":"input.done"}            (end-text: the rest is spoken, then session.done)
//! server ─► {"type":"audio.start", "sample_rate":24000, …} · binary frames (s16le PCM) ·
//!           {"type":"audio.done", …}         (per sentence, as each sentence completes)
//!        ─► {"type":"session.done", …}       (then the client sends session.close)
//!        ─► {"type":"error","message":…}     (the utterance fails with it)
//! ```
//!
//! The server speaks each sentence as a request of its own once the sentence is complete
//! (`split_granularity=sentence`), so the first audio comes after the first sentence, not after
//! the first fragment. A server without the endpoint refuses the websocket upgrade (HTTP 404, or
//! 403 from a framework that closes unknown websocket routes): the utterance fails with
//! [`RemoteError::NoStreamInput`].
//!
//! The session runs on a thread of its own with a blocking [`tungstenite`] socket (plain TCP, or
//! rustls for `https://` servers, as ureq uses). The fragments come through a channel
//! ([`StreamTextSender`]); the thread alternates between sending them and reading the server's
//! frames (a short read timeout), and delivers the same [`EngineEvent`]s as an HTTP request
//! ([`RemoteHandle`]).

use std::io::ErrorKind;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use tungstenite::client::IntoClientRequest;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{HandshakeError, Message, WebSocket};

use crate::engine::{AudioChunk, EngineEvent, FinishReason, Metrics};

use super::client::SpeechClient;
use super::error::{MAX_SERVER_TEXT, RemoteError, quote_server_text};
use super::handle::{CancelState, RemoteCanceller, RemoteHandle};
use super::options::ServerOptions;
use super::pcm::S16Decoder;
use super::request::SpeechRequest;
use super::{SAMPLE_RATE, SAMPLES_PER_FRAME};

/// The endpoint's path under the server's base URL.
pub const STREAM_PATH: &str = "/v1/audio/speech/stream";

/// How long the session thread waits for a server frame before it looks for new text again.
const POLL: Duration = Duration::from_millis(10);

/// The fields of a speech request that `session.config` takes as they are (vLLM-Omni's
/// `StreamingSpeechSessionConfig`); the rest (`input`, the stream form, `extra_params`) are not
/// session fields.
const SESSION_FIELDS: [&str; 12] = [
    "model",
    "voice",
    "language",
    "instructions",
    "task_type",
    "ref_audio",
    "ref_text",
    "x_vector_only_mode",
    "max_new_tokens",
    "seed",
    "initial_codec_chunk_frames",
    "non_streaming_mode",
];

/// What the session thread is told.
enum TextMsg {
    /// A fragment of the utterance's text.
    Text(String),
    /// The text has ended.
    End,
}

/// Streams an utterance's text into its websocket session, from any thread. Dropping it ends
/// the text.
#[derive(Debug, Clone)]
pub struct StreamTextSender {
    tx: Sender<TextMsg>,
}

impl StreamTextSender {
    /// Sends a fragment (any UTF-8 text; the server joins the fragments). Errors: the session
    /// has ended (finished, failed or cancelled), with the text of that error.
    pub fn append(&self, fragment: &str) -> Result<(), String> {
        if fragment.is_empty() {
            return Ok(());
        }
        self.tx
            .send(TextMsg::Text(fragment.to_string()))
            .map_err(|_| "the server session of the utterance has ended".to_string())
    }

    /// Ends the text: the server speaks the rest and ends the session.
    pub fn end(&self) {
        let _ = self.tx.send(TextMsg::End);
    }
}

impl SpeechClient {
    /// Opens a streaming-input session for one utterance with the voice and settings of
    /// `request` (its `input` is ignored: the text comes through the returned sender). The
    /// session runs on a thread of its own; its events arrive on the handle, as for
    /// [`SpeechClient::submit`]: `Started` once the server accepted the websocket, audio as each
    /// sentence is spoken, `Finished` after the server's `session.done` (reason `eos`), a server
    /// `error` message, a cut connection, a stall of `server-timeout` after the text ended, or
    /// [`RemoteError::NoStreamInput`] when the server has no such endpoint. Errors: the thread
    /// cannot be spawned.
    pub fn submit_stream(
        &self,
        request: SpeechRequest,
    ) -> std::io::Result<(RemoteHandle, StreamTextSender)> {
        let state = Arc::new(CancelState::default());
        let (tx, rx) = mpsc::channel();
        let (text_tx, text_rx) = mpsc::channel();
        let session = Session {
            options: self.options_arc(),
            config: session_config(&request),
            state: state.clone(),
            tx,
            text: text_rx,
            submitted: Instant::now(),
        };
        std::thread::Builder::new()
            .name("omnitts-remote-stream".into())
            .spawn(move || session.run())?;
        Ok((
            RemoteHandle {
                events: rx,
                canceller: RemoteCanceller { state },
                done: AtomicBool::new(false),
            },
            StreamTextSender { tx: text_tx },
        ))
    }
}

/// The `session.config` message for `request`'s voice and settings: raw 16-bit PCM streamed as
/// it is decoded, one request per sentence as each completes.
pub fn session_config(request: &SpeechRequest) -> serde_json::Value {
    let body: serde_json::Value =
        serde_json::from_slice(&request.to_json()).unwrap_or(serde_json::Value::Null);
    let mut config = serde_json::Map::new();
    config.insert("type".into(), "session.config".into());
    for field in SESSION_FIELDS {
        if let Some(v) = body.get(field) {
            config.insert(field.into(), v.clone());
        }
    }
    config.insert("response_format".into(), "pcm".into());
    config.insert("stream_audio".into(), true.into());
    config.insert("split_granularity".into(), "sentence".into());
    serde_json::Value::Object(config)
}

/// The websocket URL of the endpoint: `ws://` or `wss://` `<base>/v1/audio/speech/stream`.
fn ws_url(o: &ServerOptions) -> String {
    let http = o.url.join(STREAM_PATH);
    match http.strip_prefix("https://") {
        Some(rest) => format!("wss://{rest}"),
        None => format!("ws://{}", http.strip_prefix("http://").unwrap_or(&http)),
    }
}

/// One session's thread.
struct Session {
    options: Arc<ServerOptions>,
    config: serde_json::Value,
    state: Arc<CancelState>,
    tx: Sender<EngineEvent>,
    text: Receiver<TextMsg>,
    submitted: Instant,
}

/// What the thread measured.
#[derive(Default)]
struct Counts {
    started: Option<Instant>,
    first_audio: Option<Instant>,
    samples: u64,
}

type Socket = WebSocket<MaybeTlsStream<TcpStream>>;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Session {
    fn run(self) {
        let mut counts = Counts::default();
        let outcome = self.session(&mut counts);
        let reason = match outcome {
            _ if self.state.is_cancelled() => FinishReason::Cancelled,
            Ok(()) => FinishReason::Eos,
            Err(e) => FinishReason::Error(e.to_string()),
        };
        let finished = Instant::now();
        let audio_ms = counts.samples as f64 * 1e3 / SAMPLE_RATE as f64;
        let started = counts.started.unwrap_or(finished);
        let metrics = Metrics {
            frames: (counts.samples / SAMPLES_PER_FRAME as u64) as usize,
            audio_ms,
            ttfa_ms: counts
                .first_audio
                .map(|t| ms(t.saturating_duration_since(self.submitted))),
            wall_ms: ms(finished.saturating_duration_since(self.submitted)),
            queue_ms: ms(started.saturating_duration_since(self.submitted)),
            ..Metrics::default()
        };
        let _ = self.tx.send(EngineEvent::Finished { reason, metrics });
    }

    /// Connects, opens the websocket and runs the session to its end.
    fn session(&self, counts: &mut Counts) -> Result<(), RemoteError> {
        let o = &*self.options;
        let url = ws_url(o);
        let mut socket = self.connect(&url)?;
        counts.started = Some(Instant::now());
        let _ = self.tx.send(EngineEvent::Started);
        let io = |e: tungstenite::Error, what: &str| RemoteError::Protocol {
            url: url.clone(),
            detail: format!("the websocket failed {what}: {e}"),
        };
        socket
            .send(Message::text(self.config.to_string()))
            .map_err(|e| io(e, "sending session.config"))?;
        if let Some(tcp) = tcp_of(&socket) {
            tcp.set_read_timeout(Some(POLL))
                .map_err(|e| io(e.into(), "setting its read timeout"))?;
        }
        let mut pcm = S16Decoder::default();
        let mut ended = false;
        let mut heard = Instant::now();
        loop {
            if self.state.is_cancelled() {
                let _ = socket.send(close_message());
                return Ok(());
            }
            // The text that has come since.
            while !ended {
                let msg = match self.text.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => break,
                    // The element let go of the utterance's text: it has ended.
                    Err(TryRecvError::Disconnected) => TextMsg::End,
                };
                let json = match msg {
                    TextMsg::Text(t) => serde_json::json!({"type": "input.text", "text": t}),
                    TextMsg::End => {
                        ended = true;
                        heard = Instant::now();
                        serde_json::json!({"type": "input.done"})
                    }
                };
                socket
                    .send(Message::text(json.to_string()))
                    .map_err(|e| io(e, "sending text"))?;
            }
            let msg = match socket.read() {
                Ok(m) => m,
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
                {
                    if ended && heard.elapsed() > o.timeout {
                        return Err(if counts.samples == 0 {
                            RemoteError::NoFirstAudio {
                                url,
                                after: o.timeout,
                            }
                        } else {
                            RemoteError::Stalled {
                                url,
                                after: o.timeout,
                                phase: "while streaming the audio",
                            }
                        });
                    }
                    continue;
                }
                Err(e) if self.state.is_cancelled() => {
                    let _ = e;
                    return Ok(());
                }
                Err(e) => {
                    return Err(RemoteError::Protocol {
                        url,
                        detail: format!(
                            "the session was cut off after {:.2} s of audio ({e})",
                            counts.samples as f64 / SAMPLE_RATE as f64
                        ),
                    });
                }
            };
            heard = Instant::now();
            match msg {
                Message::Binary(bytes) => {
                    let mut samples = Vec::new();
                    pcm.push(&bytes, &mut samples);
                    self.emit(samples, counts);
                }
                Message::Text(text) => {
                    if self.server_message(text.as_str(), &url)? {
                        let _ = socket.send(Message::text(
                            serde_json::json!({"type": "session.close"}).to_string(),
                        ));
                        let _ = socket.close(None);
                        let _ = socket.flush();
                        return Ok(());
                    }
                }
                Message::Close(_) => {
                    return Err(RemoteError::Protocol {
                        url,
                        detail: "the server closed the session before the end of the utterance \
                                 (no session.done)"
                            .into(),
                    });
                }
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => {}
            }
        }
    }

    /// A JSON message from the server; true when it ends the session (`session.done`).
    fn server_message(&self, text: &str, url: &str) -> Result<bool, RemoteError> {
        let protocol = |detail: String| RemoteError::Protocol {
            url: url.to_string(),
            detail,
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            protocol(format!(
                "a websocket message is not JSON ({e}): {}",
                quote_server_text(text, MAX_SERVER_TEXT)
            ))
        })?;
        match v.get("type").and_then(|t| t.as_str()).unwrap_or("") {
            "audio.start" => {
                if let Some(f) = v.get("format").and_then(|f| f.as_str())
                    && f != "pcm"
                {
                    return Err(protocol(format!(
                        "the server sends {f} audio; pcm was asked for"
                    )));
                }
                if let Some(rate) = v.get("sample_rate").and_then(|r| r.as_u64())
                    && rate != SAMPLE_RATE as u64
                {
                    return Err(protocol(format!(
                        "the server sends {rate} Hz audio; {SAMPLE_RATE} Hz was asked for"
                    )));
                }
                if let Some(ch) = v.get("channels").and_then(|c| c.as_u64())
                    && ch != 1
                {
                    return Err(protocol(format!(
                        "the server sends {ch} channels; mono was asked for"
                    )));
                }
                Ok(false)
            }
            "session.done" => Ok(true),
            "error" => Err(RemoteError::Server {
                url: url.to_string(),
                message: quote_server_text(
                    v.get("message").and_then(|m| m.as_str()).unwrap_or(text),
                    MAX_SERVER_TEXT,
                ),
            }),
            // audio.done, and what later versions may add.
            _ => Ok(false),
        }
    }

    /// Resolves, connects and upgrades to the websocket (TLS for `https://`).
    fn connect(&self, url: &str) -> Result<Socket, RemoteError> {
        let o = &*self.options;
        let Some((host, port)) = o.url.host_port() else {
            return Err(RemoteError::BadUrl {
                url: o.url.to_string(),
                why: "no host".into(),
            });
        };
        let addrs: Vec<_> = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| RemoteError::Dns {
                url: url.to_string(),
                host: host.clone(),
                detail: e.to_string(),
            })?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, o.timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(tcp) = tcp else {
            return Err(match last {
                Some(e) if e.kind() == ErrorKind::TimedOut => RemoteError::Stalled {
                    url: url.to_string(),
                    after: o.timeout,
                    phase: "connecting",
                },
                Some(e) => RemoteError::Connect {
                    url: url.to_string(),
                    detail: e.to_string(),
                },
                None => RemoteError::Dns {
                    url: url.to_string(),
                    host,
                    detail: "no address found".into(),
                },
            });
        };
        let setup = |e: std::io::Error| RemoteError::Connect {
            url: url.to_string(),
            detail: e.to_string(),
        };
        tcp.set_nodelay(true).map_err(setup)?;
        tcp.set_read_timeout(Some(o.timeout)).map_err(setup)?;
        tcp.set_write_timeout(Some(o.timeout)).map_err(setup)?;
        let mut request = url.into_client_request().map_err(|e| RemoteError::BadUrl {
            url: o.url.to_string(),
            why: e.to_string(),
        })?;
        if let Some(key) = &o.api_key
            && let Ok(v) = key.bearer().parse()
        {
            request.headers_mut().insert("Authorization", v);
        }
        match tungstenite::client_tls(request, tcp) {
            Ok((socket, _)) => Ok(socket),
            Err(HandshakeError::Interrupted(_)) => Err(RemoteError::Stalled {
                url: url.to_string(),
                after: o.timeout,
                phase: "opening the websocket",
            }),
            Err(HandshakeError::Failure(e)) => Err(handshake_error(e, url, o)),
        }
    }

    /// Hands `samples` to the handle (after `FirstAudio` the first time).
    fn emit(&self, samples: Vec<f32>, counts: &mut Counts) {
        if samples.is_empty() {
            return;
        }
        if counts.first_audio.is_none() {
            let now = Instant::now();
            counts.first_audio = Some(now);
            let ttfa_ms = ms(now.saturating_duration_since(self.submitted));
            let _ = self.tx.send(EngineEvent::FirstAudio { ttfa_ms });
        }
        let offset = counts.samples;
        counts.samples += samples.len() as u64;
        let _ = self
            .tx
            .send(EngineEvent::Audio(AudioChunk { samples, offset }));
    }
}

/// The normal close frame.
fn close_message() -> Message {
    Message::Close(None)
}

/// The TCP socket under the websocket (for its read timeout).
fn tcp_of(socket: &Socket) -> Option<&TcpStream> {
    match socket.get_ref() {
        MaybeTlsStream::Plain(s) => Some(s),
        MaybeTlsStream::Rustls(s) => Some(s.get_ref()),
        _ => None,
    }
}

/// A failed websocket upgrade → what the user is told: no endpoint (404 / 403), another HTTP
/// status with the server's message, TLS, a stall.
fn handshake_error(e: tungstenite::Error, url: &str, o: &ServerOptions) -> RemoteError {
    match e {
        tungstenite::Error::Http(resp) => {
            let status = resp.status().as_u16();
            let body = resp
                .body()
                .as_deref()
                .map(|b| String::from_utf8_lossy(b).to_string())
                .unwrap_or_default();
            let from_body = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| super::body::error_message(&v))
                .or_else(|| {
                    Some(quote_server_text(&body, MAX_SERVER_TEXT)).filter(|s| !s.is_empty())
                });
            if matches!(status, 404 | 403) {
                return RemoteError::NoStreamInput {
                    url: url.to_string(),
                    status,
                };
            }
            let reason = resp.status().canonical_reason().unwrap_or("");
            RemoteError::Status {
                url: url.to_string(),
                status,
                message: match (reason, from_body) {
                    ("", Some(m)) => m,
                    (r, Some(m)) => format!("{r}: {m}"),
                    (r, None) => r.to_string(),
                },
                retries: 0,
            }
        }
        tungstenite::Error::Tls(t) => RemoteError::Tls {
            url: url.to_string(),
            detail: t.to_string(),
        },
        tungstenite::Error::Io(io)
            if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
        {
            RemoteError::Stalled {
                url: url.to_string(),
                after: o.timeout,
                phase: "opening the websocket",
            }
        }
        other => RemoteError::Protocol {
            url: url.to_string(),
            detail: format!("the websocket upgrade failed: {other}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{ServerUrl, StreamProtocol};

    #[test]
    fn the_session_config_carries_the_voice_and_asks_for_pcm_per_sentence() {
        let mut r = SpeechRequest::new("ignored", StreamProtocol::Sse);
        r.voice = Some("vivian".into());
        r.max_new_tokens = Some(60);
        r.extra_params = Some(serde_json::Map::new());
        let c = session_config(&r);
        assert_eq!(c["type"], "session.config");
        assert_eq!(c["voice"], "vivian");
        assert_eq!(c["max_new_tokens"], 60);
        assert_eq!(c["response_format"], "pcm");
        assert_eq!(c["stream_audio"], true);
        assert_eq!(c["split_granularity"], "sentence");
        for absent in [
            "input",
            "stream",
            "stream_format",
            "sample_rate",
            "extra_params",
        ] {
            assert!(c.get(absent).is_none(), "{absent} in {c}");
        }
    }

    #[test]
    fn the_websocket_url_follows_the_scheme() {
        let o = |u: &str| ServerOptions::new(ServerUrl::parse(u).unwrap());
        assert_eq!(
            ws_url(&o("http://h:8091/v1")),
            "ws://h:8091/v1/audio/speech/stream"
        );
        assert_eq!(
            ws_url(&o("https://tts.example/api")),
            "wss://tts.example/api/v1/audio/speech/stream"
        );
    }
}
