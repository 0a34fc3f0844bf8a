//! The HTTP side: one `POST /v1/audio/speech` per utterance on a thread of its own, retried with
//! backoff while the server answers 503 (or 429), its body decoded as it arrives; and the probe
//! of `GET /v1/models` that checks the server before the first utterance.

use std::io::Read;
use std::net::ToSocketAddrs;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, Sender};
use std::time::{Duration, Instant};

use crate::engine::{AudioChunk, EngineEvent, FinishReason, Metrics};

use super::body::{AudioDecoder, body_kind, error_message};
use super::error::{MAX_SERVER_TEXT, RemoteError, quote_server_text};
use super::handle::{CancelState, RemoteCanceller, RemoteHandle};
use super::options::ServerOptions;
use super::request::SpeechRequest;
use super::{SAMPLE_RATE, SAMPLES_PER_FRAME};

/// First wait before a request answered 503 / 429 is sent again; doubled each time, up to
/// [`MAX_BACKOFF`]. A `Retry-After` header (seconds) replaces it, also capped.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// Longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(8);
/// Most of an error body read for its message.
const MAX_ERROR_BODY: u64 = 64 << 10;
/// The phase of a request before its answer (named in timeouts).
const SENDING: &str = "waiting for the answer";
/// Bytes read from the body at a time.
const READ_BYTES: usize = 64 << 10;

/// What the probe learnt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerInfo {
    /// Model names (`id`) from `GET /v1/models`.
    pub models: Vec<String>,
    /// The checkpoint each served name stands for (`root` in vLLM's model card: the path or hub
    /// id given to `vllm serve`, also when `--served-model-name` gives it an alias), by `id`.
    pub roots: Vec<(String, String)>,
    /// Voices from `GET /v1/audio/voices` (`voices`, and the names in `uploaded_voices`), when the
    /// server lists them.
    pub voices: Option<Vec<String>>,
    /// The voices uploaded to the server (`POST /v1/audio/voices`; `uploaded_voices` of the
    /// listing): on a Base checkpoint they speak by name, without a reference.
    pub uploaded_voices: Vec<String>,
}

impl ServerInfo {
    /// The checkpoint behind the served name `model` (its `root`), if the listing gave one.
    pub fn root(&self, model: &str) -> Option<&str> {
        self.roots
            .iter()
            .find(|(id, _)| id == model)
            .map(|(_, root)| root.as_str())
    }
}

/// The names in a voice listing's array: strings, or objects with a `name`.
fn voice_names(list: Option<&serde_json::Value>) -> Option<Vec<String>> {
    list.and_then(|l| l.as_array()).map(|l| {
        l.iter()
            .filter_map(|x| {
                x.as_str()
                    .or_else(|| x.get("name").and_then(|n| n.as_str()))
                    .map(str::to_string)
            })
            .collect()
    })
}

/// A client of one vLLM-Omni-compatible speech server. Cheap to clone; each request has its own
/// connection (and agent), so that cancelling one closes only that one.
#[derive(Debug, Clone)]
pub struct SpeechClient {
    options: Arc<ServerOptions>,
}

impl SpeechClient {
    /// A client with `options`; nothing is sent yet.
    pub fn new(options: ServerOptions) -> SpeechClient {
        SpeechClient {
            options: Arc::new(options),
        }
    }

    /// The options it was made with.
    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// The options, shared (for a request's thread).
    pub(crate) fn options_arc(&self) -> Arc<ServerOptions> {
        self.options.clone()
    }

