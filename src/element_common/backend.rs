//! What an element synthesises with: the local engine ([`SharedEngine`], its share of one), or a
//! speech server through [`SpeechClient`]. [`Requests`] builds each utterance's complete, checked
//! request for it when the text is queued; the worker submits it to the [`Backend`]. Both give
//! the same events ([`EngineEvent`]) for an utterance, so the worker, the output and the messages
//! do not depend on which it is.

use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::engine::{
    Canceller, EngineEvent, EngineRequest, RequestHandle, SharedEngine, TextSender,
};
use crate::models::qwen3_tts::PromptMode;
use crate::remote::{
    RemoteCanceller, RemoteHandle, SpeechClient, SpeechRequest, reference_data_url,
};

use super::input_error::InputError;
use super::load::{Loaded, load};
use super::request::{ModelInfo, checked_request};
use super::server::ServerSettings;
use super::server_load::{Connected, connect};
use super::server_request::{ServerTarget, build_speech_request, check_server_reference};
use super::settings::SynthesisSettings;
use super::voice_clone::VoiceCloner;

/// One utterance's request, for the backend it was built for.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    Local(EngineRequest),
    Remote(SpeechRequest),
    /// An utterance whose text is still arriving (`append-text`): the voice and sampling of
    /// the request, and where its text comes from.
    LocalOpen(EngineRequest, Arc<OpenText>),
}

/// The text of an open utterance (`append-text` … `end-text`): fragments are kept here until
/// the worker submits the utterance, then go straight to the engine's [`TextSender`].
#[derive(Default)]
pub(crate) struct OpenText {
    state: Mutex<OpenTextState>,
}

#[derive(Default)]
struct OpenTextState {
    buffered: String,
    ended: bool,
    sender: Option<TextSender>,
}

impl std::fmt::Debug for OpenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenText")
    }
}

impl OpenText {
    /// Appends a fragment; false once the text has ended.
    pub fn append(&self, fragment: &str) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.ended {
            return false;
        }
        match &g.sender {
            Some(s) => s.append(fragment).is_ok(),
            None => {
                g.buffered.push_str(fragment);
                true
            }
        }
    }

    /// Ends the text; returns whether this call ended it.
    pub fn end(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if std::mem::replace(&mut g.ended, true) {
            return false;
        }
        if let Some(s) = &g.sender {
            s.end();
        }
        true
    }

    /// The engine took the utterance: what was appended goes to it, and what comes later.
    fn attach(&self, sender: TextSender) -> Result<(), String> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let buffered = std::mem::take(&mut g.buffered);
        sender.append(&buffered).map_err(|e| e.to_string())?;
        if g.ended {
            sender.end();
        }
        g.sender = Some(sender);
        Ok(())
    }
}

/// The events of one submitted utterance.
pub(crate) enum Handle {
    Local(RequestHandle),
    Remote(RemoteHandle),
}

/// Cancels one submitted utterance from any thread.
#[derive(Clone)]
pub(crate) enum Cancel {
    Local(Canceller),
    Remote(RemoteCanceller),
}

impl Cancel {
    /// Stops the utterance (the engine's work, or the server request and its connection).
    pub fn cancel(&self) {
        match self {
            Cancel::Local(c) => c.cancel(),
            Cancel::Remote(c) => c.cancel(),
        }
    }
}

impl Handle {
    /// The next event, waiting up to `d`; `Disconnected` once `Finished` was delivered.
    pub fn recv_timeout(&self, d: Duration) -> Result<EngineEvent, RecvTimeoutError> {
        match self {
            Handle::Local(h) => h.recv_timeout(d),
            Handle::Remote(h) => h.recv_timeout(d),
        }
    }

    /// Cancels the utterance.
    pub fn cancel(&self) {
        self.canceller().cancel();
    }

    /// A cancel handle for other threads.
    pub fn canceller(&self) -> Cancel {
        match self {
            Handle::Local(h) => Cancel::Local(h.canceller()),
            Handle::Remote(h) => Cancel::Remote(h.canceller()),
        }
    }
}

/// The worker's synthesiser: it submits the complete requests that [`Requests`] built.
pub(crate) enum Backend {
    /// A share of the engine.
    Local(Arc<SharedEngine>),
    /// The server's client.
    Remote(SpeechClient),
}

impl Backend {
    /// Submits `request`. Errors (the text for a refused utterance): a request the engine
    /// refuses (e.g. a full engine), no thread for the server request, a request built for the
    /// other backend.
    pub fn submit(&self, request: Request) -> Result<Handle, String> {
        match (self, request) {
            (Backend::Local(engine), Request::Local(r)) => engine
                .submit(r)
                .map(Handle::Local)
                .map_err(|e| e.to_string()),
            (Backend::Local(engine), Request::LocalOpen(r, open)) => {
                let (handle, sender) = engine.submit_open(r).map_err(|e| e.to_string())?;
                open.attach(sender)?;
                Ok(Handle::Local(handle))
            }
            (Backend::Remote(client), Request::Remote(r)) => client
                .submit(r)
                .map(Handle::Remote)
                .map_err(|e| format!("could not start the server request: {e}")),
            _ => Err("the request was built for the other backend".to_string()),
        }
    }
}

/// The last reference recording sent to a server, as the data URL the requests carry.
#[derive(Default)]
pub(crate) struct RemoteReference {
    cloner: VoiceCloner,
    url: Option<(String, Arc<str>)>,
}

