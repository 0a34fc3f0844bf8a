//! A loopback server that speaks vLLM-Omni's speech API (`POST /v1/audio/speech` with
//! `stream: true`, raw `audio/pcm` or `text/event-stream`; `GET /v1/models`, `GET /v1/audio/voices`)
//! and synthesises with omnitts' own engine, so that what a client gets can be compared with the
//! engine's own output. Faults are injected per request ([`Fault`]).
//!
//! The request fields are mapped the way vLLM-Omni's Qwen3-TTS builder maps them
//! (serving_speech.py `_build_tts_params`): `voice` → speaker, `language` (`Auto` = none),
//! `instructions` → instruct, `non_streaming_mode` → prompt mode, `max_new_tokens`, `seed`,
//! `initial_codec_chunk_frames`, `ref_audio` (a WAV data URL) / `ref_text` / `x_vector_only_mode` →
//! the engine's voice-clone prompt; sampling otherwise the engine's defaults. Samples go out as
//! libsndfile writes PCM_16: `x * 32767` rounded (here after clamping to [-1, 1]).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use gstomnitts::engine::{Engine, EngineEvent, EngineRequest};
use gstomnitts::models::qwen3_tts::{PromptMode, VoiceClonePrompt, VoiceRequest};

/// What the server does with the next speech request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answers `status` with `body` (JSON) and closes.
    Status { status: u16, body: String },
    /// Answers 503 "queue full" (with `Retry-After: 0` when `retry_after`), then goes on with
    /// the next fault (or synthesises).
    Busy,
    /// Streams `chunks` audio chunks, then closes the connection without ending the body.
    CutOff { chunks: usize },
    /// Streams `chunks` audio chunks, then sends nothing more and holds the connection open
    /// until the client closes it.
    Stall { chunks: usize },
    /// Answers 200 with this content type (and a little audio).
    ContentType(String),
    /// SSE: streams `chunks` deltas, then a `speech.audio.error` with `message`.
    SseError { chunks: usize, message: String },
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names lower case.
    pub headers: Vec<(String, String)>,
    pub body: Option<serde_json::Value>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    faults: Mutex<VecDeque<Fault>>,
    received: Mutex<Vec<Received>>,
    /// When a client closed a held (stalled) connection.
    closed: Mutex<Vec<Instant>>,
    /// Answer 401 to requests without `Authorization: Bearer <key>`.
    key: Mutex<Option<String>>,
    stop: AtomicBool,
}

/// The running server; stops on drop.
pub struct SpeechServer {
    pub url: String,
    state: Arc<State>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SpeechServer {
    /// Serves `engine` (its speakers are the voices) as model `served_model`.
    pub fn start(engine: Arc<Engine>, served_model: &str) -> SpeechServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State::default());
        let (st, model) = (state.clone(), served_model.to_string());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (st, engine, model) = (st.clone(), engine.clone(), model.clone());
                std::thread::spawn(move || {
                    let _ = serve(conn, &st, &engine, &model);
                });
            }
        });
        SpeechServer {
            url: format!("http://127.0.0.1:{port}"),
            state,
            port,
            thread: Some(thread),
        }
    }

    /// Queues `f` for the next speech request (faults are used in order, one per request).
    pub fn fault(&self, f: Fault) {
        self.state.faults.lock().unwrap().push_back(f);
    }

    /// Requires `Authorization: Bearer <key>` from now on.
    pub fn require_key(&self, key: &str) {
        *self.state.key.lock().unwrap() = Some(key.to_string());
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    /// The speech requests so far.
    pub fn speech_requests(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.path == "/v1/audio/speech")
            .collect()
    }

    /// When clients closed held connections.
    pub fn closed(&self) -> Vec<Instant> {
        self.state.closed.lock().unwrap().clone()
    }
}

impl Drop for SpeechServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_request(conn: &mut TcpStream) -> std::io::Result<Option<Received>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    loop {
        let n = conn.read(&mut tmp)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let head_len = match req.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => continue,
            Err(_) => {
                // As uvicorn does with a TLS handshake sent to a plain HTTP port.
                respond(conn, 400, &[], b"Invalid HTTP request received.");
                return Ok(None);
            }
        };
        let headers: Vec<(String, String)> = req
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).to_string(),
                )
            })
            .collect();
        let len: usize = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let (method, path) = (
            req.method.unwrap_or("").to_string(),
            req.path.unwrap_or("").to_string(),
        );
        let mut body = buf[head_len..].to_vec();
        while body.len() < len {
            let n = conn.read(&mut tmp)?;
            if n == 0 {
                return Ok(None);
            }
            body.extend_from_slice(&tmp[..n]);
        }
        let body = (len > 0).then(|| serde_json::from_slice(&body[..len]).unwrap_or_default());
        return Ok(Some(Received {
            method,
            path,
            headers,
            body,
        }));
    }
}

