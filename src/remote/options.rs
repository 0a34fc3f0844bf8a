//! What a [`SpeechClient`](super::SpeechClient) needs: the server's URL, the served model, the API
//! key, the stream protocol, the retry budget and the stall timeout.

use std::fmt;
use std::time::Duration;

use super::error::RemoteError;

/// The environment variable read for the API key when none is given: `OMNITTS_SERVER_API_KEY`.
///
/// Not `OPENAI_API_KEY`: that key belongs to another service, and sending it to whatever host
/// `server` names would hand it to that host.
pub const API_KEY_ENV: &str = "OMNITTS_SERVER_API_KEY";

/// A bearer token for the server's `Authorization` header. Its `Debug` and `Display` never show
/// it, so settings and errors that hold one can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// `key` trimmed; `None` when empty.
    pub fn new(key: &str) -> Option<ApiKey> {
        let key = key.trim();
        (!key.is_empty()).then(|| ApiKey(key.to_string()))
    }

    /// The key in [`API_KEY_ENV`], if set and not empty.
    pub fn from_env() -> Option<ApiKey> {
        std::env::var(API_KEY_ENV)
            .ok()
            .as_deref()
            .and_then(ApiKey::new)
    }

    /// The header value, `Bearer <key>`.
    pub(crate) fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How the audio is to be streamed (the request's `stream_format`). Whatever was asked, the body
/// is decoded by its content type.
///
/// SSE is the default: a failure after the audio started arrives as `speech.audio.error` with
/// the server's reason (and vLLM-Omni's "token budget" end of a Base utterance can be told from a
/// failure), where raw PCM has only a connection closed before the end of its chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamProtocol {
    /// Raw 16-bit PCM in a chunked body (`stream_format: "audio"`, `response_format: "pcm"`).
    Pcm,
    /// Server-sent events, `speech.audio.delta` with base64 PCM (`stream_format: "sse"`).
    #[default]
    Sse,
}

impl StreamProtocol {
    /// The request's `stream_format` value.
    pub fn stream_format(self) -> &'static str {
        match self {
            StreamProtocol::Pcm => "audio",
            StreamProtocol::Sse => "sse",
        }
    }
}

/// The server's base URL: `http://` or `https://`, a host, an optional port and path prefix.
/// Requests go to `<base>/v1/audio/speech`; a URL given with that path already, or ending in
/// `/v1` (the base URL as OpenAI clients and vLLM-Omni's docs write it), is taken as its base.
#[derive(Clone, PartialEq, Eq)]
pub struct ServerUrl {
    /// Scheme, authority and path prefix, without a trailing slash.
    base: String,
    https: bool,
}

const SPEECH_PATH: &str = "/v1/audio/speech";
/// The API's own prefix: `http://host:port/v1` names the server at `http://host:port`.
const API_PREFIX: &str = "/v1";

impl ServerUrl {
    /// Parses `url`. Errors: no `http`/`https` scheme, no host, user credentials in the URL
    /// (use the API key), a query or fragment.
    pub fn parse(url: &str) -> Result<ServerUrl, RemoteError> {
        let bad = |why: &str| RemoteError::BadUrl {
            url: redact_userinfo(url),
            why: why.to_string(),
        };
        let trimmed = url.trim();
        if trimmed.is_empty() {
            return Err(bad("empty; give the server as http://host:port"));
        }
        let uri: ureq::http::Uri = trimmed
            .parse()
            .map_err(|e: ureq::http::uri::InvalidUri| bad(&e.to_string()))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => {
                return Err(bad(&format!(
                    "scheme '{other}' is not supported; use http:// or https://"
                )));
            }
            None => return Err(bad("no scheme; use http://host:port or https://host")),
        };
        let Some(authority) = uri.authority() else {
            return Err(bad("no host"));
        };
        if authority.as_str().contains('@') {
            return Err(bad(
                "credentials in the URL are not supported; give the key in server-api-key",
            ));
        }
        if authority.host().is_empty() {
            return Err(bad("no host"));
        }
        if uri.query().is_some() || trimmed.contains('#') {
            return Err(bad("a query or fragment is not supported"));
        }
        let mut path = uri.path().trim_end_matches('/');
        if let Some(prefix) = path.strip_suffix(SPEECH_PATH) {
            path = prefix;
        } else if let Some(prefix) = path.strip_suffix(API_PREFIX) {
            path = prefix;
        }
        let scheme = if https { "https" } else { "http" };
        Ok(ServerUrl {
            base: format!("{scheme}://{}{path}", authority.as_str()),
            https,
        })
    }

    /// `<base>/v1/audio/speech`.
    pub fn speech(&self) -> String {
        format!("{}{SPEECH_PATH}", self.base)
    }

    /// `<base><path>` (`path` starts with `/`).
    pub fn join(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Whether the URL is `https://`.
    pub fn is_https(&self) -> bool {
        self.https
    }

    /// The host and port to resolve (for telling a DNS failure from others).
    pub(crate) fn host_port(&self) -> Option<(String, u16)> {
        let uri: ureq::http::Uri = self.base.parse().ok()?;
        let authority = uri.authority()?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority
            .port_u16()
            .unwrap_or(if self.https { 443 } else { 80 });
        Some((host.to_string(), port))
    }
}

