//! The body of a 200 answer → samples: raw 16-bit PCM (`audio/pcm`) or server-sent events
//! (`text/event-stream`, vLLM-Omni serving_speech.py `_generate_audio_sse_events`, commit
//! 12651860e57754e73712ce1785cda4ef82c8bb7e):
//!
//! ```text
//! event: speech.audio.delta
//! data: {"type":"speech.audio.delta","audio":"<base64 PCM16>","response_format":"pcm"}
//!
//! event: speech.audio.done
//! data: {"type":"speech.audio.done","usage":{...}}
//! ```
//!
//! or, when the synthesis fails after the answer started, `speech.audio.error` with
//! `{"error":{"message":...,"type":...,"code":...}}`. The form is chosen by the content type,
//! whatever the request asked for.

use base64::Engine as _;

use super::SAMPLE_RATE;
use super::error::{MAX_SERVER_TEXT, RemoteError, quote_server_text};
use super::pcm::S16Decoder;
use super::sse::{SseEvent, SseParser};

/// How the body carries the audio.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Raw little-endian 16-bit mono PCM.
    Pcm,
    /// Server-sent events with base64 PCM deltas.
    Sse,
}

/// The body kind of a `Content-Type`. Raw PCM is `audio/pcm` (or `application/octet-stream`);
/// a `rate` or `channels` parameter must say 24000 and 1. Errors: another type, another rate.
pub fn body_kind(content_type: Option<&str>, url: &str) -> Result<BodyKind, RemoteError> {
    let protocol = |detail: String| RemoteError::Protocol {
        url: url.to_string(),
        detail,
    };
    let Some(ct) = content_type.map(str::trim).filter(|c| !c.is_empty()) else {
        return Err(protocol(
            "the answer has no content type (expected audio/pcm or text/event-stream)".into(),
        ));
    };
    let mut parts = ct.split(';');
    let mime = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let kind = match mime.as_str() {
        "audio/pcm" | "application/octet-stream" => BodyKind::Pcm,
        "text/event-stream" => BodyKind::Sse,
        _ => {
            return Err(protocol(format!(
                "unexpected content type '{}' (expected audio/pcm or text/event-stream)",
                quote_server_text(ct, 100)
            )));
        }
    };
    for param in parts {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim().trim_matches('"');
        let expected = match key.as_str() {
            "rate" => SAMPLE_RATE,
            "channels" => 1,
            _ => continue,
        };
        if value.parse::<u32>().ok() != Some(expected) {
            let what = if key == "rate" {
                format!("{value} Hz audio; omnittssrc needs {SAMPLE_RATE} Hz")
            } else {
                format!("{value} channels; omnittssrc needs mono")
            };
            return Err(protocol(format!(
                "the server sends {} (content type '{}')",
                quote_server_text(&what, 100),
                quote_server_text(ct, 100)
            )));
        }
    }
    Ok(kind)
}

/// Turns the body's bytes into samples as they arrive.
#[derive(Debug)]
pub struct AudioDecoder {
    kind: BodyKind,
    url: String,
    pcm: S16Decoder,
    sse: SseParser,
    events: Vec<SseEvent>,
    done: bool,
}

impl AudioDecoder {
    /// A decoder for a body of `kind` from `url` (named in errors).
    pub fn new(kind: BodyKind, url: &str) -> AudioDecoder {
        AudioDecoder {
            kind,
            url: url.to_string(),
            pcm: S16Decoder::default(),
            sse: SseParser::default(),
            events: Vec::new(),
            done: false,
        }
    }

    fn protocol(&self, detail: String) -> RemoteError {
        RemoteError::Protocol {
            url: self.url.clone(),
            detail,
        }
    }