    /// Checks the server: `GET <base>/v1/models` must answer 200 and, with a `model` name, list
    /// it; `GET /v1/audio/voices` is read when it answers. Blocks for up to the timeout per step.
    /// Errors: as for a request (DNS, connect, TLS, HTTP status with the server's message — a
    /// 404 names the URL tried —, stall), or [`RemoteError::Model`].
    pub fn probe(&self) -> Result<ServerInfo, RemoteError> {
        let o = &*self.options;
        let agent = agent(o);
        let url = o.url.join("/v1/models");
        let mut resp = get(&agent, o, &url).map_err(|e| classify(e, o, &url, SENDING))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let mut e = status_error(&mut resp, &url, 0);
            if let RemoteError::Status { message, .. } = &mut e
                && status == 404
            {
                message.push_str(
                    " (no model list there: give server as the speech server's base URL, \
                     http://host:port or http://host:port/v1)",
                );
            }
            return Err(e);
        }
        let mut info = ServerInfo::default();
        let v: serde_json::Value = read_json(&mut resp, o, &url)?;
        for m in v
            .get("data")
            .and_then(|d| d.as_array())
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let Some(id) = m.get("id").and_then(|i| i.as_str()) else {
                continue;
            };
            info.models.push(id.to_string());
            if let Some(root) = m.get("root").and_then(|r| r.as_str()) {
                info.roots.push((id.to_string(), root.to_string()));
            }
        }
        if let Some(model) = &o.model
            && !info.models.is_empty()
            && !info.models.iter().any(|m| m == model)
        {
            return Err(RemoteError::Model {
                url: o.url.to_string(),
                model: model.clone(),
                served: info.models.join(", "),
            });
        }
        let voices_url = o.url.join("/v1/audio/voices");
        if let Ok(mut r) = get(&agent, o, &voices_url)
            && r.status().as_u16() == 200
            && let Ok(v) = read_json(&mut r, o, &voices_url)
        {
            info.uploaded_voices = voice_names(v.get("uploaded_voices")).unwrap_or_default();
            info.voices = voice_names(v.get("voices")).map(|mut all| {
                for u in &info.uploaded_voices {
                    if !all.iter().any(|n| n.eq_ignore_ascii_case(u)) {
                        all.push(u.clone());
                    }
                }
                all
            });
        }
        Ok(info)
    }

    /// Starts one utterance: the request is sent on a thread of its own; its events arrive on
    /// the handle (see [`RemoteHandle`]). `request.max_new_tokens` decides between the finish
    /// reasons `length` (`max_new_tokens − 1` frames came, the most an utterance has) and `eos`. Errors: the thread cannot be spawned.
    pub fn submit(&self, request: SpeechRequest) -> std::io::Result<RemoteHandle> {
        let state = Arc::new(CancelState::default());
        let (tx, rx) = mpsc::channel();
        let run = Run {
            options: self.options.clone(),
            max_new_tokens: request.max_new_tokens,
            body: request.to_json(),
            state: state.clone(),
            tx,
            submitted: Instant::now(),
        };
        std::thread::Builder::new()
            .name("omnitts-remote".into())
            .spawn(move || run.run())?;
        Ok(RemoteHandle {
            events: rx,
            canceller: RemoteCanceller { state },
            done: AtomicBool::new(false),
        })
    }
}

/// An agent for one request: HTTP errors as responses, no redirects, `timeout` for the name
/// lookup, the connection and each read and write.
fn agent(o: &ServerOptions) -> ureq::Agent {
    let t = Some(o.timeout);
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_resolve(t)
        .timeout_connect(t)
        .timeout_per_read(t)
        .timeout_per_write(t)
        .user_agent(concat!("omnitts/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

fn get(
    agent: &ureq::Agent,
    o: &ServerOptions,
    url: &str,
) -> Result<ureq::http::Response<ureq::Body>, ureq::Error> {
    let mut req = agent.get(url).header("Accept", "application/json");
    if let Some(key) = &o.api_key {
        req = req.header("Authorization", key.bearer());
    }
    req.call()
}

fn read_json(
    resp: &mut ureq::http::Response<ureq::Body>,
    o: &ServerOptions,
    url: &str,
) -> Result<serde_json::Value, RemoteError> {
    let text = resp
        .body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY * 16)
        .read_to_string()
        .map_err(|e| classify(e, o, url, "while reading the answer"))?;
    serde_json::from_str(&text).map_err(|e| RemoteError::Protocol {
        url: url.to_string(),
        detail: format!("the answer is not JSON ({e})"),
    })
}

/// The error of a non-200 answer, with the server's message.
fn status_error(
    resp: &mut ureq::http::Response<ureq::Body>,
    url: &str,
    retries: u32,
) -> RemoteError {
    let status = resp.status();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY)
        .lossy_utf8(true)
        .read_to_string()
        .unwrap_or_default();
    let from_body = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| error_message(&v))
        .or_else(|| Some(quote_server_text(&body, MAX_SERVER_TEXT)).filter(|s| !s.is_empty()));
    let reason = status.canonical_reason().unwrap_or("");
    let message = match (reason, from_body) {
        ("", Some(m)) => m,
        (r, Some(m)) => format!("{r}: {m}"),
        (r, None) => r.to_string(),
    };
    RemoteError::Status {
        url: url.to_string(),
        status: status.as_u16(),
        message,
        retries,
    }
}