impl fmt::Display for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.base)
    }
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerUrl({})", self.base)
    }
}

/// `url` with anything between `://` and an `@` of its authority replaced by `…`.
fn redact_userinfo(url: &str) -> String {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    match url[start..authority_end].rfind('@') {
        Some(at) => format!("{}…{}", &url[..start], &url[start + at..]),
        None => url.to_string(),
    }
}

/// Default of [`ServerOptions::retries`].
pub const DEFAULT_RETRIES: u32 = 3;
/// Default of [`ServerOptions::timeout`]: a server that sends nothing for this long has stalled.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything about the server, fixed for a client's lifetime.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where the server is.
    pub url: ServerUrl,
    /// The served model name sent as `model` (`None`: the server's only model).
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer <key>`.
    pub api_key: Option<ApiKey>,
    /// The stream form asked for.
    pub protocol: StreamProtocol,
    /// How many times a request answered 503 (or 429) is sent again, with backoff, before its
    /// error is reported.
    pub retries: u32,
    /// Longest wait for the name lookup, the connection, and each read; a server silent for
    /// longer has stalled.
    pub timeout: Duration,
}

impl ServerOptions {
    /// Options for `url` with the defaults: no model name, the key from [`API_KEY_ENV`], SSE,
    /// [`DEFAULT_RETRIES`], [`DEFAULT_TIMEOUT`].
    pub fn new(url: ServerUrl) -> ServerOptions {
        ServerOptions {
            url,
            model: None,
            api_key: ApiKey::from_env(),
            protocol: StreamProtocol::Sse,
            retries: DEFAULT_RETRIES,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_to_their_base() {
        for (given, base) in [
            ("http://gpu-host:8091", "http://gpu-host:8091"),
            ("http://gpu-host:8091/", "http://gpu-host:8091"),
            (" https://tts.example/api/ ", "https://tts.example/api"),
            ("http://h:1/v1/audio/speech", "http://h:1"),
            ("http://h:1/v1", "http://h:1"),
            ("http://h:1/v1/", "http://h:1"),
            ("https://tts.example/api/v1", "https://tts.example/api"),
            ("http://h:1/v10", "http://h:1/v10"),
            ("http://[::1]:8091", "http://[::1]:8091"),
        ] {
            let u = ServerUrl::parse(given).unwrap();
            assert_eq!(u.to_string(), base, "{given}");
            assert_eq!(u.speech(), format!("{base}/v1/audio/speech"));
        }
        assert_eq!(
            ServerUrl::parse("http://[::1]:8091").unwrap().host_port(),
            Some(("::1".into(), 8091))
        );
        assert_eq!(
            ServerUrl::parse("https://tts.example").unwrap().host_port(),
            Some(("tts.example".into(), 443))
        );
    }

    #[test]
    fn bad_urls_say_why() {
        for (given, why) in [
            ("gpu-host:8091", "scheme"),
            ("ftp://h", "scheme 'ftp'"),
            ("http://user:secret@h:1", "credentials"),
            ("http://h:1/?x=1", "query"),
            ("", "empty"),
        ] {
            let e = ServerUrl::parse(given).unwrap_err().to_string();
            assert!(e.contains(why), "{given}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn the_key_is_never_shown() {
        let k = ApiKey::new(" sk-123 ").unwrap();
        assert_eq!(k.bearer(), "Bearer sk-123");
        assert!(!format!("{k:?} {k}").contains("sk-123"));
        assert!(ApiKey::new("  ").is_none());
    }
}
