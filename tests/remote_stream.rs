//! `append-text` with `server=`: vLLM-Omni's streaming-input websocket
//! (`/v1/audio/speech/stream`), against a loopback server written here that speaks the protocol
//! (docs/vllm-omni-streaming-input.md) and checks what it receives: the session config first,
//! each fragment as an `input.text` as it comes, `input.done` at the end, then `session.close`;
//! it answers each complete sentence with `audio.start`, binary 16-bit PCM frames and
//! `audio.done`, and `session.done` after `input.done`. Audio must arrive before the text ends,
//! in order; a server without the endpoint (404 on the upgrade) or one that reports an error
//! fails the utterance with a message that says why.

mod element_util;
mod reference_util;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gst::prelude::*;
use gstomnitts::element_common::messages;
use gstomnitts::engine::{EngineEvent, FinishReason};
use gstomnitts::remote::{
    RemoteHandle, STREAM_PATH, ServerOptions, ServerUrl, SpeechClient, SpeechRequest,
    StreamProtocol,
};
use tungstenite::Message;

/// What the loopback server does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Speaks each sentence as it completes.
    Speak,
    /// Has no streaming-input endpoint: 404 on the upgrade.
    NoEndpoint,
    /// Answers the first text with an `error` message.
    Fail,
}

/// Samples per sentence the server sends.
const SENTENCE_SAMPLES: usize = 2_400;

/// The 16-bit value of sentence `k`'s samples.
fn level(k: usize) -> i16 {
    1_000 * (k as i16 + 1)
}

