//! A loopback server that speaks vLLM-Omni's speech API (`POST /v1/audio/speech` with
//! `stream: true`, raw `audio/pcm` or `text/event-stream`; `GET /v1/models` with each model's
//! `root`, `GET /v1/audio/voices` with `voices` and `uploaded_voices`; errors as vLLM's JSON
//! `{"error": {"message", "type", "param", "code"}}`) and synthesises with omnitts' own engine, so
//! that what a client gets can be compared with the engine's own output. Requests are validated
//! as vLLM-Omni's Qwen3-TTS adapter does (task type against the checkpoint variant, instructions
//! up to 500 characters, `max_new_tokens` up to 4096, references of 1 to 30 s, VoiceDesign needs
//! instructions), and a Base utterance that reaches its token budget ends in an error after its
//! audio (SSE: `speech.audio.error`; raw PCM: the connection closes). Faults are injected per
//! request ([`Fault`]).
//!
//! The request fields are mapped the way vLLM-Omni's Qwen3-TTS builder maps them
//! (serving_speech.py `_build_tts_params`): `voice` → speaker, `language` (`Auto` = none),
//! `instructions` → instruct, `non_streaming_mode` → prompt mode, `max_new_tokens`, `seed`,
//! `initial_codec_chunk_frames`, `ref_audio` (a WAV data URL) / `ref_text` / `x_vector_only_mode` →
//! the engine's voice-clone prompt; `extra_params` `temperature` / `top_p` / `top_k` override the
//! sampling, otherwise the engine's defaults. Samples go out as
//! libsndfile writes PCM_16: `x * 32767` rounded (here after clamping to [-1, 1]).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use gstomnitts::engine::{Engine, EngineEvent, EngineRequest, FinishReason};
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
    /// Voices uploaded (as by `POST /v1/audio/voices`).
    uploaded: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// What the server serves: the name it answers to, the checkpoint behind it (`root`) and the
/// variant vLLM-Omni derives from the checkpoint's path (`_get_model_variant`).
#[derive(Clone)]
struct Served {
    model: String,
    root: String,
    variant: Option<&'static str>,
}

/// The variant a checkpoint path ends in, as vLLM-Omni infers it from path components.
pub fn variant_of_path(path: &str) -> Option<&'static str> {
    for component in path.trim_end_matches(['/', '\\']).rsplit(['/', '\\']) {
        let c = component.to_lowercase();
        for (marker, variant) in [
            ("customvoice", "CustomVoice"),
            ("custom_voice", "CustomVoice"),
            ("custom-voice", "CustomVoice"),
            ("voicedesign", "VoiceDesign"),
            ("voice_design", "VoiceDesign"),
            ("voice-design", "VoiceDesign"),
            ("base", "Base"),
        ] {
            if let Some(head) = c.strip_suffix(marker)
                && (head.is_empty() || head.ends_with(['-', '_', '.']))
            {
                return Some(variant);
            }
        }
    }
    None
}

/// The running server; stops on drop.
pub struct SpeechServer {
    pub url: String,
    state: Arc<State>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SpeechServer {
    /// Serves `engine` (its speakers are the voices) as model `served_model`, the checkpoint of
    /// the same name.
    pub fn start(engine: Arc<Engine>, served_model: &str) -> SpeechServer {
        SpeechServer::start_as(engine, served_model, served_model)
    }

    /// Serves `engine` under the name `served_model` (`--served-model-name`) as the checkpoint
    /// `root` (whose path tells the variant).
    pub fn start_as(engine: Arc<Engine>, served_model: &str, root: &str) -> SpeechServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State::default());
        let model = Served {
            model: served_model.to_string(),
            root: root.to_string(),
            variant: variant_of_path(root),
        };
        let st = state.clone();
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