fn is_tls(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>())
}

/// A transport error → what the user is told. `phase` says what was being waited for when a
/// timeout struck.
fn classify(e: ureq::Error, o: &ServerOptions, url: &str, phase: &'static str) -> RemoteError {
    let url = url.to_string();
    let dns = |detail: String| {
        let host = o.url.host_port().map(|(h, _)| h).unwrap_or_default();
        RemoteError::Dns {
            url: url.clone(),
            host,
            detail,
        }
    };
    match e {
        ureq::Error::HostNotFound => dns("no address found".into()),
        ureq::Error::Timeout(t) => RemoteError::Stalled {
            url,
            after: o.timeout,
            phase: match t {
                ureq::Timeout::Resolve => "resolving the host name",
                ureq::Timeout::Connect => "connecting",
                _ => phase,
            },
        },
        ureq::Error::Rustls(r) => RemoteError::Tls {
            url,
            detail: r.to_string(),
        },
        ureq::Error::Tls(t) => RemoteError::Tls {
            url,
            detail: t.to_string(),
        },
        ureq::Error::Io(io) if is_tls(&io) => RemoteError::Tls {
            url,
            detail: io.to_string(),
        },
        ureq::Error::Io(io) => {
            // The name lookup fails as an I/O error too: look again to tell it apart.
            if let Some((host, port)) = o.url.host_port()
                && let Err(lookup) = (host.as_str(), port).to_socket_addrs()
            {
                return dns(lookup.to_string());
            }
            use std::io::ErrorKind::*;
            match io.kind() {
                ConnectionRefused | AddrNotAvailable | NetworkUnreachable | HostUnreachable
                | NetworkDown | NotConnected => RemoteError::Connect {
                    url,
                    detail: io.to_string(),
                },
                TimedOut | WouldBlock => RemoteError::Stalled {
                    url,
                    after: o.timeout,
                    phase,
                },
                UnexpectedEof | ConnectionReset | ConnectionAborted
                    if o.url.is_https() && phase == SENDING =>
                {
                    RemoteError::Tls {
                        url,
                        detail: format!(
                            "the server closed the connection before a TLS session was \
                             established ({io}); if it speaks plain HTTP, use http://"
                        ),
                    }
                }
                _ => RemoteError::Protocol {
                    url,
                    detail: format!("the connection failed {phase}: {io}"),
                },
            }
        }
        ureq::Error::Protocol(p) => RemoteError::Protocol {
            url,
            detail: format!("not an HTTP/1.1 answer: {p}"),
        },
        ureq::Error::BadUri(b) => RemoteError::BadUrl { url, why: b },
        ureq::Error::RedirectFailed | ureq::Error::TooManyRedirects => RemoteError::Protocol {
            url,
            detail: "the server redirects the request; set server to the address it redirects to"
                .into(),
        },
        other => RemoteError::Protocol {
            url,
            detail: other.to_string(),
        },
    }
}

/// The wait before attempt `attempt + 1`: `Retry-After` seconds if the server sent it, else
/// [`FIRST_BACKOFF`] doubled per attempt; at most [`MAX_BACKOFF`].
fn backoff(attempt: u32, retry_after: Option<&str>) -> Duration {
    let wait = retry_after
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or_else(|| FIRST_BACKOFF.saturating_mul(1 << attempt.min(16)));
    wait.min(MAX_BACKOFF)
}