struct WsServer {
    url: String,
    /// The JSON messages each session received, in order.
    received: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl WsServer {
    fn start(mode: Mode) -> WsServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("addr").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let r = received.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let r = r.clone();
                std::thread::spawn(move || serve(conn, mode, &r));
            }
        });
        WsServer {
            url: format!("http://127.0.0.1:{port}"),
            received,
        }
    }

    fn received(&self) -> Vec<serde_json::Value> {
        self.received.lock().unwrap().clone()
    }

    /// The messages received once one of type `last` is among them (or after 5 s without it).
    fn received_through(&self, last: &str) -> Vec<serde_json::Value> {
        let t0 = Instant::now();
        loop {
            let r = self.received();
            if r.iter().any(|m| m["type"] == last) || t0.elapsed() > Duration::from_secs(5) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The request line's path of the HTTP request waiting on `conn` and the length of its head
/// (peeked: it stays there, for the websocket handshake to read).
fn peek_path(conn: &TcpStream) -> Option<(String, usize)> {
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    loop {
        let n = conn.peek(&mut buf).ok()?;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(head)) = req.parse(&buf[..n]) {
            return req.path.map(|p| (p.to_string(), head));
        }
        if t0.elapsed() > Duration::from_secs(5) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Answers the plain HTTP request whose head (`head` bytes, no body) is waiting on `conn`. The
/// head is read first: a socket closed with unread bytes is reset, and the reset can reach the
/// client before it has read the answer.
fn respond(conn: &mut TcpStream, head: usize, status: &str, body: &str) {
    let mut request = vec![0u8; head];
    if conn.read_exact(&mut request).is_err() {
        return;
    }
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = conn.flush();
}

fn serve(mut conn: TcpStream, mode: Mode, received: &Mutex<Vec<serde_json::Value>>) {
    let Some((path, head)) = peek_path(&conn) else {
        return;
    };
    match path.as_str() {
        "/v1/models" => {
            let body = serde_json::json!({"object": "list", "data": [{
                "id": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "object": "model",
                "root": "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"}]});
            respond(&mut conn, head, "200 OK", &body.to_string());
        }
        "/v1/audio/voices" => {
            let body = serde_json::json!({"voices": ["vivian", "ryan"], "uploaded_voices": []});
            respond(&mut conn, head, "200 OK", &body.to_string());
        }
        p if p == STREAM_PATH && mode != Mode::NoEndpoint => {
            let Ok(mut ws) = tungstenite::accept(conn) else {
                return;
            };
            session(&mut ws, mode, received);
        }
        _ => respond(
            &mut conn,
            head,
            "404 Not Found",
            r#"{"detail":"Not Found"}"#,
        ),
    }
}

/// One websocket session of the loopback server.
fn session(
    ws: &mut tungstenite::WebSocket<TcpStream>,
    mode: Mode,
    received: &Mutex<Vec<serde_json::Value>>,
) {
    let mut text = String::new();
    let mut sentence = 0usize;
    let send_json = |ws: &mut tungstenite::WebSocket<TcpStream>, v: serde_json::Value| {
        let _ = ws.send(Message::text(v.to_string()));
    };
    let speak = |ws: &mut tungstenite::WebSocket<TcpStream>, k: usize, s: &str| {
        send_json(
            ws,
            serde_json::json!({"type": "audio.start", "utterance_index": 0, "sentence_index": k,
                "sentence_text": s, "format": "pcm", "sample_rate": 24000, "channels": 1}),
        );
        let pcm: Vec<u8> = std::iter::repeat_n(level(k).to_le_bytes(), SENTENCE_SAMPLES)
            .flatten()
            .collect();
        // Two frames, the first ending inside a sample.
        let _ = ws.send(Message::binary(pcm[..1001].to_vec()));
        let _ = ws.send(Message::binary(pcm[1001..].to_vec()));
        send_json(
            ws,
            serde_json::json!({"type": "audio.done", "utterance_index": 0, "sentence_index": k,
                "total_bytes": pcm.len(), "error": false}),
        );
    };
    loop {
        let msg = match ws.read() {
            Ok(Message::Text(t)) => t,
            Ok(Message::Close(_)) | Err(_) => return,
            Ok(_) => continue,
        };
        let v: serde_json::Value = serde_json::from_str(msg.as_str()).expect("JSON from client");
        received.lock().unwrap().push(v.clone());
        match v["type"].as_str().unwrap_or("") {
            "session.config" => {}
            "input.text" => {
                if mode == Mode::Fail {
                    send_json(
                        ws,
                        serde_json::json!({"type": "error", "message": "voice 'nobody' is not supported"}),
                    );
                    continue;
                }
                text.push_str(v["text"].as_str().expect("text"));
                while let Some(end) = text.find(['.', '!', '?']) {
                    let s: String = text.drain(..=end).collect();
                    speak(ws, sentence, s.trim());
                    sentence += 1;
                }
            }
            "input.done" => {
                if !text.trim().is_empty() {
                    speak(ws, sentence, text.trim());
                    sentence += 1;
                }
                send_json(
                    ws,
                    serde_json::json!({"type": "session.done", "utterance_index": 0,
                        "total_sentences": sentence}),
                );
            }
            "session.close" => {
                let _ = ws.close(None);
            }
            other => panic!("unexpected message type {other:?}"),
        }
    }
}

fn client(url: &str) -> SpeechClient {
    let mut o = ServerOptions::new(ServerUrl::parse(url).expect("url"));
    o.timeout = Duration::from_secs(10);
    SpeechClient::new(o)
}

fn request() -> SpeechRequest {
    let mut r = SpeechRequest::new("", StreamProtocol::Pcm);
    r.voice = Some("vivian".into());
    r.max_new_tokens = Some(50);
    r
}

/// Events until an `Audio` one (its samples), or `Finished` (panics), within 10 s.
fn next_audio(h: &RemoteHandle) -> Vec<f32> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        match h.recv_timeout(Duration::from_millis(50)) {
            Ok(EngineEvent::Audio(c)) => return c.samples,
            Ok(EngineEvent::Finished { reason, .. }) => panic!("finished early: {reason:?}"),
            Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => panic!("no audio"),
        }
    }
    panic!("no audio within 10 s while the text was still open");
}

/// The rest of the events: the samples and the finish reason.
fn rest(h: &RemoteHandle) -> (Vec<f32>, FinishReason) {
    let mut out = Vec::new();
    while let Some(ev) = h.recv() {
        match ev {
            EngineEvent::Audio(c) => out.extend(c.samples),
            EngineEvent::Finished { reason, .. } => return (out, reason),
            _ => {}
        }
    }
    panic!("no Finished");
}

fn sentence_samples(k: usize) -> Vec<f32> {
    vec![level(k) as f32 / 32767.0; SENTENCE_SAMPLES]
}

#[test]
fn fragments_go_as_they_come_and_audio_comes_back_before_the_end() {
    let s = WsServer::start(Mode::Speak);
    let (h, text) = client(&s.url).submit_stream(request()).expect("session");
    text.append("Hello wor").unwrap();
    text.append("ld. How a").unwrap();
    // The first sentence is spoken while the text is still open.
    let mut got = next_audio(&h);
    text.append("re you").unwrap();
    text.end();
    let (more, reason) = rest(&h);
    got.extend(more);
    assert_eq!(reason, FinishReason::Eos);
    let mut want = sentence_samples(0);
    want.extend(sentence_samples(1));
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the sentences' audio, in order");
    // The client sends `session.close` after it reports `Finished`: wait for the server to read it.
    let r = s.received_through("session.close");
    let types: Vec<&str> = r.iter().map(|m| m["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "session.config",
            "input.text",
            "input.text",
            "input.text",
            "input.done",
            "session.close"
        ]
    );
    let c = &r[0];
    assert_eq!(c["voice"], "vivian");
    assert_eq!(c["max_new_tokens"], 50);
    assert_eq!(c["response_format"], "pcm");
    assert_eq!(c["stream_audio"], true);
    assert_eq!(c["split_granularity"], "sentence");
    assert!(c.get("input").is_none());
    let texts: Vec<&str> = r[1..4]
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["Hello wor", "ld. How a", "re you"]);
}

