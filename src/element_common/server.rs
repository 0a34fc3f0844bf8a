//! The properties that send the synthesis to a vLLM-Omni speech server instead of the local
//! engine ([`crate::remote`]): their values, param specs, set and get, and the client options
//! they make. All of them can change only in NULL or READY.

use std::time::Duration;

use gst::glib;
use gst::prelude::*;

use crate::models::qwen3_tts::ModelVariant;
use crate::remote::{
    ApiKey, DEFAULT_RETRIES, DEFAULT_TIMEOUT, ServerOptions, ServerUrl, StreamProtocol,
};

use super::input_error::{InputError, input_error};

/// The `server-protocol` property: the stream form asked of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsServerProtocol")]
pub(crate) enum ServerProtocolSetting {
    /// Raw PCM in a chunked body.
    #[enum_value(
        name = "Raw 16-bit PCM in a chunked body (stream_format \"audio\", response_format \"pcm\")",
        nick = "pcm"
    )]
    Pcm = 0,
    /// Server-sent events (the default: a failure mid-stream keeps the server's reason).
    #[default]
    #[enum_value(
        name = "Server-sent events: speech.audio.delta with base64 PCM (stream_format \"sse\")",
        nick = "sse"
    )]
    Sse = 1,
}

impl From<ServerProtocolSetting> for StreamProtocol {
    fn from(p: ServerProtocolSetting) -> StreamProtocol {
        match p {
            ServerProtocolSetting::Pcm => StreamProtocol::Pcm,
            ServerProtocolSetting::Sse => StreamProtocol::Sse,
        }
    }
}

/// The `server-task-type` property: the request's `task_type`, i.e. the checkpoint variant the
/// server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsServerTaskType")]
pub(crate) enum ServerTaskTypeSetting {
    /// From the served model's name or its `root` in `GET /v1/models`.
    #[default]
    #[enum_value(
        name = "From the served model's name, or its root (the checkpoint) in GET /v1/models",
        nick = "auto"
    )]
    Auto = 0,
    /// Preset speakers.
    #[enum_value(name = "CustomVoice: preset speakers", nick = "custom-voice")]
    CustomVoice = 1,
    /// A voice described by `instruct`.
    #[enum_value(
        name = "VoiceDesign: a voice described by instruct",
        nick = "voice-design"
    )]
    VoiceDesign = 2,
    /// A cloned voice.
    #[enum_value(
        name = "Base: a voice cloned from ref-audio, or a voice uploaded to the server",
        nick = "base"
    )]
    Base = 3,
}

impl ServerTaskTypeSetting {
    /// The variant it names; `None` for `auto`.
    pub fn variant(self) -> Option<ModelVariant> {
        match self {
            ServerTaskTypeSetting::Auto => None,
            ServerTaskTypeSetting::CustomVoice => Some(ModelVariant::CustomVoice),
            ServerTaskTypeSetting::VoiceDesign => Some(ModelVariant::VoiceDesign),
            ServerTaskTypeSetting::Base => Some(ModelVariant::Base),
        }
    }
}

/// Most retries `server-retries` allows.
const MAX_RETRIES: u32 = 100;
/// Longest `server-timeout`, seconds.
const MAX_TIMEOUT_S: u32 = 3600;

/// Values of the server properties. `Debug` shows the API key as `<redacted>`.
#[derive(Debug, Clone)]
pub(crate) struct ServerSettings {
    /// `server`: the URL; `None` (or empty) synthesises locally.
    pub server: Option<String>,
    /// `server-model`: the served model name.
    pub model: Option<String>,
    /// `server-api-key`.
    pub api_key: Option<ApiKey>,
    pub protocol: ServerProtocolSetting,
    /// `server-task-type`.
    pub task_type: ServerTaskTypeSetting,
    pub retries: u32,
    /// `server-timeout`, seconds.
    pub timeout_s: u32,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            server: None,
            model: None,
            api_key: None,
            protocol: ServerProtocolSetting::Sse,
            task_type: ServerTaskTypeSetting::Auto,
            retries: DEFAULT_RETRIES,
            timeout_s: DEFAULT_TIMEOUT.as_secs() as u32,
        }
    }
}

