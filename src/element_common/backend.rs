//! What an element synthesises with: the local engine ([`SharedEngine`], its share of one), or a
//! speech server through [`SpeechClient`]. [`Requests`] builds each utterance's complete, checked
//! request for it when the text is queued; the worker submits it to the [`Backend`]. Both give
//! the same events ([`EngineEvent`]) for an utterance, so the worker, the output and the messages
//! do not depend on which it is.

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::engine::{
    Canceller, EngineEvent, EngineRequest, RequestHandle, SharedEngine, TextSender,
};
use crate::models::qwen3_tts::{ModelVariant, served_description};
use crate::models::tts::{ModelDescription, PromptMode};
use crate::remote::{
    RemoteCanceller, RemoteHandle, SpeechClient, SpeechRequest, StreamTextSender,
    reference_data_url,
};

use super::clauses::ClauseSplitter;
use super::input_error::InputError;
use super::load::{Loaded, load};
use super::request::{ModelInfo, checked_request};
use super::server::ServerSettings;
use super::server_load::{Connected, connect};
use super::server_request::{ServerTarget, build_speech_request, check_server_reference};
use super::settings::{PromptModeSetting, SynthesisSettings};
use super::voice_clone::VoiceCloner;

/// One utterance's request, for the backend it was built for.
#[derive(Debug, Clone)]
pub(crate) enum Request {
    Local(EngineRequest),
    Remote(SpeechRequest),
    /// An utterance whose text is still arriving (`append-text`): the voice and sampling of
    /// the request, and where its text comes from.
    LocalOpen(EngineRequest, Arc<OpenText>),
    /// An utterance whose text is still arriving, spoken clause by clause (clause mode): the
    /// worker submits one request per clause ([`Backend::submit`] refuses this one itself).
    Clauses(ClauseRequests),
    /// An utterance whose text is still arriving, spoken by the server through its
    /// streaming-input websocket (sentence mode): the voice and settings of the session, and
    /// where its text comes from.
    RemoteOpen(SpeechRequest, Arc<OpenText>),
}

/// How text streamed into an open utterance is spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextStreamMode {
    /// One engine request in the streaming prompt mode: the talker takes each text token as it
    /// becomes final (one per codec frame).
    Token,
    /// Each clause is one engine request with the utterance's settings (prompt mode included),
    /// submitted as soon as the clause is complete ([`super::clauses`]), the clauses' audio
    /// played back to back as one utterance.
    Clause,
    /// `server=`: the server's streaming-input websocket takes the fragments as they come and
    /// speaks each sentence once it is complete.
    Sentence,
}

impl TextStreamMode {
    /// The name in the `omnitts/text-stream-mode` message: `token` or `clause`.
    pub fn name(self) -> &'static str {
        match self {
            TextStreamMode::Token => "token",
            TextStreamMode::Clause => "clause",
            TextStreamMode::Sentence => "sentence",
        }
    }
}

/// The mode an open utterance gets, and why. A model that takes whole texts only (`open_text`
/// false in its description: Fish S2 Pro) gets clause mode. Otherwise `prompt-mode` decides
/// (`streaming` forces token mode, `non-streaming` clause mode) and, under `auto`, what the
/// checkpoint says of its streaming prompt mode (`streaming_prompt` in its `omnitts.json`,
/// [`streaming_prompt_hint`]).
///
/// [`streaming_prompt_hint`]: super::split_policy::streaming_prompt_hint
pub(crate) fn text_stream_mode(
    model: &ModelDescription,
    prompt_mode: Option<PromptMode>,
    streaming_prompt: Option<bool>,
) -> (TextStreamMode, String) {
    if !model.open_text {
        return (
            TextStreamMode::Clause,
            format!(
                "{} takes whole texts only: each clause is spoken whole once it is complete",
                model.name
            ),
        );
    }
    match (prompt_mode, streaming_prompt) {
        (Some(PromptMode::Streaming), _) => (
            TextStreamMode::Token,
            "prompt-mode=streaming: one text token per codec frame as the text arrives".into(),
        ),
        (Some(PromptMode::NonStreaming), _) => (
            TextStreamMode::Clause,
            "prompt-mode=non-streaming: each clause is spoken whole once it is complete".into(),
        ),
        (None, Some(false)) => (
            TextStreamMode::Clause,
            "the checkpoint speaks poorly in the streaming prompt mode (streaming_prompt=false \
             in its omnitts.json): each clause is spoken whole once it is complete \
             (prompt-mode=streaming forces token mode)"
                .into(),
        ),
        (None, _) => (
            TextStreamMode::Token,
            "prompt-mode=auto takes the streaming prompt mode for streamed text: one text token \
             per codec frame as the text arrives (prompt-mode=non-streaming gives clause mode)"
                .into(),
        ),
    }
}

