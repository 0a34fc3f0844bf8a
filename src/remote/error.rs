//! What can go wrong talking to the server. Every message names the server URL (never the API
//! key); text from the server is quoted with its control characters escaped and cut at
//! [`MAX_SERVER_TEXT`] characters.

use std::time::Duration;

/// Longest piece of server text (an error body, an SSE error message) quoted in an error.
pub const MAX_SERVER_TEXT: usize = 500;

/// A failed request or probe. Errors before any audio are reported as such; errors while the
/// audio streams end the utterance with this text as its `error` finish reason.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RemoteError {
    /// The `server` URL cannot be used.
    #[error("server '{url}': {why}")]
    BadUrl {
        /// The URL as given (user credentials hidden).
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The host name does not resolve.
    #[error("{url}: cannot resolve host '{host}': {detail}")]
    Dns {
        /// The server URL.
        url: String,
        /// The host name.
        host: String,
        /// The resolver's message.
        detail: String,
    },
    /// No TCP connection (refused, unreachable, reset).
    #[error("{url}: cannot connect: {detail}")]
    Connect {
        /// The server URL.
        url: String,
        /// The socket error.
        detail: String,
    },
    /// The TLS handshake failed (an `https://` URL to a plain HTTP server, a certificate that does
    /// not verify, ...).
    #[error("{url}: TLS error: {detail}")]
    Tls {
        /// The server URL.
        url: String,
        /// The TLS library's message.
        detail: String,
    },
    /// The server stopped sending for longer than the timeout.
    #[error(
        "{url}: the server sent nothing for {:.1} s {phase} (server-timeout)",
        after.as_secs_f64()
    )]
    Stalled {
        /// The server URL.
        url: String,
        /// The timeout.
        after: Duration,
        /// "before answering", "while streaming the audio", ...
        phase: &'static str,
    },
    /// The server sent no audio for longer than the timeout after the request was sent (it may
    /// be busy with other utterances, or still preparing this one's first chunk).
    #[error(
        "{url}: no first audio within {:.1} s (server-timeout); the server may be busy or the \
         first chunk slow",
        after.as_secs_f64()
    )]
    NoFirstAudio {
        /// The server URL.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The server answered with an error status.
    #[error("{url}: HTTP {status}: {message}{}", retried(*retries))]
    Status {
        /// The URL requested.
        url: String,
        /// The status code.
        status: u16,
        /// The server's message (from its JSON error body, else the body text, else the reason).
        message: String,
        /// How many times the request was sent again before giving up (503 / 429).
        retries: u32,
    },
    /// The server reported an error in the stream (`speech.audio.error`).
    #[error("{url}: the server failed the utterance: {message}")]
    Server {
        /// The server URL.
        url: String,
        /// The server's message.
        message: String,
    },
    /// The answer is not the audio asked for: content type, sample rate, a stream cut off, a
    /// malformed event.
    #[error("{url}: {detail}")]
    Protocol {
        /// The server URL.
        url: String,
        /// What was wrong.
        detail: String,
    },
    /// The server has no streaming-input websocket (`append-text` with `server=`): it refused
    /// the upgrade at `/v1/audio/speech/stream`.
    #[error(
        "{url}: the server has no streaming-input endpoint (HTTP {status} on the websocket \
         upgrade): append-text needs vLLM-Omni's /v1/audio/speech/stream websocket; push-text \
         works with this server (whole texts through POST /v1/audio/speech)"
    )]
    NoStreamInput {
        /// The websocket URL tried.
        url: String,
        /// The status of the refused upgrade (404, or 403).
        status: u16,
    },
    /// `server-model` names a model the server does not serve.
    #[error("{url}: server-model '{model}' is not served here; the server serves: {served}")]
    Model {
        /// The server URL.
        url: String,
        /// The name asked for.
        model: String,
        /// The names the server listed, comma-separated.
        served: String,
    },
}

/// The words of vLLM-Omni's error for a Base utterance that reached its token budget without an
/// end (`Qwen3TTSCodecLimitError`: "… did not emit codec EOS before its token budget …").
const TOKEN_BUDGET_WORDS: [&str; 2] = ["did not emit codec EOS", "token budget"];

impl RemoteError {
    /// Whether the server ended the utterance because it reached its token budget (vLLM-Omni
    /// reports this for Base checkpoints as an error, after the audio): the utterance is then
    /// complete up to `max-new-tokens`, a `length` finish rather than a failure.
    pub fn is_token_budget(&self) -> bool {
        match self {
            RemoteError::Server { message, .. } => {
                TOKEN_BUDGET_WORDS.iter().any(|w| message.contains(w))
            }
            _ => false,
        }
    }
}

fn retried(retries: u32) -> String {
    match retries {
        0 => String::new(),
        1 => " (still so after 1 retry; server-retries sets how many)".to_string(),
        n => format!(" (still so after {n} retries; server-retries sets how many)"),
    }
}

/// `text` trimmed, control characters escaped (no terminal escape reaches a log), cut at `max`
/// characters with "…".
pub(crate) fn quote_server_text(text: &str, max: usize) -> String {
    let text = text.trim();
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_text_is_escaped_and_cut() {
        assert_eq!(quote_server_text(" a\u{1b}[2Jb\n ", 10), "a\\u{1b}[2Jb");
        assert_eq!(quote_server_text("abcdef", 3), "abc…");
    }

    #[test]
    fn retries_are_named() {
        let e = RemoteError::Status {
            url: "http://h/v1/audio/speech".into(),
            status: 503,
            message: "queue full".into(),
            retries: 2,
        };
        assert_eq!(
            e.to_string(),
            "http://h/v1/audio/speech: HTTP 503: queue full (still so after 2 retries; \
             server-retries sets how many)"
        );
    }
}