/// One request's thread.
struct Run {
    options: Arc<ServerOptions>,
    max_new_tokens: Option<u32>,
    body: Vec<u8>,
    state: Arc<CancelState>,
    tx: Sender<EngineEvent>,
    submitted: Instant,
}

/// What the thread measured (times from `submitted`).
#[derive(Default)]
struct Tally {
    started: Option<Instant>,
    first_audio: Option<Instant>,
    samples: u64,
}

impl Run {
    fn run(self) {
        let mut tally = Tally::default();
        let outcome = self.stream(&mut tally);
        let frames = (tally.samples / SAMPLES_PER_FRAME as u64) as usize;
        let reason = match outcome {
            _ if self.state.is_cancelled() => FinishReason::Cancelled,
            // The talker's last token at the cap gets no residual codes and no frame (as in the
            // reference, and in the local engine): a capped utterance has max_new_tokens − 1.
            Ok(())
                if self
                    .max_new_tokens
                    .is_some_and(|m| frames + 1 >= m as usize) =>
            {
                FinishReason::Length
            }
            Ok(()) => FinishReason::Eos,
            // vLLM-Omni fails a Base utterance at its token budget after sending the audio.
            Err(e) if e.is_token_budget() && tally.samples > 0 => FinishReason::Length,
            Err(e) => FinishReason::Error(e.to_string()),
        };
        let metrics = tally.metrics(self.submitted, Instant::now());
        let _ = self.tx.send(EngineEvent::Finished { reason, metrics });
    }

    /// Sends the request (with retries) and streams its audio; Ok when the audio ended as it
    /// should.
    fn stream(&self, tally: &mut Tally) -> Result<(), RemoteError> {
        let o = &*self.options;
        let url = o.url.speech();
        let resp = self.send(&url).map_err(no_first_audio)?;
        tally.started = Some(Instant::now());
        let _ = self.tx.send(EngineEvent::Started);
        let content_type = resp
            .headers()
            .get(ureq::http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let kind = body_kind(content_type.as_deref(), &url)?;
        let mut decoder = AudioDecoder::new(kind, &url);
        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; READ_BYTES];
        let mut samples = Vec::new();
        let audio_s = |t: &Tally| t.samples as f64 / SAMPLE_RATE as f64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(io) => {
                    let e = ureq::Error::from(io);
                    return Err(match classify(e, o, &url, "while streaming the audio") {
                        stalled @ RemoteError::Stalled { .. } if tally.samples == 0 => {
                            no_first_audio(stalled)
                        }
                        stalled @ RemoteError::Stalled { .. } => stalled,
                        other => RemoteError::Protocol {
                            url: url.clone(),
                            detail: format!(
                                "the stream was cut off after {:.2} s of audio ({})",
                                audio_s(tally),
                                other
                            ),
                        },
                    });
                }
            };
            // The audio decoded before an error in the same read (a `speech.audio.error` right
            // after the last deltas) is delivered before the error.
            let fed = decoder.feed(&buf[..n], &mut samples);
            if !samples.is_empty() {
                self.emit(std::mem::take(&mut samples), tally);
            }
            let complete = fed?;
            if complete {
                return Ok(());
            }
            if self.state.is_cancelled() {
                return Ok(());
            }
        }
        decoder.end(audio_s(tally))
    }

    /// Posts the request until it is answered 200, waiting and trying again on 503 / 429 up to
    /// `retries` times.
    fn send(&self, url: &str) -> Result<ureq::http::Response<ureq::Body>, RemoteError> {
        let o = &*self.options;
        let cancelled = || RemoteError::Protocol {
            url: url.to_string(),
            detail: "cancelled".into(),
        };
        let mut attempt = 0;
        loop {
            let agent = agent(o);
            if !self.state.set_agent(agent.clone()) {
                return Err(cancelled());
            }
            let mut req = agent
                .post(url)
                .header("Content-Type", "application/json")
                .header("Accept", "audio/pcm, text/event-stream");
            if let Some(key) = &o.api_key {
                req = req.header("Authorization", key.bearer());
            }
            let mut resp = req
                .send(&self.body[..])
                .map_err(|e| classify(e, o, url, SENDING))?;
            let status = resp.status().as_u16();
            if status == 200 {
                return Ok(resp);
            }
            if matches!(status, 503 | 429) && attempt < o.retries {
                let retry_after = resp
                    .headers()
                    .get(ureq::http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                drop(resp);
                if !self.state.sleep(backoff(attempt, retry_after.as_deref())) {
                    return Err(cancelled());
                }
                attempt += 1;
                continue;
            }
            return Err(status_error(&mut resp, url, attempt));
        }
    }

    /// Hands `samples` to the handle (after `FirstAudio` the first time).
    fn emit(&self, samples: Vec<f32>, tally: &mut Tally) {
        if tally.first_audio.is_none() {
            let now = Instant::now();
            tally.first_audio = Some(now);
            let ttfa_ms = ms(now.saturating_duration_since(self.submitted));
            let _ = self.tx.send(EngineEvent::FirstAudio { ttfa_ms });
        }
        let offset = tally.samples;
        tally.samples += samples.len() as u64;
        let _ = self
            .tx
            .send(EngineEvent::Audio(AudioChunk { samples, offset }));
    }
}