/// The text of an open utterance (`append-text` … `end-text`). Token mode: fragments are kept
/// here until the worker submits the utterance, then go straight to the engine's
/// [`TextSender`]. Clause mode: fragments are cut into clauses here, which the worker takes
/// ([`OpenText::next_clause`]).
#[derive(Default)]
pub(crate) struct OpenText {
    state: Mutex<OpenTextState>,
    /// Wakes the worker waiting for a clause.
    cond: Condvar,
}

/// Where an open utterance's text goes once its request is running.
enum Feed {
    /// The engine's open request (token mode).
    Engine(TextSender),
    /// The server's streaming-input session.
    Server(StreamTextSender),
}

impl Feed {
    fn append(&self, fragment: &str) -> Result<(), String> {
        match self {
            Feed::Engine(s) => s.append(fragment).map_err(|e| e.to_string()),
            Feed::Server(s) => s.append(fragment),
        }
    }

    fn end(&self) {
        match self {
            Feed::Engine(s) => {
                s.end();
            }
            Feed::Server(s) => s.end(),
        }
    }
}

#[derive(Default)]
struct OpenTextState {
    buffered: String,
    ended: bool,
    /// Its utterance is over (failed, or its speech ended): later fragments are refused.
    over: bool,
    sender: Option<Feed>,
    /// Clause mode: the splitter, and the clauses complete and not yet taken.
    clauses: Option<(ClauseSplitter, VecDeque<String>)>,
    /// All the text appended (for the bus messages).
    all: String,
}

impl std::fmt::Debug for OpenText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenText")
    }
}

/// What [`OpenText::next_clause`] found.
#[derive(Debug, PartialEq)]
pub(crate) enum NextClause {
    /// A complete clause.
    Clause(String),
    /// None yet; the text goes on.
    Waiting,
    /// The text has ended and every clause was taken.
    Ended,
}