    /// Decodes `bytes`, appending samples to `out`. Returns true once the stream said it is
    /// complete (`speech.audio.done`); later bytes are not looked at. Errors: a malformed event,
    /// audio in another format or rate, `speech.audio.error` (the server's message).
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<f32>) -> Result<bool, RemoteError> {
        if self.done {
            return Ok(true);
        }
        match self.kind {
            BodyKind::Pcm => self.pcm.push(bytes, out),
            BodyKind::Sse => {
                self.sse
                    .push(bytes, &mut self.events)
                    .map_err(|e| self.protocol(e.to_string()))?;
                for ev in std::mem::take(&mut self.events) {
                    if self.event(&ev, out)? {
                        self.done = true;
                        break;
                    }
                }
            }
        }
        Ok(self.done)
    }

    /// One SSE event; true when it ends the stream.
    fn event(&mut self, ev: &SseEvent, out: &mut Vec<f32>) -> Result<bool, RemoteError> {
        if ev.data.trim() == "[DONE]" {
            return Ok(true);
        }
        let v: serde_json::Value = serde_json::from_str(&ev.data).map_err(|e| {
            self.protocol(format!(
                "a malformed event ({e}): '{}'",
                quote_server_text(&ev.data, 100)
            ))
        })?;
        let kind = v
            .get("type")
            .and_then(|t| t.as_str())
            .unwrap_or(ev.event.as_str());
        match kind {
            "speech.audio.delta" => {
                if let Some(f) = v.get("response_format").and_then(|f| f.as_str())
                    && f != "pcm"
                {
                    return Err(self.protocol(format!(
                        "the events carry '{}' audio; omnittssrc asks for pcm",
                        quote_server_text(f, 40)
                    )));
                }
                if let Some(rate) = v.get("sample_rate").and_then(|r| r.as_u64())
                    && rate != SAMPLE_RATE as u64
                {
                    return Err(self.protocol(format!(
                        "the server sends {rate} Hz audio; omnittssrc needs {SAMPLE_RATE} Hz"
                    )));
                }
                let b64 = v.get("audio").and_then(|a| a.as_str()).unwrap_or("");
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| {
                        self.protocol(format!("a speech.audio.delta is not base64: {e}"))
                    })?;
                self.pcm.push(&bytes, out);
                Ok(false)
            }
            "speech.audio.done" => Ok(true),
            "speech.audio.error" | "error" => Err(RemoteError::Server {
                url: self.url.clone(),
                message: error_message(&v)
                    .unwrap_or_else(|| quote_server_text(&ev.data, MAX_SERVER_TEXT)),
            }),
            _ => Ok(false),
        }
    }

    /// The body ended (EOF): an error if it ended inside a sample, or (SSE) before
    /// `speech.audio.done`. `audio_s` is named in the error.
    pub fn end(&self, audio_s: f64) -> Result<(), RemoteError> {
        if self.kind == BodyKind::Sse && !self.done {
            return Err(self.protocol(format!(
                "the event stream ended without speech.audio.done, after {audio_s:.2} s of audio"
            )));
        }
        if self.pcm.mid_sample() {
            return Err(self.protocol(format!(
                "the stream ended inside a sample (an odd number of bytes), after {audio_s:.2} s \
                 of audio"
            )));
        }
        Ok(())
    }
}