#[test]
fn a_server_without_the_endpoint_says_so_and_names_push_text() {
    let s = WsServer::start(Mode::NoEndpoint);
    let (h, text) = client(&s.url).submit_stream(request()).expect("session");
    let _ = text.append("Hello.");
    text.end();
    let (audio, reason) = rest(&h);
    assert!(audio.is_empty());
    let FinishReason::Error(e) = reason else {
        panic!("{reason:?}");
    };
    for words in [
        "no streaming-input endpoint",
        "HTTP 404",
        STREAM_PATH,
        "push-text",
    ] {
        assert!(e.contains(words), "{words:?} not in: {e}");
    }
}

#[test]
fn a_server_error_fails_the_utterance_with_its_message() {
    let s = WsServer::start(Mode::Fail);
    let (h, text) = client(&s.url).submit_stream(request()).expect("session");
    text.append("Hello.").unwrap();
    let (_, reason) = rest(&h);
    let FinishReason::Error(e) = reason else {
        panic!("{reason:?}");
    };
    assert!(e.contains("voice 'nobody' is not supported"), "{e}");
}

/// A live omnittssrc on the speech server at `url` (speaker vivian), playing on the system
/// clock: the harness, its bus and the element. The state change is checked with the bus's
/// messages when it fails (as `h.play()`, which does not show them).
fn playing_live(url: &str) -> (gst_check::Harness, gst::Bus, gst::Element) {
    element_util::init();
    let mut h = gst_check::Harness::new("omnittssrc");
    let e = h.element().expect("element");
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    e.set_property("server", url);
    e.set_property("speaker", "vivian");
    e.set_property("is-live", true);
    h.use_systemclock();
    let started = e.set_state(gst::State::Playing);
    assert!(started.is_ok(), "{:?}", element_util::drain(&bus));
    (h, bus, e)
}