impl ServerSettings {
    /// The `server` URL when set (trimmed, not empty).
    pub fn url(&self) -> Option<&str> {
        self.server
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// The server properties set to something other than their defaults while `server` is
    /// unset: they do nothing (synthesis is local). Empty with `server` set.
    pub fn set_without_server(&self) -> Vec<&'static str> {
        if self.url().is_some() {
            return Vec::new();
        }
        let d = ServerSettings::default();
        let set = |s: &Option<String>| s.as_deref().is_some_and(|v| !v.trim().is_empty());
        [
            ("server-model", set(&self.model)),
            ("server-api-key", self.api_key.is_some()),
            ("server-protocol", self.protocol != d.protocol),
            ("server-task-type", self.task_type != d.task_type),
            ("server-retries", self.retries != d.retries),
            ("server-timeout", self.timeout_s != d.timeout_s),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }

    /// The client options, the API key taken from `OMNITTS_SERVER_API_KEY` when
    /// `server-api-key` is unset. `None` when `server` is unset; errors name `server`.
    pub fn options(&self) -> Option<Result<ServerOptions, InputError>> {
        let url = self.url()?;
        Some(
            ServerUrl::parse(url)
                .map_err(|e| match e {
                    // input_error names the property and the value: the reason alone.
                    crate::remote::RemoteError::BadUrl { url: shown, why } => {
                        input_error("server", &shown, why)
                    }
                    e => input_error("server", url, e.to_string()),
                })
                .map(|url| {
                    let mut o = ServerOptions::new(url);
                    o.model = self
                        .model
                        .as_deref()
                        .map(str::trim)
                        .filter(|m| !m.is_empty())
                        .map(str::to_string);
                    if self.api_key.is_some() {
                        o.api_key = self.api_key.clone();
                    }
                    o.protocol = self.protocol.into();
                    o.retries = self.retries;
                    o.timeout = Duration::from_secs(self.timeout_s as u64);
                    o
                }),
        )
    }

    /// Sets the property `name` (one of [`server_param_specs`]); false for any other name.
    pub fn set_property(&mut self, name: &str, value: &glib::Value) -> bool {
        match name {
            "server" => self.server = value.get().expect("type checked upstream"),
            "server-model" => self.model = value.get().expect("type checked upstream"),
            "server-api-key" => {
                self.api_key = value
                    .get::<Option<String>>()
                    .expect("type checked upstream")
                    .as_deref()
                    .and_then(ApiKey::new)
            }
            "server-protocol" => self.protocol = value.get().expect("type checked upstream"),
            "server-task-type" => self.task_type = value.get().expect("type checked upstream"),
            "server-retries" => self.retries = value.get().expect("type checked upstream"),
            "server-timeout" => self.timeout_s = value.get().expect("type checked upstream"),
            _ => return false,
        }
        true
    }

    /// The value of the property `name` (one of [`server_param_specs`]; `server-api-key` is
    /// write-only). `None` for any other name.
    pub fn property(&self, name: &str) -> Option<glib::Value> {
        Some(match name {
            "server" => self.server.to_value(),
            "server-model" => self.model.to_value(),
            "server-protocol" => self.protocol.to_value(),
            "server-task-type" => self.task_type.to_value(),
            "server-retries" => self.retries.to_value(),
            "server-timeout" => self.timeout_s.to_value(),
            _ => return None,
        })
    }
}

/// Param specs of the server properties.
pub(crate) fn server_param_specs() -> Vec<glib::ParamSpec> {
    vec![
        glib::ParamSpecString::builder("server")
            .nick("Server")
            .blurb(
                "URL of a vLLM-Omni (or compatible) speech server, e.g. http://gpu-host:8091. \
                 When set the element loads no model: each utterance is one streaming POST \
                 <server>/v1/audio/speech; caps, timestamps and messages stay the same. \
                 Properties without a request field (model, stage-config, ar-device, \
                 decoder-device, shared-engine=false, quantization, do-sample, \
                 repetition-penalty, chunk-frames) are refused; temperature, top-k and top-p \
                 travel in extra_params",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("server-model")
            .nick("Server model")
            .blurb(
                "The served model name sent as the request's model (checked against the \
                 server's GET /v1/models at start); unset: the server's own",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("server-api-key")
            .nick("Server API key")
            .blurb(
                "Sent as Authorization: Bearer <key>; unset: the OMNITTS_SERVER_API_KEY \
                 environment variable. Write-only, never logged",
            )
            .write_only()
            .mutable_ready()
            .build(),
        glib::ParamSpecEnum::builder_with_default("server-protocol", ServerProtocolSetting::Sse)
            .nick("Server protocol")
            .blurb(
                "The stream form asked of the server; the answer is decoded by its content \
                 type (audio/pcm or text/event-stream) either way. With pcm a failure after the \
                 audio started is only a connection closed early: the server's reason is lost",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecEnum::builder_with_default("server-task-type", ServerTaskTypeSetting::Auto)
            .nick("Server task type")
            .blurb(
                "The checkpoint variant the server runs, sent as the request's task_type: auto \
                 takes it from the served model's name or its root in GET /v1/models (set it \
                 when the server serves the model under an alias that tells neither)",
            )
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("server-retries")
            .nick("Server retries")
            .blurb(
                "How many times a request the server answers 503 (queue full) or 429 is sent \
                 again, waiting 0.25 s doubled each time (at most 8 s) or the Retry-After it \
                 gives, before the utterance fails (vLLM-Omni's speech route answers neither: \
                 for it this applies only to a proxy in front)",
            )
            .maximum(MAX_RETRIES)
            .default_value(DEFAULT_RETRIES)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("server-timeout")
            .nick("Server timeout")
            .blurb(
                "Seconds the server may stay silent (name lookup, connecting, before the first \
                 audio, between two pieces of audio) before the utterance fails: as \
                 'no first audio within N s' before any audio, else as stalled",
            )
            .minimum(1)
            .maximum(MAX_TIMEOUT_S)
            .default_value(DEFAULT_TIMEOUT.as_secs() as u32)
            .mutable_ready()
            .build(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_set_get_cover_the_same_names() {
        let mut s = ServerSettings::default();
        for spec in server_param_specs() {
            let name = spec.name();
            assert!(
                spec.flags().contains(gst::PARAM_FLAG_MUTABLE_READY),
                "{name}"
            );
            assert!(s.set_property(name, spec.default_value()), "{name}");
            if spec.flags().contains(glib::ParamFlags::READABLE) {
                let v = s.property(name).unwrap_or_else(|| panic!("{name}"));
                assert_eq!(v.type_(), spec.value_type(), "{name}");
            } else {
                assert!(s.property(name).is_none(), "{name} must not be readable");
            }
        }
        assert!(!s.set_property("model", &"x".to_value()));
    }

    #[test]
    fn server_properties_set_without_server_are_named() {
        let mut s = ServerSettings::default();
        assert!(s.set_without_server().is_empty(), "defaults");
        s.model = Some("foo".into());
        s.api_key = ApiKey::new("secret");
        s.task_type = ServerTaskTypeSetting::Base;
        s.timeout_s += 1;
        assert_eq!(
            s.set_without_server(),
            [
                "server-model",
                "server-api-key",
                "server-task-type",
                "server-timeout"
            ]
        );
        s.server = Some("http://gpu-host:8091".into());
        assert!(
            s.set_without_server().is_empty(),
            "with server they are used"
        );
    }

    #[test]
    fn options_from_the_properties() {
        let mut s = ServerSettings::default();
        assert!(s.options().is_none());
        s.server = Some("  ".into());
        assert!(s.options().is_none(), "blank is unset");
        s.server = Some("gpu-host:8091".into());
        let e = s.options().unwrap().unwrap_err();
        assert_eq!(e.property, "server");
        s.server = Some("http://gpu-host:8091/".into());
        s.set_property("server-api-key", &"sk-abc".to_value());
        s.set_property("server-protocol", &ServerProtocolSetting::Sse.to_value());
        s.set_property("server-timeout", &5u32.to_value());
        s.model = Some(" tts ".into());
        let o = s.options().unwrap().unwrap();
        assert_eq!(o.url.speech(), "http://gpu-host:8091/v1/audio/speech");
        assert_eq!(o.model.as_deref(), Some("tts"));
        assert_eq!(o.protocol, StreamProtocol::Sse);
        assert_eq!(o.timeout, Duration::from_secs(5));
        assert_eq!(o.api_key, ApiKey::new("sk-abc"));
        assert!(!format!("{s:?} {o:?}").contains("sk-abc"));
    }
}