impl RemoteReference {
    /// The data URL of the recording at `location` (decoded and encoded again only for another
    /// location). Errors name `ref-audio`: unreadable or not audio, too short / too long (for the
    /// server: 1 to 30 s), silent.
    fn data_url(&mut self, location: &str) -> Result<Arc<str>, InputError> {
        if let Some((l, url)) = &self.url
            && l == location
        {
            return Ok(url.clone());
        }
        let samples = self.cloner.checked_samples(location)?;
        check_server_reference(location, samples.len())?;
        let url: Arc<str> = reference_data_url(&samples).into();
        self.url = Some((location.to_string(), url.clone()));
        Ok(url)
    }
}

/// Builds each utterance's complete, checked request when its text is queued, for the backend
/// the element speaks through.
pub(crate) enum Requests {
    /// The engine's requests ([`checked_request`]): the voice-clone prompt encoded by `engine`.
    Local {
        engine: Arc<SharedEngine>,
        cloner: Mutex<VoiceCloner>,
    },
    /// The server's requests ([`build_speech_request`]): the reference as a data URL.
    Remote {
        target: ServerTarget,
        reference: Mutex<RemoteReference>,
    },
}

impl Requests {
    /// The request of an open utterance (`append-text`) with the property values `s`: the
    /// voice and sampling checked as for a text (errors name the property and value), the
    /// streaming prompt mode (`prompt-mode=auto` takes it; `non-streaming` is refused, as is a
    /// speech server, which takes whole texts only).
    pub fn checked_open(
        &self,
        s: &SynthesisSettings,
        info: &ModelInfo,
        open: Arc<OpenText>,
    ) -> Result<Request, InputError> {
        match self {
            Requests::Local { engine, cloner } => {
                let mut r = checked_request(s, info, engine, cloner, "x")?;
                match r.voice.prompt_mode {
                    Some(PromptMode::NonStreaming) => {
                        return Err(super::input_error::input_error(
                            "prompt-mode",
                            "non-streaming",
                            "append-text streams text into the utterance one token per codec \
                             frame: it needs prompt-mode=streaming (or auto)",
                        ));
                    }
                    _ => r.voice.prompt_mode = Some(PromptMode::Streaming),
                }
                if r.voice.voice_clone.as_ref().is_some_and(|v| v.icl) {
                    return Err(super::input_error::input_error(
                        "x-vector-only",
                        "false",
                        "append-text cannot clone a voice in ICL mode (the reference text would \
                         share the streamed text's frames): set x-vector-only=true",
                    ));
                }
                r.voice.text.clear();
                Ok(Request::LocalOpen(r, open))
            }
            Requests::Remote { target, .. } => Err(super::input_error::input_error(
                "server",
                &target.url,
                "append-text is not supported with a speech server: its /v1/audio/speech \
                 takes a whole text per request (and vLLM-Omni's streaming-input websocket \
                 starts a new request per sentence); send whole sentences with push-text",
            )),
        }
    }

    /// The complete request for `text` with the property values `s`; errors name the property
    /// and its value.
    pub fn checked(
        &self,
        s: &SynthesisSettings,
        info: &ModelInfo,
        text: &str,
    ) -> Result<Request, InputError> {
        match self {
            Requests::Local { engine, cloner } => {
                checked_request(s, info, engine, cloner, text).map(Request::Local)
            }
            Requests::Remote { target, reference } => {
                let (mut r, clone) = build_speech_request(s, target, text)?;
                if let Some(spec) = clone {
                    let mut reference = reference.lock().unwrap_or_else(|p| p.into_inner());
                    r.ref_audio = Some(reference.data_url(&spec.location)?.to_string());
                }
                Ok(Request::Remote(r))
            }
        }
    }

    /// The server, when the element speaks through one.
    pub fn server(&self) -> Option<&ServerTarget> {
        match self {
            Requests::Local { .. } => None,
            Requests::Remote { target, .. } => Some(target),
        }
    }

    /// The engine, when the element synthesises locally.
    pub fn engine(&self) -> Option<&Arc<SharedEngine>> {
        match self {
            Requests::Local { engine, .. } => Some(engine),
            Requests::Remote { .. } => None,
        }
    }
}

/// What `start()` has once the backend is ready.
pub(crate) struct Ready {
    /// For the worker.
    pub backend: Backend,
    /// For the text inputs.
    pub requests: Arc<Requests>,
    pub info: ModelInfo,
}

/// Loads the engine, or, with `server` set, checks the server (no model is loaded): either way
/// the reference voice is decoded once, so that a bad one fails the state change.
pub(crate) fn prepare(
    element: &gst::Element,
    cat: gst::DebugCategory,
    s: &SynthesisSettings,
    server: &ServerSettings,
    live: bool,
) -> Result<Ready, gst::ErrorMessage> {
    match server.options() {
        Some(options) => {
            let given = server.url().unwrap_or_default();
            let options = options.map_err(|e| e.to_error_msg())?;
            let Connected {
                client,
                target,
                info,
                cloner,
            } = connect(element, cat, s, given, options, server.task_type.variant())?;
            Ok(Ready {
                backend: Backend::Remote(client),
                requests: Arc::new(Requests::Remote {
                    target,
                    reference: Mutex::new(RemoteReference { cloner, url: None }),
                }),
                info,
            })
        }
        None => {
            let Loaded {
                engine,
                info,
                cloner,
            } = load(element, cat, s, live)?;
            Ok(Ready {
                backend: Backend::Local(engine.clone()),
                requests: Arc::new(Requests::Local {
                    engine,
                    cloner: Mutex::new(cloner),
                }),
                info,
            })
        }
    }
}