/// The message of an OpenAI-style error object: `{"error":{"message":...}}`, `{"error":"..."}`,
/// `{"message":...}` (vLLM's `ErrorResponse`) or FastAPI's `{"detail":...}` (a string, or a list of
/// `{"loc":[...],"msg":...}`).
pub fn error_message(v: &serde_json::Value) -> Option<String> {
    let text = |s: &str| Some(quote_server_text(s, MAX_SERVER_TEXT)).filter(|s| !s.is_empty());
    if let Some(e) = v.get("error") {
        if let Some(s) = e.as_str() {
            return text(s);
        }
        if let Some(m) = e.get("message").and_then(|m| m.as_str()) {
            return text(m);
        }
    }
    if let Some(m) = v.get("message").and_then(|m| m.as_str()) {
        return text(m);
    }
    match v.get("detail") {
        Some(serde_json::Value::String(s)) => text(s),
        Some(serde_json::Value::Array(items)) => {
            let msgs: Vec<String> = items
                .iter()
                .filter_map(|i| {
                    let msg = i.get("msg")?.as_str()?;
                    let loc = i
                        .get("loc")
                        .and_then(|l| l.as_array())
                        .map(|l| {
                            l.iter()
                                .map(|p| p.as_str().map_or(p.to_string(), str::to_string))
                                .collect::<Vec<_>>()
                                .join(".")
                        })
                        .unwrap_or_default();
                    Some(if loc.is_empty() {
                        msg.to_string()
                    } else {
                        format!("{loc}: {msg}")
                    })
                })
                .collect();
            text(&msgs.join("; "))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "http://h/v1/audio/speech";

    fn pcm_bytes(v: &[i16]) -> Vec<u8> {
        v.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    fn delta(v: &[i16]) -> String {
        format!(
            "event: speech.audio.delta\ndata: {{\"type\":\"speech.audio.delta\",\"audio\":\"{}\",\
             \"response_format\":\"pcm\"}}\n\n",
            base64::engine::general_purpose::STANDARD.encode(pcm_bytes(v))
        )
    }

    #[test]
    fn content_types() {
        assert_eq!(body_kind(Some("audio/pcm"), URL), Ok(BodyKind::Pcm));
        assert_eq!(
            body_kind(Some("audio/PCM; rate=24000; channels=1"), URL),
            Ok(BodyKind::Pcm)
        );
        assert_eq!(
            body_kind(Some("text/event-stream; charset=utf-8"), URL),
            Ok(BodyKind::Sse)
        );
        let e = body_kind(Some("audio/pcm;rate=16000"), URL)
            .unwrap_err()
            .to_string();
        assert!(e.contains("16000 Hz") && e.contains("24000 Hz"), "{e}");
        let e = body_kind(Some("audio/pcm;channels=2"), URL)
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 channels"), "{e}");
        let e = body_kind(Some("application/json"), URL)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'application/json'"), "{e}");
        assert!(body_kind(None, URL).is_err());
    }

    #[test]
    fn sse_deltas_become_samples_and_done_ends() {
        let mut d = AudioDecoder::new(BodyKind::Sse, URL);
        let text = format!(
            "{}{}event: speech.audio.done\ndata: {{\"type\":\"speech.audio.done\"}}\n\n{}",
            delta(&[1, 2, 3]),
            delta(&[-4]),
            delta(&[9])
        );
        let mut out = Vec::new();
        let mut ended = false;
        for piece in text.as_bytes().chunks(5) {
            ended = d.feed(piece, &mut out).unwrap();
        }
        assert!(ended);
        let want: Vec<f32> = [1, 2, 3, -4].iter().map(|&v| v as f32 / 32767.0).collect();
        assert_eq!(out, want);
        assert!(d.end(0.0).is_ok());
    }

    #[test]
    fn sse_faults() {
        let mut d = AudioDecoder::new(BodyKind::Sse, URL);
        let mut out = Vec::new();
        d.feed(delta(&[5, 6]).as_bytes(), &mut out).unwrap();
        let e = d.end(0.5).unwrap_err().to_string();
        assert!(e.contains("without speech.audio.done"), "{e}");

        let err = "event: speech.audio.error\ndata: {\"type\":\"speech.audio.error\",\"error\":\
                   {\"message\":\"CUDA out of memory\",\"type\":\"server_error\",\"code\":500}}\n\n";
        let e = d.feed(err.as_bytes(), &mut out).unwrap_err().to_string();
        assert!(e.contains("CUDA out of memory"), "{e}");

        let wav = "data: {\"type\":\"speech.audio.delta\",\"audio\":\"\",\"response_format\":\"wav\"}\n\n";
        let e = AudioDecoder::new(BodyKind::Sse, URL)
            .feed(wav.as_bytes(), &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("'wav'"), "{e}");
        let e = AudioDecoder::new(BodyKind::Sse, URL)
            .feed(b"data: {not json\n\n", &mut out)
            .unwrap_err()
            .to_string();
        assert!(e.contains("malformed"), "{e}");
    }

    #[test]
    fn pcm_ending_mid_sample_is_an_error() {
        let mut d = AudioDecoder::new(BodyKind::Pcm, URL);
        let mut out = Vec::new();
        assert!(!d.feed(&pcm_bytes(&[7, 8])[..3], &mut out).unwrap());
        assert_eq!(out.len(), 1);
        assert!(d.end(0.1).is_err());
    }

    #[test]
    fn error_bodies() {
        let m = |s: &str| error_message(&serde_json::from_str(s).unwrap());
        assert_eq!(
            m(r#"{"error":{"message":"Invalid voice 'x'","type":"BadRequestError","code":400}}"#),
            Some("Invalid voice 'x'".into())
        );
        assert_eq!(
            m(r#"{"object":"error","message":"busy"}"#),
            Some("busy".into())
        );
        assert_eq!(
            m(r#"{"detail":[{"loc":["body","input"],"msg":"Field required"}]}"#),
            Some("body.input: Field required".into())
        );
        assert_eq!(m(r#"{"x":1}"#), None);
    }
}