fn respond(conn: &mut TcpStream, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
    let _ = conn.flush();
}

fn error_body(status: u16, message: &str) -> String {
    serde_json::json!({"error": {"message": message, "type": "BadRequestError", "param": null, "code": status}})
        .to_string()
}

fn serve(mut conn: TcpStream, st: &State, engine: &Engine, model: &str) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let Some(req) = read_request(&mut conn)? else {
        return Ok(());
    };
    st.received.lock().unwrap().push(req.clone());
    if let Some(key) = st.key.lock().unwrap().clone()
        && req.header("authorization") != Some(&format!("Bearer {key}"))
    {
        respond(
            &mut conn,
            401,
            &[("Content-Type", "application/json")],
            error_body(401, "invalid API key").as_bytes(),
        );
        return Ok(());
    }
    let json = [("Content-Type", "application/json")];
    match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/v1/models") => {
            let body =
                serde_json::json!({"object": "list", "data": [{"id": model, "object": "model"}]});
            respond(&mut conn, 200, &json, body.to_string().as_bytes());
        }
        ("GET", "/v1/audio/voices") => {
            let body = serde_json::json!({"voices": engine.speakers()});
            respond(&mut conn, 200, &json, body.to_string().as_bytes());
        }
        ("POST", "/v1/audio/speech") => {
            let fault = st.faults.lock().unwrap().pop_front();
            speech(&mut conn, st, engine, req.body.unwrap_or_default(), fault);
        }
        _ => respond(
            &mut conn,
            404,
            &json,
            error_body(404, "not found").as_bytes(),
        ),
    }
    Ok(())
}

/// The engine request vLLM-Omni would build from `body`; Err is the server's 400 message.
pub fn engine_request(engine: &Engine, body: &serde_json::Value) -> Result<EngineRequest, String> {
    let s = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let input = s("input").ok_or("Field 'input' required")?;
    let speaker = s("voice").or_else(|| engine.speakers().first().cloned());
    let language = s("language")
        .filter(|l| !l.eq_ignore_ascii_case("auto"))
        .map(|l| l.to_lowercase());
    let mut sampling = engine.default_sampling_params();
    if let Some(m) = body.get("max_new_tokens").and_then(|v| v.as_u64()) {
        sampling.max_new_tokens = m as usize;
    }
    if let Some(seed) = body.get("seed").and_then(|v| v.as_i64()) {
        sampling.seed = seed as u64;
    }
    if !sampling.do_sample || sampling.temperature <= 0.0 {
        sampling = sampling.greedy();
    }
    let prompt_mode = body
        .get("non_streaming_mode")
        .and_then(|v| v.as_bool())
        .map(|ns| {
            if ns {
                PromptMode::NonStreaming
            } else {
                PromptMode::Streaming
            }
        });
    let mut req = EngineRequest::new(
        VoiceRequest {
            text: input,
            speaker,
            language,
            instruct: s("instructions"),
            prompt_mode,
            voice_clone: None,
        },
        sampling,
    );
    req.initial_chunk_frames = body
        .get("initial_codec_chunk_frames")
        .and_then(|v| v.as_u64())
        .map(|v| v as usize);
    if let Some(url) = s("ref_audio") {
        let samples = data_url_samples(&url).map_err(|e| format!("ref_audio: {e}"))?;
        let x_vector_only = body
            .get("x_vector_only_mode")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let prompt = engine
            .voice_clone_prompt(&samples, s("ref_text").as_deref(), x_vector_only)
            .map_err(|e| e.to_string())?;
        req.voice.voice_clone = Some(VoiceClonePrompt::clone(&prompt));
        req.voice.speaker = None;
    }
    Ok(req)
}

/// The 24 kHz samples of a `data:audio/wav;base64,…` reference (as vLLM-Omni decodes it).
fn data_url_samples(url: &str) -> Result<Vec<f32>, String> {
    let b64 = url
        .strip_prefix("data:audio/wav;base64,")
        .ok_or("expected a base64 WAV data URL")?;
    let wav = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())?;
    let mut r = hound::WavReader::new(std::io::Cursor::new(wav)).map_err(|e| e.to_string())?;
    let spec = r.spec();
    if spec.sample_rate != 24_000 || spec.channels != 1 {
        return Err(format!(
            "{} Hz, {} channels",
            spec.sample_rate, spec.channels
        ));
    }
    r.samples::<f32>()
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())
}