impl OpenText {
    /// The open text of an utterance in `mode`, for a model whose speaker-turn tag starts with
    /// `turn_tag` (clause mode gives each clause its turn's tag).
    pub fn new(mode: TextStreamMode, turn_tag: Option<&'static str>) -> Self {
        let t = OpenText::default();
        if mode == TextStreamMode::Clause {
            t.lock().clauses = Some((ClauseSplitter::with_turns(turn_tag), VecDeque::new()));
        }
        t
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OpenTextState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a fragment; false once the text has ended or its utterance is over
    /// ([`Self::utterance_over`]).
    pub fn append(&self, fragment: &str) -> bool {
        let mut g = self.lock();
        if g.ended || g.over {
            return false;
        }
        g.all.push_str(fragment);
        if let Some((splitter, ready)) = &mut g.clauses {
            let done = splitter.push(fragment);
            if !done.is_empty() {
                ready.extend(done);
                self.cond.notify_all();
            }
            return true;
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
        let mut g = self.lock();
        if std::mem::replace(&mut g.ended, true) {
            return false;
        }
        if let Some((splitter, ready)) = &mut g.clauses {
            let rest = splitter.finish();
            ready.extend(rest);
        }
        if let Some(s) = &g.sender {
            s.end();
        }
        self.cond.notify_all();
        true
    }

    /// Its utterance is over (its request finished: failed, or its speech ended): from now on
    /// [`Self::append`] refuses fragments, before the utterance's done message is posted.
    pub fn utterance_over(&self) {
        self.lock().over = true;
    }

    /// All the text appended so far.
    pub fn text(&self) -> String {
        self.lock().all.clone()
    }

    /// Clause mode: the next complete clause, waiting up to `timeout` for one.
    pub fn next_clause(&self, timeout: Duration) -> NextClause {
        let mut g = self.lock();
        for waited in [false, true] {
            let ended = g.ended;
            match &mut g.clauses {
                Some((_, ready)) => {
                    if let Some(c) = ready.pop_front() {
                        return NextClause::Clause(c);
                    }
                    if ended {
                        return NextClause::Ended;
                    }
                }
                None => return NextClause::Ended,
            }
            if !waited {
                g = self
                    .cond
                    .wait_timeout(g, timeout)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }
        NextClause::Waiting
    }

    /// The engine or the server took the utterance: what was appended goes to it, and what
    /// comes later.
    fn attach(&self, sender: Feed) -> Result<(), String> {
        let mut g = self.lock();
        let buffered = std::mem::take(&mut g.buffered);
        sender.append(&buffered)?;
        if g.ended {
            sender.end();
        }
        g.sender = Some(sender);
        Ok(())
    }
}

/// Builds the request of one clause (errors: the message of the refusal).
type BuildClause = dyn Fn(&str) -> Result<Request, String> + Send + Sync;

/// A clause-mode utterance: its open text, and how each clause's request is built (the
/// utterance's settings as they were when it opened, checked then).
pub(crate) struct ClauseRequests {
    /// The text the clauses come from.
    pub open: Arc<OpenText>,
    build: Arc<BuildClause>,
}

impl ClauseRequests {
    /// The request of one clause.
    pub fn build(&self, clause: &str) -> Result<Request, String> {
        (self.build)(clause)
    }
}

impl Clone for ClauseRequests {
    fn clone(&self) -> Self {
        ClauseRequests {
            open: self.open.clone(),
            build: self.build.clone(),
        }
    }
}

impl std::fmt::Debug for ClauseRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClauseRequests")
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
                open.attach(Feed::Engine(sender))?;
                Ok(Handle::Local(handle))
            }
            (Backend::Remote(client), Request::RemoteOpen(r, open)) => {
                let (handle, sender) = client
                    .submit_stream(r)
                    .map_err(|e| format!("could not start the server session: {e}"))?;
                open.attach(Feed::Server(sender))?;
                Ok(Handle::Remote(handle))
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
pub(crate) struct RemoteReference {
    cloner: VoiceCloner,
    url: Option<(String, Arc<str>)>,
}

impl Default for RemoteReference {
    /// A server speaks Qwen3-TTS: its references follow a Base checkpoint's rules (24 kHz).
    fn default() -> Self {
        let base = served_description(ModelVariant::Base, Vec::new(), Vec::new(), false);
        RemoteReference {
            cloner: VoiceCloner::new(base.reference),
            url: None,
        }
    }
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
    /// The request of an open utterance (`append-text`) in `mode` ([`text_stream_mode`]) with
    /// the property values `s`, and its open text: the voice and sampling checked now as for a
    /// text (errors name the property and value). Token mode takes the streaming prompt mode and
    /// refuses an ICL voice clone; clause mode builds each clause's request with `s` (checked
    /// again for each clause). With a speech server (`mode` is then
    /// [`TextStreamMode::Sentence`]) the request is that of a text, its fragments go to the
    /// server's streaming-input websocket (a server without one fails the utterance when it
    /// starts, saying so).
    pub fn checked_open(
        self: &Arc<Self>,
        s: &SynthesisSettings,
        info: &ModelInfo,
        mode: TextStreamMode,
    ) -> Result<(Request, Arc<OpenText>), InputError> {
        match &**self {
            Requests::Local { engine, cloner } => {
                let mut r = checked_request(s, info, engine, cloner, "x")?;
                let open = Arc::new(OpenText::new(mode, info.description.speaker_turn_tag));
                if mode == TextStreamMode::Clause {
                    // Each clause is a whole text: the non-streaming prompt unless set (for a
                    // model with prompt modes).
                    let mut s = s.clone();
                    if s.prompt_mode == PromptModeSetting::Auto && info.description.prompt_modes {
                        s.prompt_mode = PromptModeSetting::NonStreaming;
                    }
                    let (requests, info) = (self.clone(), info.clone());
                    let build = Arc::new(move |clause: &str| {
                        requests
                            .checked(&s, &info, clause)
                            .map_err(|e| e.to_string())
                    });
                    return Ok((
                        Request::Clauses(ClauseRequests {
                            open: open.clone(),
                            build,
                        }),
                        open,
                    ));
                }
                r.voice.prompt_mode = Some(PromptMode::Streaming);
                if r.voice.voice_clone.as_ref().is_some_and(|v| v.icl) {
                    return Err(super::input_error::input_error(
                        "x-vector-only",
                        "false",
                        "append-text in token mode cannot clone a voice in ICL mode (the \
                         reference text would share the streamed text's frames): set \
                         x-vector-only=true, or prompt-mode=non-streaming for clause mode",
                    ));
                }
                r.voice.text.clear();
                Ok((Request::LocalOpen(r, open.clone()), open))
            }
            Requests::Remote { .. } => {
                let Request::Remote(r) = self.checked(s, info, "x")? else {
                    return Err(super::input_error::input_error(
                        "server",
                        "",
                        "the request was built for the local engine",
                    ));
                };
                let open = Arc::new(OpenText::new(TextStreamMode::Sentence, None));
                Ok((Request::RemoteOpen(r, open.clone()), open))
            }
        }
    }

    /// The mode an open utterance gets, and why: with a speech server sentence mode (its
    /// streaming-input websocket speaks each sentence once it is complete), otherwise
    /// [`text_stream_mode`].
    pub fn stream_mode(
        &self,
        model: &ModelDescription,
        prompt_mode: Option<PromptMode>,
        streaming_prompt: Option<bool>,
    ) -> (TextStreamMode, String) {
        match self {
            Requests::Remote { .. } => (
                TextStreamMode::Sentence,
                "server=: the fragments go to the server's streaming-input websocket \
                 (/v1/audio/speech/stream), which speaks each sentence once it is complete"
                    .into(),
            ),
            Requests::Local { .. } => text_stream_mode(model, prompt_mode, streaming_prompt),
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
            let ignored = server.set_without_server();
            if !ignored.is_empty() {
                gst::element_warning!(
                    element,
                    gst::ResourceError::Settings,
                    (
                        "{} set without server: ignored, the element synthesises locally",
                        ignored.join(", ")
                    )
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_follows_prompt_mode_then_the_checkpoint() {
        use TextStreamMode::{Clause, Token};
        let cases = [
            (
                Some(PromptMode::Streaming),
                Some(false),
                Token,
                "prompt-mode=streaming",
            ),
            (
                Some(PromptMode::NonStreaming),
                None,
                Clause,
                "prompt-mode=non-streaming",
            ),
            (None, Some(false), Clause, "streaming_prompt=false"),
            (None, Some(true), Token, "prompt-mode=auto"),
            (None, None, Token, "prompt-mode=auto"),
        ];
        let qwen = served_description(ModelVariant::CustomVoice, Vec::new(), Vec::new(), false);
        assert!(qwen.open_text);
        for (prompt, hint, want, why) in cases {
            let (mode, reason) = text_stream_mode(&qwen, prompt, hint);
            assert_eq!(mode, want, "{prompt:?} {hint:?}");
            assert!(reason.contains(why), "{reason}");
        }
        // A model that takes whole texts only: clause mode whatever the rest says.
        let whole = ModelDescription {
            name: "Fish S2 Pro".into(),
            open_text: false,
            ..qwen
        };
        for hint in [None, Some(true)] {
            let (mode, reason) = text_stream_mode(&whole, None, hint);
            assert_eq!(mode, Clause);
            assert!(
                reason.contains("Fish S2 Pro takes whole texts only"),
                "{reason}"
            );
        }
    }

    #[test]
    fn clause_mode_hands_out_clauses_as_they_complete() {
        let t = OpenText::new(TextStreamMode::Clause, None);
        let wait = Duration::from_millis(1);
        assert!(t.append("It was a fine morning, and the"));
        assert_eq!(t.next_clause(wait), NextClause::Waiting);
        assert!(t.append(" rain had st"));
        assert_eq!(
            t.next_clause(wait),
            NextClause::Clause("It was a fine morning,".into())
        );
        assert_eq!(t.next_clause(wait), NextClause::Waiting);
        assert!(t.append("opped"));
        assert!(t.end());
        assert!(!t.end(), "ended once");
        assert!(!t.append(" more"), "nothing after the end");
        assert_eq!(
            t.next_clause(wait),
            NextClause::Clause("and the rain had stopped".into())
        );
        assert_eq!(t.next_clause(wait), NextClause::Ended);
        assert_eq!(t.text(), "It was a fine morning, and the rain had stopped");
        // Token mode has no clauses.
        let t = OpenText::new(TextStreamMode::Token, None);
        assert!(t.append("Hello"));
        assert_eq!(t.next_clause(wait), NextClause::Ended);
    }
}