    /// Registers an uploaded voice `name` (as `POST /v1/audio/voices` does).
    pub fn upload_voice(&self, name: &str) {
        self.state.uploaded.lock().unwrap().push(name.to_string());
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

fn serve(mut conn: TcpStream, st: &State, engine: &Engine, served: &Served) -> std::io::Result<()> {
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
            let body = serde_json::json!({"object": "list", "data": [{
                "id": served.model, "object": "model", "created": 0, "owned_by": "vllm-omni",
                "root": served.root, "parent": null, "max_model_len": 32768, "permission": []}]});
            respond(&mut conn, 200, &json, body.to_string().as_bytes());
        }
        ("GET", "/v1/audio/voices") => {
            let uploaded = st.uploaded.lock().unwrap().clone();
            let mut voices: Vec<String> = match served.variant {
                Some("CustomVoice") | None => engine.speakers().to_vec(),
                _ => Vec::new(),
            };
            voices.extend(uploaded.iter().map(|n| n.to_lowercase()));
            let body = serde_json::json!({
                "voices": voices,
                "uploaded_voices": uploaded.iter().map(|n| serde_json::json!({
                    "name": n, "consent": "consent-1", "created_at": 1, "mime_type": "audio/wav",
                    "file_size": 1000, "ref_text": "A reference recording.",
                    "embedding_source": "audio"})).collect::<Vec<_>>(),
            });
            respond(&mut conn, 200, &json, body.to_string().as_bytes());
        }
        ("POST", "/v1/audio/speech") => {
            let fault = st.faults.lock().unwrap().pop_front();
            speech(
                &mut conn,
                st,
                engine,
                served,
                req.body.unwrap_or_default(),
                fault,
            );
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

/// The task type vLLM-Omni settles on for `body` (the Qwen3-TTS adapter's `validate`): the one
/// asked for, `Base` with a reference or an uploaded voice, else `CustomVoice`.
fn task_type(body: &serde_json::Value, uploaded: &[String]) -> String {
    let s = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let mut task = s("task_type");
    if task.is_none() && (s("ref_audio").is_some() || s("ref_text").is_some()) {
        task = Some("Base".into());
    }
    if let Some(v) = s("voice")
        && uploaded.iter().any(|u| u.eq_ignore_ascii_case(&v))
    {
        task = Some("Base".into());
    }
    task.unwrap_or_else(|| "CustomVoice".into())
}

/// vLLM-Omni's checks of a Qwen3-TTS request; Err is its 400 message.
fn validate(
    body: &serde_json::Value,
    served: &Served,
    uploaded: &[String],
) -> Result<String, String> {
    let s = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let task = task_type(body, uploaded);
    if let Some(variant) = served.variant
        && task != variant
    {
        return Err(format!(
            "Qwen3-TTS {variant} checkpoint does not support task_type='{task}'. Use \
             task_type='{variant}' or load the matching {task} checkpoint."
        ));
    }
    let voice = s("voice");
    let is_uploaded = voice
        .as_deref()
        .is_some_and(|v| uploaded.iter().any(|u| u.eq_ignore_ascii_case(v)));
    if task == "Base" && !is_uploaded && s("ref_audio").is_none() {
        return Err(
            "Base task requires 'ref_audio' or 'speaker_embedding' for voice cloning".into(),
        );
    }
    if task == "VoiceDesign" && s("instructions").is_none_or(|i| i.is_empty()) {
        return Err("VoiceDesign task requires 'instructions' to describe the voice".into());
    }
    if s("instructions").is_some_and(|i| i.chars().count() > 500) {
        return Err("Instructions too long (max 500 characters)".into());
    }
    if body
        .get("max_new_tokens")
        .and_then(|v| v.as_u64())
        .is_some_and(|m| m > 4096)
    {
        return Err("max_new_tokens cannot exceed 4096".into());
    }
    Ok(task)
}

/// The engine request vLLM-Omni would build from `body`; Err is the server's 400 message.
pub fn engine_request(engine: &Engine, body: &serde_json::Value) -> Result<EngineRequest, String> {
    engine_request_with(engine, body, &[])
}

/// [`engine_request`] on a server with `uploaded` voices (spoken here by the engine's first
/// speaker).
fn engine_request_with(
    engine: &Engine,
    body: &serde_json::Value,
    uploaded: &[String],
) -> Result<EngineRequest, String> {
    let s = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_string);
    let input = s("input").ok_or("Field 'input' required")?;
    let uploaded_voice = s("voice").filter(|v| uploaded.iter().any(|u| u.eq_ignore_ascii_case(v)));
    let speaker = s("voice")
        .filter(|_| uploaded_voice.is_none())
        .or_else(|| engine.speakers().first().cloned());
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
    if let Some(extra) = body.get("extra_params") {
        if let Some(t) = extra.get("temperature").and_then(|v| v.as_f64()) {
            sampling.temperature = t;
        }
        if let Some(p) = extra.get("top_p").and_then(|v| v.as_f64()) {
            sampling.top_p = p;
        }
        if let Some(k) = extra.get("top_k").and_then(|v| v.as_u64()) {
            sampling.top_k = k as usize;
        }
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
    if uploaded_voice.is_some() && s("ref_audio").is_none() {
        // An uploaded voice: its stored recording, cloned from the speaker embedding alone.
        let prompt = engine
            .voice_clone_prompt(&uploaded_reference(), None, true)
            .map_err(|e| e.to_string())?;
        req.voice.voice_clone = Some(VoiceClonePrompt::clone(&prompt));
        req.voice.speaker = None;
    }
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

/// The recording every uploaded voice stands for here: 1.5 s of a swelling 140 Hz tone and its
/// harmonics.
pub fn uploaded_reference() -> Vec<f32> {
    (0..36_000)
        .map(|i| {
            let t = i as f32 / 24_000.0;
            let env = (std::f32::consts::PI * t / 1.5).sin();
            let x: f32 = (1..=4)
                .map(|k| (2.0 * std::f32::consts::PI * 140.0 * k as f32 * t).sin() / k as f32)
                .sum();
            0.3 * env * x
        })
        .collect()
}

/// The 24 kHz samples of a `data:audio/wav;base64,…` reference (as vLLM-Omni decodes it, 16-bit
/// samples as `v / 32768`), 1 to 30 s long.
fn data_url_samples(url: &str) -> Result<Vec<f32>, String> {
    let samples = decode_data_url(url)?;
    let secs = samples.len() as f64 / 24_000.0;
    if secs < 1.0 {
        return Err(format!(
            "Reference audio too short ({secs:.1}s). At least 1s of clear speech is required."
        ));
    }
    if secs > 30.0 {
        return Err(format!(
            "Reference audio too long ({secs:.1}s). Maximum 30s supported — use a shorter clip."
        ));
    }
    Ok(samples)
}

fn decode_data_url(url: &str) -> Result<Vec<f32>, String> {
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
    match spec.sample_format {
        hound::SampleFormat::Float => r
            .samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string()),
        hound::SampleFormat::Int if spec.bits_per_sample == 16 => r
            .samples::<i16>()
            .map(|v| v.map(|v| v as f32 / 32768.0))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string()),
        _ => Err(format!("{}-bit integer WAV", spec.bits_per_sample)),
    }
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
    served: &Served,
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
    let uploaded = st.uploaded.lock().unwrap().clone();
    let task = match validate(&body, served, &uploaded) {
        Ok(t) => t,
        Err(m) => return respond(conn, 400, &json, error_body(400, &m).as_bytes()),
    };
    let req = match engine_request_with(engine, &body, &uploaded) {
        Ok(r) => r,
        Err(m) => return respond(conn, 400, &json, error_body(400, &m).as_bytes()),
    };
    let max_tokens = req.sampling.max_new_tokens;
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
    let mut frames = 0;
    let mut budget_hit = false;
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
            EngineEvent::Finished { reason, metrics } => {
                frames = metrics.frames;
                budget_hit = reason == FinishReason::Length;
                break;
            }
            _ => {}
        }
    }
    handle.cancel();
    // Qwen3TTSCodecLimitError: a Base utterance that used its whole budget is reported as
    // incomplete, after its audio.
    if task == "Base" && budget_hit && fault.is_none() {
        let message = format!(
            "Qwen3-TTS Base did not emit codec EOS before its token budget ({}/{max_tokens} codec \
             tokens); the generated audio is incomplete.",
            frames + 1
        );
        if sse {
            let payload = serde_json::json!({"type": "speech.audio.error", "error": {
                "message": message, "type": "server_error", "param": null, "code": 500}});
            let _ = write_chunk(
                conn,
                format!("event: speech.audio.error\ndata: {payload}\n\n").as_bytes(),
            );
            let _ = conn.write_all(b"0\r\n\r\n");
        } else {
            // The raw stream's generator raises: the connection is dropped mid-body.
            let _ = conn.shutdown(Shutdown::Both);
        }
        return;
    }
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
                    b"event: speech.audio.done\ndata: {\"type\":\"speech.audio.done\",\"usage\":\
                      {\"input_tokens\":4,\"output_tokens\":8,\"total_tokens\":12}}\n\n",
                );
            }
            let _ = conn.write_all(b"0\r\n\r\n");
        }
    }
    let _ = conn.flush();
}