/// The server's PCM_16 bytes of `samples`.
pub fn pcm16(samples: &[f32]) -> Vec<u8> {
    samples
        .iter()
        .flat_map(|x| ((x.clamp(-1.0, 1.0) * 32767.0).round() as i16).to_le_bytes())
        .collect()
}

fn write_chunk(conn: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    conn.write_all(format!("{:x}\r\n", data.len()).as_bytes())?;
    conn.write_all(data)?;
    conn.write_all(b"\r\n")?;
    conn.flush()
}

fn sse_delta(pcm: &[u8]) -> Vec<u8> {
    let payload = serde_json::json!({
        "type": "speech.audio.delta",
        "audio": base64::engine::general_purpose::STANDARD.encode(pcm),
        "response_format": "pcm",
    });
    format!("event: speech.audio.delta\ndata: {payload}\n\n").into_bytes()
}

/// Holds `conn` open until the client closes it (recording when) or the server stops.
fn hold(conn: &mut TcpStream, st: &State) {
    let _ = conn.set_read_timeout(Some(Duration::from_millis(20)));
    let mut b = [0u8; 64];
    while !st.stop.load(Ordering::SeqCst) {
        match conn.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    st.closed.lock().unwrap().push(Instant::now());
}

fn speech(
    conn: &mut TcpStream,
    st: &State,
    engine: &Engine,
    body: serde_json::Value,
    fault: Option<Fault>,
) {
    let json = [("Content-Type", "application/json")];
    match &fault {
        Some(Fault::Status { status, body }) => {
            return respond(conn, *status, &json, body.as_bytes());
        }
        Some(Fault::Busy) => {
            return respond(
                conn,
                503,
                &[("Content-Type", "application/json"), ("Retry-After", "0")],
                error_body(503, "Server is busy: the request queue is full").as_bytes(),
            );
        }
        Some(Fault::ContentType(ct)) => {
            return respond(conn, 200, &[("Content-Type", ct)], &pcm16(&[0.0; 480]));
        }
        _ => {}
    }
    let req = match engine_request(engine, &body) {
        Ok(r) => r,
        Err(m) => return respond(conn, 400, &json, error_body(400, &m).as_bytes()),
    };
    let handle = match engine.submit(req) {
        Ok(h) => h,
        Err(e) => return respond(conn, 400, &json, error_body(400, &e.to_string()).as_bytes()),
    };
    let sse = body.get("stream_format").and_then(|v| v.as_str()) == Some("sse")
        || (body.get("stream") == Some(&serde_json::Value::Bool(true))
            && body.get("stream_format").is_none());
    let content_type = if sse {
        "text/event-stream"
    } else {
        "audio/pcm"
    };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n"
    );
    if conn.write_all(head.as_bytes()).is_err() {
        return;
    }
    let limit = match &fault {
        Some(Fault::CutOff { chunks })
        | Some(Fault::Stall { chunks })
        | Some(Fault::SseError { chunks, .. }) => Some(*chunks),
        _ => None,
    };
    let mut sent = 0;
    while let Some(ev) = handle.recv() {
        match ev {
            EngineEvent::Audio(c) => {
                if limit.is_some_and(|l| sent >= l) {
                    break;
                }
                let pcm = pcm16(&c.samples);
                let data = if sse { sse_delta(&pcm) } else { pcm };
                if write_chunk(conn, &data).is_err() {
                    handle.cancel();
                    return;
                }
                sent += 1;
            }
            EngineEvent::Finished { .. } => break,
            _ => {}
        }
    }
    handle.cancel();
    match fault {
        Some(Fault::CutOff { .. }) => {
            let _ = conn.shutdown(Shutdown::Both);
        }
        Some(Fault::Stall { .. }) => hold(conn, st),
        Some(Fault::SseError { message, .. }) => {
            let payload = serde_json::json!({"type": "speech.audio.error", "error": {
                "message": message, "type": "server_error", "param": null, "code": 500,
                "partial_audio": true, "action": "discard"}});
            let _ = write_chunk(
                conn,
                format!("event: speech.audio.error\ndata: {payload}\n\n").as_bytes(),
            );
            let _ = conn.write_all(b"0\r\n\r\n");
        }
        _ => {
            if sse {
                let _ = write_chunk(
                    conn,
                    b"event: speech.audio.done\ndata: {\"type\":\"speech.audio.done\"}\n\n",
                );
            }
            let _ = conn.write_all(b"0\r\n\r\n");
        }
    }
    let _ = conn.flush();
}