/// A speech request's stall before any audio arrived, reported as such (the answer's head or
/// its first chunk did not come within the timeout); other errors unchanged.
fn no_first_audio(e: RemoteError) -> RemoteError {
    match e {
        RemoteError::Stalled { url, after, phase }
            if phase == SENDING || phase == "while streaming the audio" =>
        {
            RemoteError::NoFirstAudio { url, after }
        }
        other => other,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Tally {
    /// The engine's metrics as far as a client can tell: frames and audio from the samples, TTFA
    /// from submit, RTF over the time from the 200 answer to the end; the stage timings are the
    /// server's and stay 0.
    fn metrics(&self, submitted: Instant, finished: Instant) -> Metrics {
        let audio_ms = self.samples as f64 * 1e3 / SAMPLE_RATE as f64;
        let started = self.started.unwrap_or(finished);
        let processing = ms(finished.saturating_duration_since(started));
        Metrics {
            frames: (self.samples / SAMPLES_PER_FRAME as u64) as usize,
            audio_ms,
            ttfa_ms: self
                .first_audio
                .map(|t| ms(t.saturating_duration_since(submitted))),
            rtf: if audio_ms > 0.0 {
                processing / audio_ms
            } else {
                0.0
            },
            wall_ms: ms(finished.saturating_duration_since(submitted)),
            queue_ms: ms(started.saturating_duration_since(submitted)),
            ..Metrics::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(0, None), Duration::from_millis(250));
        assert_eq!(backoff(2, None), Duration::from_secs(1));
        assert_eq!(backoff(10, None), MAX_BACKOFF);
        assert_eq!(backoff(0, Some("2")), Duration::from_secs(2));
        assert_eq!(backoff(0, Some("3600")), MAX_BACKOFF);
        assert_eq!(backoff(1, Some("soon")), Duration::from_millis(500));
    }

    #[test]
    fn tally_metrics() {
        let t0 = Instant::now();
        let tally = Tally {
            started: Some(t0 + Duration::from_millis(100)),
            first_audio: Some(t0 + Duration::from_millis(300)),
            samples: 3 * SAMPLES_PER_FRAME as u64 + 5,
        };
        let m = tally.metrics(t0, t0 + Duration::from_millis(340));
        assert_eq!(m.frames, 3);
        assert!((m.ttfa_ms.unwrap() - 300.0).abs() < 1e-6);
        assert!((m.audio_ms - 5765.0 / 24.0).abs() < 1e-6);
        assert!((m.rtf - 240.0 / m.audio_ms).abs() < 1e-9);
        assert!((m.queue_ms - 100.0).abs() < 1e-6);
    }
}