/// `omnittssrc server=… append-text` on a server without the streaming-input endpoint: the open
/// utterance fails once, in stream order, and the rest of its text is refused (false) until
/// `end-text`, instead of each later fragment opening an utterance of its own.
#[test]
fn the_rest_of_a_failed_open_text_is_refused_until_end_text() {
    let s = WsServer::start(Mode::NoEndpoint);
    let (h, bus, e) = playing_live(&s.url);
    assert!(e.emit_by_name::<bool>("append-text", &[&"Hello th"]));
    let mut seen = Vec::new();
    let done = element_util::wait_element_message(
        &bus,
        messages::DONE,
        Duration::from_secs(20),
        &mut seen,
    )
    .expect("the failed utterance's done message");
    assert_eq!(done.get::<String>("reason").unwrap(), "error");
    for fragment in ["ere, how are y", "ou?"] {
        assert!(
            !e.emit_by_name::<bool>("append-text", &[&fragment]),
            "{fragment:?} accepted by a failed open text"
        );
    }
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    std::thread::sleep(Duration::from_millis(200));
    seen.extend(element_util::drain(&bus));
    let modes = element_util::element_messages(&seen, messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1, "one utterance opened: {modes:?}");
    let dones = element_util::element_messages(&seen, messages::DONE);
    assert_eq!(dones.len(), 1, "{dones:?}");
    // After end-text, the next append-text opens a new utterance.
    assert!(e.emit_by_name::<bool>("append-text", &[&"Again."]));
    let _ = e.set_state(gst::State::Null);
    let modes =
        element_util::element_messages(&element_util::drain(&bus), messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1, "a new utterance: {modes:?}");
    drop(h);
}

/// `omnittssrc server=… append-text`: the sentences stream into the element's timeline in
/// order, the first before `end-text`; the mode message says `sentence`.
#[test]
fn the_element_streams_appended_text_to_the_server() {
    let s = WsServer::start(Mode::Speak);
    let (mut h, bus, e) = playing_live(&s.url);
    assert!(e.emit_by_name::<bool>("append-text", &[&"First one"]));
    assert!(e.emit_by_name::<bool>("append-text", &[&" here. And"]));
    // Audio of the first sentence before the text ends.
    let t0 = Instant::now();
    let mut samples: Vec<f32> = Vec::new();
    let mut offset = None;
    while !samples.iter().any(|&x| x != 0.0) {
        assert!(t0.elapsed() < Duration::from_secs(20), "no speech");
        let b = h.pull().expect("buffer");
        if let Some(o) = offset {
            assert_eq!(b.offset(), o, "contiguous offsets");
        }
        offset = Some(b.offset_end());
        let map = b.map_readable().unwrap();
        samples.extend(
            map.as_slice()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
    }
    let msgs = element_util::drain(&bus);
    assert!(element_util::errors(&msgs).is_empty(), "{msgs:?}");
    let modes = element_util::element_messages(&msgs, messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1);
    assert_eq!(modes[0].get::<String>("mode").unwrap(), "sentence");
    assert!(
        element_util::element_messages(&msgs, messages::DONE).is_empty(),
        "still open"
    );
    assert!(e.emit_by_name::<bool>("append-text", &[&" the second."]));
    assert!(e.emit_by_name::<bool>("end-text", &[]));
    let mut seen = Vec::new();
    let done = element_util::wait_element_message(
        &bus,
        messages::DONE,
        Duration::from_secs(20),
        &mut seen,
    )
    .unwrap_or_else(|| panic!("no done message; the server received {:?}", s.received()));
    assert!(element_util::errors(&seen).is_empty(), "{seen:?}");
    assert_eq!(
        done.get::<String>("text").unwrap(),
        "First one here. And the second."
    );
    assert_eq!(
        done.get::<u64>("samples").unwrap(),
        2 * SENTENCE_SAMPLES as u64
    );
    assert_eq!(done.get::<String>("reason").unwrap(), "eos");
    let texts: Vec<String> = s
        .received()
        .iter()
        .filter(|m| m["type"] == "input.text")
        .map(|m| m["text"].as_str().unwrap().to_string())
        .collect();
    // What came before the session opened goes in its first message; the rest as it came.
    assert_eq!(texts.concat(), "First one here. And the second.");
    assert_eq!(texts.last().map(String::as_str), Some(" the second."));
}
