//! GObject/GStreamer implementation of `omnittssrc` (see the module docs in `mod.rs`): the
//! properties, the text inputs, start/stop, and `create()`, which turns the steps of the
//! [`Output`](super::output::Output) into buffers.

use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;
use gst_base::prelude::*;
use gst_base::subclass::base_src::CreateSuccess;
use gst_base::subclass::prelude::*;

use crate::element_common::audio::{self, SampleFormat, pts_of};
use crate::element_common::backend::{OpenText, Ready, Requests, prepare};
use crate::element_common::input_error::{InputError, input_error, quoted};
use crate::element_common::load::sharing;
use crate::element_common::messages::{Refusal, count_of};
use crate::element_common::properties::{
    model_info_param_specs, model_info_property, refuse_ready_only, synthesis_param_specs,
};
use crate::element_common::request::ModelInfo;
use crate::element_common::server::{ServerSettings, server_param_specs};
use crate::element_common::settings::SynthesisSettings;
use crate::element_common::split_policy::{
    AutoSplit, SplitSentences, naming_the_split, split_sentences_param_spec, streaming_prompt_hint,
};
use crate::element_common::text_checks::{markup_warning, strip_markup_tags, text_warnings};
use crate::element_common::utf8_join::Utf8Join;
use crate::element_common::voice_warnings::WarnOnce;
use crate::element_common::{messages, progress};
use crate::models::tts::text::{NOTHING_TO_SPEAK, nothing_to_speak, unspeakable};

use super::CAT;
use super::output::{Notice, Output, Step};
use super::runtime::{self, Dropped, Shared};

/// 20 ms at 24 kHz: fine-grained live pacing, one Opus frame.
const DEFAULT_SAMPLES_PER_BUFFER: u32 = 480;
/// Largest `samples-per-buffer`: 10 s at 48 kHz.
const MAX_SAMPLES_PER_BUFFER: u32 = 480_000;
const DEFAULT_IS_LIVE: bool = false;
/// Back-pressure bound between the engine and `create()`: 10 s of audio.
const MAX_QUEUED_SECONDS: usize = 10;

/// Live: a latency above this (from a long first chunk or long buffers) is said in a warning at
/// the start, as it delays every utterance's audio by that much.
const LIVE_LATENCY_WARNING: gst::ClockTime = gst::ClockTime::SECOND;

/// Property values: the synthesis properties every omnitts element has, the server ones, and
/// this element's own.
#[derive(Debug, Clone)]
struct Settings {
    synthesis: SynthesisSettings,
    server: ServerSettings,
    text: Option<String>,
    samples_per_buffer: u32,
    is_live: bool,
    split_sentences: SplitSentences,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            synthesis: SynthesisSettings::default(),
            server: ServerSettings::default(),
            text: None,
            samples_per_buffer: DEFAULT_SAMPLES_PER_BUFFER,
            is_live: DEFAULT_IS_LIVE,
            split_sentences: SplitSentences::default(),
        }
    }
}

impl Settings {
    /// The utterances one text becomes: one a sentence when `split-sentences` splits it (`auto`:
    /// when it is longer than the loaded checkpoint's threshold), else the text.
    fn utterance_texts(&self, text: &str, auto: AutoSplit) -> Vec<String> {
        auto.pieces(self.split_sentences, text)
    }
}

/// Exists between start() and stop().
struct Runtime {
    /// Builds the utterances' requests (for the engine, whose share it holds, or the server)
    /// when text is queued; the worker submits them.
    requests: Arc<Requests>,
    shared: Arc<Shared>,
    worker: Option<std::thread::JoinHandle<()>>,
    info: ModelInfo,
    /// When `split-sentences=auto` splits a text, for the loaded checkpoint.
    auto_split: AutoSplit,
    /// What the loaded checkpoint says of its streaming prompt mode (`streaming_prompt` in its
    /// `omnitts.json`; `None`: not said, or a speech server).
    streaming_prompt: Option<bool>,
    /// The voice warnings posted since start.
    warned: Arc<WarnOnce>,
    /// Live mode: the latency reported downstream (the first chunk's duration, at least one
    /// buffer); `None` when not live.
    live_latency: Option<gst::ClockTime>,
    /// Start of the monotonic clock that stands in for the running time without a pipeline clock.
    started: Instant,
}

#[derive(Default)]
struct State {
    runtime: Option<Runtime>,
    format: Option<SampleFormat>,
    /// Text pushed with `push-text` before start(); queued at start().
    early_texts: Vec<String>,
    /// The open utterance `append-text` adds to, until `end-text`, EOS or a flush.
    open: Option<Arc<OpenText>>,
    /// The id of the last utterance `append-text` opened (live, an EOS event waits for it).
    last_open: Option<u64>,
    /// `append-text`'s bytes as UTF-8: a character a C caller cut between two calls waits for
    /// its other bytes (until `end-text`).
    appended: Utf8Join,
    /// An EOS event came before the start (NULL, READY): kept, as GstBaseSrc keeps one, until the
    /// next start, which ends the stream at once (no audio) with the warning naming what is
    /// dropped (the `text` property, text pushed before the start). Text pushed after it is
    /// refused.
    eos_before_start: bool,
}

/// The element's instance data: property values and stream state, each behind its own lock
/// (lock order: settings, then state, then the runtime queue).
#[derive(Default)]
pub struct OmniTtsSrc {
    settings: Mutex<Settings>,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[glib::object_subclass]
impl ObjectSubclass for OmniTtsSrc {
    const NAME: &'static str = "GstOmniTtsSrc";
    type Type = super::OmniTtsSrc;
    type ParentType = gst_base::PushSrc;
}

impl OmniTtsSrc {
    fn settings(&self) -> Settings {
        lock(&self.settings).clone()
    }

    fn element(&self) -> gst::Element {
        self.obj().clone().upcast()
    }

    fn post_input_error(&self, e: &InputError) {
        gst::element_imp_error!(self, gst::ResourceError::Settings, ("{}", e));
    }

    /// The running time, or without a pipeline clock the time since start().
    fn running_time(&self, rt_started: Instant) -> gst::ClockTime {
        self.obj().current_running_time().unwrap_or_else(|| {
            gst::ClockTime::from_nseconds(rt_started.elapsed().as_nanos() as u64)
        })
    }

    /// Posts the voice warnings (ignored or missing `instruct`) that text queued with `s` gets
    /// and that were not posted since start.
    fn warn_voice(&self, warned: &WarnOnce, s: &SynthesisSettings, info: &ModelInfo) {
        for w in warned.new_warnings(s, info) {
            gst::element_imp_warning!(self, gst::ResourceError::Settings, ("{}", w));
        }
    }

    /// `text` without the markup the element does not interpret (SSML), with a warning when
    /// there was some (see [`strip_markup_tags`]).
    fn plain_text(&self, text: &str) -> String {
        match strip_markup_tags(text) {
            Some((plain, names)) => {
                gst::element_imp_warning!(
                    self,
                    gst::StreamError::Format,
                    ("{}", markup_warning(text, &names, &plain))
                );
                plain
            }
            None => text.to_string(),
        }
    }

    /// Warns (once per text) when `text` has letters of a script the checkpoint's languages do
    /// not cover.
    /// The loaded model's sample rate (`None` before start).
    fn rate(&self) -> Option<u32> {
        lock(&self.state)
            .runtime
            .as_ref()
            .map(|rt| rt.info.description.sample_rate)
    }

    /// Posts `text`'s warnings ([`text_warnings`]) for the loaded model, and a sentence too long
    /// to speak well that `split` cannot split ([`AutoSplit::long_sentence_warning`]).
    fn warn_text(&self, text: &str, info: &ModelInfo, auto: AutoSplit, split: SplitSentences) {
        let long = auto.long_sentence_warning(split, text);
        for w in text_warnings(text, &info.description).chain(long) {
            gst::element_imp_warning!(self, gst::StreamError::Format, ("{}", w));
        }
    }

    /// Queues `text` as an utterance (the `push-text` action and `text` set while running).
    /// Returns false when the text is refused, with an element error that names the property
    /// and value: at once before start, and while running in stream order, after the audio of
    /// the utterances queued before it (none of which is lost). Running, the request is checked
    /// completely here ([`Requests::checked`]: a new `ref-audio` is decoded and encoded before
    /// this returns).
    fn push_text(&self, text: &str) -> bool {
        self.queue_text(&self.plain_text(text))
    }

    /// [`OmniTtsSrc::push_text`] for a text whose markup is already removed.
    fn queue_text(&self, text: &str) -> bool {
        let settings = self.settings();
        let mut state = lock(&self.state);
        let Some(rt) = state.runtime.as_ref() else {
            if state.eos_before_start {
                drop(state);
                gst::warning!(CAT, imp = self, "text {text:?} arrived after EOS, refused");
                return false;
            }
            if let Some(why) = unspeakable(text) {
                drop(state);
                self.post_input_error(&input_error("text", text, why));
                return false;
            }
            gst::debug!(CAT, imp = self, "not started: keeping {text:?} for start()");
            state.early_texts.push(text.to_string());
            return true;
        };
        let (shared, info, auto_split, requests, warned) = (
            rt.shared.clone(),
            rt.info.clone(),
            rt.auto_split,
            rt.requests.clone(),
            rt.warned.clone(),
        );
        // Live: spoken at the running time it arrives.
        let now = rt.live_latency.map(|_| self.running_time(rt.started));
        drop(state);
        let pieces = settings.utterance_texts(text, auto_split);
        let whole = pieces.len() == 1;
        let built: Result<Vec<_>, InputError> = pieces
            .into_iter()
            .map(|piece| {
                requests
                    .checked(&settings.synthesis, &info, &piece)
                    .map(|request| (piece, Ok(request)))
                    .map_err(|e| naming_the_split(e, settings.split_sentences, whole))
            })
            .collect();
        // A refused text is queued whole, as one utterance whose error keeps its place in the stream.
        let (utterances, accepted) = match built {
            Ok(u) => (u, true),
            Err(e) => (vec![(text.to_string(), Err(e.to_string()))], false),
        };
        if accepted {
            self.warn_voice(&warned, &settings.synthesis, &info);
            self.warn_text(text, &info, auto_split, settings.split_sentences);
        }
        let mut inner = shared.lock();
        if inner.ended() {
            drop(inner);
            gst::warning!(CAT, imp = self, "text {text:?} arrived after EOS, refused");
            return false;
        }
        let start_pos = inner.arrival_pos(now);
        for (text, request) in utterances {
            let u = inner.queue(text, request, start_pos);
            gst::info!(
                CAT,
                imp = self,
                "queued utterance {} at sample {start_pos}: {:?}",
                u.id,
                u.text
            );
        }
        shared.notify();
        accepted
    }

    /// `append-text`: adds `fragment` to the open utterance, opening one (queued behind the
    /// utterances before it, in order) when none is open. Opening one posts its
    /// `omnitts/text-stream-mode` message (token or clause mode, and why). Checked now: the
    /// element has started, the voice and sampling properties (as for `push-text`; an error
    /// names the property) and, in token mode, no ICL voice clone. With `server=` the fragments
    /// go to the server's streaming-input websocket; a server without one fails the utterance
    /// (in stream order) with an error that says so.
    /// Checked when the text ends (token mode) or each clause completes (clause mode), as an
    /// error in stream order: the text (nothing to speak, too long) and the engine's refusals.
    fn append_text(&self, fragment: &str) -> bool {
        let settings = self.settings();
        let state = lock(&self.state);
        if let Some(open) = &state.open {
            if open.append(fragment) {
                return true;
            }
            // Its request has failed (the error comes in stream order) or its speech has ended
            // (the model's end of speech, max-new-tokens): the rest of its text is refused until
            // end-text, instead of each fragment opening an utterance of its own.
            gst::debug!(
                CAT,
                imp = self,
                "append-text: the open utterance has failed or ended, refused"
            );
            return false;
        }
        let Some(rt) = state.runtime.as_ref() else {
            drop(state);
            gst::warning!(CAT, imp = self, "append-text before start: refused");
            return false;
        };
        let (shared, info, requests, warned, hint) = (
            rt.shared.clone(),
            rt.info.clone(),
            rt.requests.clone(),
            rt.warned.clone(),
            rt.streaming_prompt,
        );
        let now = rt.live_latency.map(|_| self.running_time(rt.started));
        drop(state);
        let (mode, why) = requests.stream_mode(
            &info.description,
            settings.synthesis.prompt_mode.prompt_mode(),
            hint,
        );
        let (request, open) = match requests.checked_open(&settings.synthesis, &info, mode) {
            Ok(r) => r,
            Err(e) => {
                self.post_input_error(&e);
                return false;
            }
        };
        self.warn_voice(&warned, &settings.synthesis, &info);
        open.append(fragment);
        let mut inner = shared.lock();
        if inner.ended() {
            drop(inner);
            gst::warning!(CAT, imp = self, "append-text after EOS, refused");
            return false;
        }
        let start_pos = inner.arrival_pos(now);
        let id = inner.queue(String::new(), Ok(request), start_pos).id;
        gst::info!(
            CAT,
            imp = self,
            "queued open utterance {id} at sample {start_pos} in {} mode: {why}",
            mode.name()
        );
        shared.notify();
        drop(inner);
        let old = {
            let mut state = lock(&self.state);
            state.last_open = Some(id);
            state.open.replace(open)
        };
        if let Some(old) = old {
            old.end();
        }
        let element = self.obj();
        let _ = element.post_message(messages::text_stream_mode(
            element.upcast_ref(),
            id,
            mode.name(),
            &why,
        ));
        true
    }

    /// Whether utterance `id` is the open utterance and its text has not ended (`end-text`,
    /// EOS, a flush).
    fn text_still_open(&self, id: u64) -> bool {
        let state = lock(&self.state);
        state.open.is_some() && state.last_open == Some(id)
    }

    /// `end-text`: ends the open utterance's text; false when none is open.
    fn end_text(&self) -> bool {
        let (open, cut) = {
            let mut state = lock(&self.state);
            (state.open.take(), state.appended.finish())
        };
        if let Some((byte, at)) = cut {
            self.warn_bad_bytes("append-text", byte, at);
        }
        match open {
            Some(open) => open.end(),
            None => false,
        }
    }

    /// A signal's string argument as the caller's bytes: a C caller may pass any bytes, and
    /// glib's conversion to a Rust string stops the process on bytes that are not UTF-8.
    fn string_arg(value: &glib::Value) -> Vec<u8> {
        use glib::translate::ToGlibPtr;
        // SAFETY: the value holds a gchararray (the signal's parameter type); the string is
        // copied before the value can go.
        unsafe {
            let p = glib::gobject_ffi::g_value_get_string(value.to_glib_none().0);
            if p.is_null() {
                Vec::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_bytes().to_vec()
            }
        }
    }

    /// `push-text` from the caller's bytes: bytes that are not UTF-8 are dropped, with a
    /// warning naming the first.
    fn push_bytes(&self, bytes: &[u8]) -> bool {
        let joined = Utf8Join::whole(bytes);
        if let Some((byte, at)) = joined.invalid {
            self.warn_bad_bytes("push-text", byte, at);
        }
        self.push_text(&joined.text)
    }

    /// `append-text` from the caller's bytes: a character cut between two calls is joined,
    /// bytes that are not UTF-8 are dropped with a warning naming the first.
    fn append_bytes(&self, bytes: &[u8]) -> bool {
        let joined = lock(&self.state).appended.push(bytes);
        if let Some((byte, at)) = joined.invalid {
            self.warn_bad_bytes("append-text", byte, at);
        }
        self.append_text(&joined.text)
    }

    fn warn_bad_bytes(&self, signal: &str, byte: u8, at: usize) {
        gst::element_imp_warning!(
            self,
            gst::StreamError::Format,
            (
                "{}: text that is not UTF-8 (byte 0x{:02x} at offset {}): bytes dropped",
                signal,
                byte,
                at
            )
        );
    }

    /// Drops queued text and audio and stops the utterance in flight (`cancel`, and a flush:
    /// see `runtime::Inner::flush_started`). Returns whether anything was dropped.
    fn discard(&self, why: Discard) -> bool {
        self.end_text();
        let (shared, spf) = {
            let state = lock(&self.state);
            match state.runtime.as_ref() {
                Some(rt) => (rt.shared.clone(), rt.info.samples_per_frame),
                None => return false,
            }
        };
        let mut inner = shared.lock();
        let had = inner.has_work();
        let done = match why {
            Discard::Cancel => inner.discard_all(spf),
            Discard::FlushStart => inner.flush_started(spf),
        };
        shared.notify();
        drop(inner);
        gst::debug!(
            CAT,
            imp = self,
            "{why:?}: discarded queued text and audio (had any: {had})"
        );
        if let Some(done) = done {
            let _ = self.obj().post_message(done.message(&self.element()));
        }
        had
    }

    /// Posts the notices of the output's steps (never called with the queue lock held).
    fn post_notices(&self, notices: &mut Vec<Notice>) {
        let src = self.element();
        for notice in notices.drain(..) {
            match notice {
                Notice::Started { id, text, pos, pts } => {
                    gst::info!(CAT, imp = self, "utterance {id} starts at sample {pos}");
                    let _ = src.post_message(messages::started(&src, id, &text, pts));
                }
                Notice::FirstAudio { id, ttfa_ms, pts } => {
                    let _ = src.post_message(messages::first_audio(&src, id, ttfa_ms, pts));
                }
                Notice::Done(done) => {
                    gst::info!(
                        CAT,
                        imp = self,
                        "utterance {} done: {:?}, {} frames, {} samples, RTF {:.3}",
                        done.id,
                        done.reason,
                        done.metrics.frames,
                        done.samples,
                        done.metrics.rtf
                    );
                    let _ = src.post_message(done.message(&src));
                    if let Some(failure) = done.failure_message(&src) {
                        let _ = src.post_message(failure);
                    }
                    if let Some(w) = done.limit_warning("utterance") {
                        gst::element_imp_warning!(self, gst::StreamError::Failed, ("{}", w));
                    }
                }
                Notice::Refused(r) => {
                    let _ = src.post_message(r.message(&src));
                }
                Notice::Underrun { id, pos, count } => gst::warning!(
                    CAT,
                    imp = self,
                    "utterance {id}: audio late at sample {pos} (underrun {count}), inserting \
                     silence; synthesis is slower than real time or the chunks are too large \
                     for the latency"
                ),
                // The open utterance's text still arriving (append-text) is what it waits for:
                // expected of a voice agent's every reply, so logged, not warned about.
                Notice::LateFirstAudio { id, latency } if self.text_still_open(id) => gst::info!(
                    CAT,
                    imp = self,
                    "utterance {id}: no audio at its start plus the latency ({} ms): its text \
                     is still arriving; silence until its audio comes",
                    latency.mseconds()
                ),
                Notice::LateFirstAudio { id, latency } => gst::element_imp_warning!(
                    self,
                    gst::StreamError::Failed,
                    (
                        "utterance {}: no audio at its start plus the latency ({} ms): it waits \
                         in the engine's queue behind other requests, or its first chunk is \
                         slower than the latency; silence until its audio comes (counted in its \
                         done message's underruns, wait-ms and silence-samples)",
                        id,
                        latency.mseconds()
                    )
                ),
            }
        }
    }
}

impl ObjectImpl for OmniTtsSrc {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            let mut props = vec![
                glib::ParamSpecString::builder("text")
                    .nick("Text")
                    .blurb(
                        "Text to speak. Set before start: the first utterance. Set in PAUSED or \
                         PLAYING: each new value is queued as another utterance",
                    )
                    .mutable_playing()
                    .build(),
                split_sentences_param_spec(
                    "its own utterance, queued back to back, each with its own utterance \
                     messages",
                ),
            ];
            props.extend(synthesis_param_specs());
            props.extend(server_param_specs());
            props.extend([
                glib::ParamSpecUInt::builder("samples-per-buffer")
                    .nick("Samples per buffer")
                    .blurb(
                        "Largest number of samples per output buffer, at the model's rate \
                         (480 = 20 ms at Qwen3-TTS's 24 kHz, 10.9 ms at Fish S2 Pro's 44.1 kHz)",
                    )
                    .minimum(1)
                    .maximum(MAX_SAMPLES_PER_BUFFER)
                    .default_value(DEFAULT_SAMPLES_PER_BUFFER)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoolean::builder("is-live")
                    .nick("Is live")
                    .blurb(
                        "Live source: paced by the clock, GAP silence between utterances, text \
                         spoken at the running time it arrives, never EOS by itself",
                    )
                    .default_value(DEFAULT_IS_LIVE)
                    .mutable_ready()
                    .build(),
            ]);
            props.extend(model_info_param_specs());
            props
        });
        PROPERTIES.as_ref()
    }

    fn signals() -> &'static [glib::subclass::Signal] {
        static SIGNALS: LazyLock<Vec<glib::subclass::Signal>> = LazyLock::new(|| {
            vec![
                glib::subclass::Signal::builder("push-text")
                    .param_types([String::static_type()])
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        let bytes = OmniTtsSrc::string_arg(&args[1]);
                        Some(element.imp().push_bytes(&bytes).to_value())
                    })
                    .build(),
                glib::subclass::Signal::builder("append-text")
                    .param_types([String::static_type()])
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        let bytes = OmniTtsSrc::string_arg(&args[1]);
                        Some(element.imp().append_bytes(&bytes).to_value())
                    })
                    .build(),
                glib::subclass::Signal::builder("end-text")
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        Some(element.imp().end_text().to_value())
                    })
                    .build(),
                glib::subclass::Signal::builder("cancel")
                    .return_type::<bool>()
                    .action()
                    .class_handler(|args| {
                        let element = args[0].get::<super::OmniTtsSrc>().ok()?;
                        Some(element.imp().discard(Discard::Cancel).to_value())
                    })
                    .build(),
            ]
        });
        SIGNALS.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let name = pspec.name();
        // Properties that the model load or the caps depend on keep their value once started.
        let started = lock(&self.state).runtime.is_some();
        if refuse_ready_only(&self.element(), pspec, value, started) {
            gst::warning!(CAT, imp = self, "{name} can only change in NULL or READY");
            return;
        }
        let mut s = lock(&self.settings);
        if pspec.flags().contains(glib::ParamFlags::READABLE) {
            gst::debug!(CAT, imp = self, "set {name} = {value:?}");
        } else {
            // Write-only: the API key, never logged.
            gst::debug!(CAT, imp = self, "set {name}");
        }
        match name {
            "text" => {
                let t: Option<String> = value.get().expect("type checked upstream");
                s.text = t.clone();
                drop(s);
                let running = lock(&self.state).runtime.is_some();
                // Running, each value is another utterance; clearing the property (NULL, empty
                // or blank) queues nothing.
                if running && let Some(t) = t.filter(|t| !t.trim().is_empty()) {
                    self.push_text(&t);
                }
            }
            "samples-per-buffer" => {
                s.samples_per_buffer = value.get().expect("type checked upstream")
            }
            "is-live" => s.is_live = value.get().expect("type checked upstream"),
            "split-sentences" => s.split_sentences = value.get().expect("type checked upstream"),
            other => {
                if !s.synthesis.set_property(other, value) && !s.server.set_property(other, value) {
                    gst::warning!(CAT, imp = self, "unknown property {other}");
                }
            }
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        // The loaded checkpoint's sampling defaults, read before the settings are locked.
        let loaded = lock(&self.state)
            .runtime
            .as_ref()
            .map(|rt| rt.info.base_sampling.clone());
        let s = lock(&self.settings);
        match pspec.name() {
            "text" => s.text.to_value(),
            "samples-per-buffer" => s.samples_per_buffer.to_value(),
            "is-live" => s.is_live.to_value(),
            "split-sentences" => s.split_sentences.to_value(),
            other => {
                if let Some(v) = s
                    .synthesis
                    .property(other, loaded.as_ref())
                    .or_else(|| s.server.property(other))
                {
                    return v;
                }
                drop(s);
                let state = lock(&self.state);
                let loaded = state
                    .runtime
                    .as_ref()
                    .map(|rt| (&rt.info, rt.requests.engine().map(|e| &***e)));
                if let Some(v) = model_info_property(other, loaded) {
                    return v;
                }
                gst::warning!(CAT, imp = self, "unknown property {other}");
                pspec.default_value().clone()
            }
        }
    }

    fn constructed(&self) {
        self.parent_constructed();
        let obj = self.obj();
        obj.set_format(gst::Format::Time);
        obj.set_live(DEFAULT_IS_LIVE);
    }
}

impl GstObjectImpl for OmniTtsSrc {}

impl ElementImpl for OmniTtsSrc {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        // Cheap and model-free: the registry reads this without loading any model.
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Text-to-speech source",
                "Source/Audio",
                "Speaks text with Qwen3-TTS or Fish S2 Pro (candle): streaming mono audio at the \
                 model's rate (24 kHz, 44.1 kHz), live or not",
                "omnitts developers",
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let src = gst::PadTemplate::new(
                "src",
                gst::PadDirection::Src,
                gst::PadPresence::Always,
                &audio::template_caps(),
            )
            .expect("static pad template");
            vec![src]
        });
        PAD_TEMPLATES.as_ref()
    }

    fn change_state(
        &self,
        transition: gst::StateChange,
    ) -> Result<gst::StateChangeSuccess, gst::StateChangeError> {
        if transition == gst::StateChange::ReadyToPaused {
            let live = lock(&self.settings).is_live;
            self.obj().set_live(live);
            // Load here, not in BaseSrc's start(): when a subclass's start() fails, BaseSrc posts
            // a generic error ("state change failed and some element failed to post a proper
            // error message") after ours. Failing here posts only the clear one.
            if let Err(e) = self.start_runtime() {
                self.post_error_message(e);
                return Err(gst::StateChangeError);
            }
        }
        // Live: how far the running time moves while paused (see Output::resume).
        if matches!(
            transition,
            gst::StateChange::PlayingToPaused | gst::StateChange::PausedToPlaying
        ) && let Some(rt) = lock(&self.state).runtime.as_ref()
            && let Some(now) = self.obj().current_running_time()
        {
            let mut inner = rt.shared.lock();
            match transition {
                gst::StateChange::PlayingToPaused => inner.pause(now),
                _ => inner.resume(now),
            }
        }
        let ret = self.parent_change_state(transition);
        if ret.is_err() && transition == gst::StateChange::ReadyToPaused {
            // BaseSrc did not start (so will not stop): let go of what start_runtime() made.
            let _ = BaseSrcImpl::stop(self);
        }
        ret
    }

    fn send_event(&self, event: gst::Event) -> bool {
        match event.view() {
            // Not seekable: BaseSrc would flush downstream and start no new segment for a seek
            // sent to the element itself (a pipeline seek is refused by the pad).
            gst::EventView::Seek(_) => {
                gst::debug!(
                    CAT,
                    imp = self,
                    "refusing a seek: the stream is not seekable"
                );
                return false;
            }
            gst::EventView::FlushStart(_) => {
                // Unlocked first, as on the pad (see `BaseSrcImpl::event`).
                self.set_unlocked(true);
                self.discard(Discard::FlushStart);
                // A flush clears an EOS kept for the start, as GstBaseSrc's does.
                lock(&self.state).eos_before_start = false;
            }
            // Before BaseSrc restarts the streaming task.
            gst::EventView::FlushStop(_) => self.flush_stopped(),
            // Running, the EOS is create()'s to return (at once, or live after the drain), never
            // BaseSrc's: see end_stream(). Before the start, kept for it.
            gst::EventView::Eos(_) => {
                if !self.end_stream() {
                    gst::debug!(
                        CAT,
                        imp = self,
                        "EOS before the start: the stream ends as it starts"
                    );
                    lock(&self.state).eos_before_start = true;
                }
                return true;
            }
            _ => {}
        }
        self.parent_send_event(event)
    }
}

/// Why queued text and audio are dropped ([`OmniTtsSrc::discard`]).
#[derive(Debug, Clone, Copy)]
enum Discard {
    /// The `cancel` action.
    Cancel,
    /// A FLUSH_START, sent to the element, the pipeline or the source pad.
    FlushStart,
}

/// How an EOS event ends the stream (for the warning that names what it drops).
#[derive(Debug, Clone, Copy)]
enum EosEnd {
    /// At once (running).
    Now,
    /// Live, once utterance N, whose text `append-text` streams, is spoken.
    AfterOpen(u64),
    /// Sent before the start: as it starts.
    AtStart,
}

impl OmniTtsSrc {
    /// An EOS event ends the stream: the refusals queued behind it, which the output will not
    /// reach, are posted now (in stream order). It ends the open utterance's text. Live, when
    /// the last utterance `append-text` opened is unfinished, the stream ends once it (and what
    /// was queued before it) has been spoken, and the utterances queued behind it are dropped.
    /// Otherwise it ends at once: `create()` returns EOS at its next step (a buffer it is
    /// returning still goes out: its messages are posted). Either way one warning names what is
    /// dropped (see [`OmniTtsSrc::announce_eos`]), and `create()` returns that EOS only once
    /// these messages are posted, so that they come before the EOS message on the bus.
    ///
    /// Returns true once started: the EOS is then `create()`'s to return (BaseSrc pushes it
    /// downstream from the streaming thread), never BaseSrc's `send_event()`'s. That one, in push
    /// mode, takes the source pad's stream lock to queue the EOS, with the state lock that
    /// `gst_element_send_event()` holds: while the streaming thread is blocked pushing a buffer
    /// into a sink that waits for preroll (a pipeline still going to PLAYING, or PAUSED), that
    /// push ends only when the pipeline goes to PLAYING, which needs that state lock: the
    /// application's `send_event()` hung for good. Returns false before start (no streaming
    /// thread; see [`State::eos_before_start`]).
    fn end_stream(&self) -> bool {
        self.end_text();
        let (shared, live, last_open) = {
            let s = lock(&self.state);
            match s.runtime.as_ref() {
                Some(rt) => (rt.shared.clone(), rt.live_latency.is_some(), s.last_open),
                None => return false,
            }
        };
        let mut inner = shared.lock();
        if inner.ended() {
            // A second EOS event, or one after the stream's own end: nothing more to name.
            return true;
        }
        let (refusals, dropped, how) = match last_open {
            Some(id) if live && inner.unfinished(id) => {
                let (refusals, dropped) = inner.drain_then_end(id);
                (refusals, dropped, EosEnd::AfterOpen(id))
            }
            // The EOS ends the stream at once: what is queued is never spoken.
            _ => {
                let refusals = inner.end_stream();
                (refusals, inner.dropped(), EosEnd::Now)
            }
        };
        drop(inner);
        shared.notify();
        self.announce_eos(&shared, refusals, dropped, how);
        true
    }

    /// Posts an EOS event's messages: the refusals it leaves behind, and one warning naming what
    /// it drops (the utterance it cuts, how many it drops that were not begun and the first of
    /// them), the same for every way an EOS ends the stream. Then `create()` may return the EOS.
    fn announce_eos(
        &self,
        shared: &Shared,
        refusals: Vec<Refusal>,
        dropped: Option<Dropped>,
        how: EosEnd,
    ) {
        let src = self.element();
        for r in refusals {
            let _ = src.post_message(r.message(&src));
        }
        if let Some(d) = dropped {
            let mut what = Vec::new();
            if let Some(cut) = &d.cut {
                what.push(format!("'{}' is cut where it is", quoted(cut)));
            }
            if let Some(first) = &d.first {
                what.push(format!(
                    "{} not spoken (the first: '{}')",
                    count_of(d.not_begun, "queued utterance"),
                    quoted(first)
                ));
            }
            let what = what.join(" and ");
            const HINT: &str =
                "wait for the last utterance-done before sending EOS to have everything spoken";
            let warning = match how {
                EosEnd::Now => format!("EOS: the stream ends now: {what}; {HINT}"),
                EosEnd::AfterOpen(id) => format!(
                    "EOS: the stream ends once utterance {id}, whose text append-text streams, \
                     is spoken: {what}; {HINT}"
                ),
                EosEnd::AtStart => format!(
                    "EOS: sent before the start, it ends the stream as the stream starts: {what}"
                ),
            };
            gst::element_imp_warning!(self, gst::StreamError::Failed, ("{}", warning));
        }
        // Only now may create() return the EOS: after these messages on the bus.
        shared.lock().announce_end();
        shared.notify();
    }
}

impl OmniTtsSrc {
    /// Loads the model (or connects to the server), checks the text queued before start and
    /// starts the worker: the element's start, run from `change_state` (READY→PAUSED).
    fn start_runtime(&self) -> Result<(), gst::ErrorMessage> {
        let settings = self.settings();
        let (live, initial) = (
            settings.is_live,
            settings.text.as_deref().map(|t| self.plain_text(t)),
        );
        let (early, eos_kept) = {
            let mut state = lock(&self.state);
            (
                std::mem::take(&mut state.early_texts),
                state.eos_before_start,
            )
        };
        let has_text =
            initial.as_deref().is_some_and(|t| !nothing_to_speak(t)) || !early.is_empty();
        // (An EOS kept for the start ends the stream as it starts: no text is needed.)
        if !live && !has_text && !eos_kept && initial.as_deref().is_none_or(str::is_empty) {
            // Set, but only markup (SSML such as <speak></speak>): name the value as it was set.
            if let Some(raw) = settings.text.as_deref().filter(|t| !t.trim().is_empty()) {
                return Err(input_error(
                    "text",
                    raw,
                    "nothing to speak once its markup is removed",
                )
                .to_error_msg());
            }
            return Err(gst::error_msg!(
                gst::ResourceError::Settings,
                ("text '': nothing to speak; set text, push-text before start, or use \
                     is-live=true to wait for push-text")
            ));
        }
        if let Some(t) = initial.as_deref()
            && !t.is_empty()
            && nothing_to_speak(t)
        {
            return Err(input_error("text", t, NOTHING_TO_SPEAK).to_error_msg());
        }
        let element = self.element();
        let model = &settings.synthesis.model;
        let (loading, failed) = match settings.server.url() {
            Some(url) => (format!("connecting to server {url}"), "server check failed"),
            None => (format!("loading model {model}"), "model loading failed"),
        };
        progress::post_start(&element, "load", &loading);
        let t0 = Instant::now();
        let Ready {
            backend,
            requests,
            info,
        } = prepare(&element, *CAT, &settings.synthesis, &settings.server, live).inspect_err(
            |_| {
                progress::post_error(&element, "load", failed);
            },
        )?;
        let load_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let max_new_tokens = info.base_sampling.max_new_tokens;
        let auto_split = match requests.server() {
            // No checkpoint directory here: the threshold by frames.
            Some(_) => AutoSplit::by_frames(max_new_tokens, info.description.frame_rate()),
            None => {
                AutoSplit::for_checkpoint(&info.dir, max_new_tokens, info.description.frame_rate())
                    .map_err(|e| {
                        gst::error_msg!(gst::ResourceError::Settings, ("model '{}': {}", model, e))
                    })?
            }
        }
        .keeping_turns(info.description.speaker_turn_tag);
        let streaming_prompt = match requests.server() {
            Some(_) => None,
            None => streaming_prompt_hint(&info.dir).map_err(|e| {
                gst::error_msg!(gst::ResourceError::Settings, ("model '{}': {}", model, e))
            })?,
        };
        let rate = info.description.sample_rate;
        let first_chunk = pts_of(
            (info.first_chunk_frames * info.samples_per_frame) as u64,
            rate,
        );
        let latency = first_chunk.max(pts_of(settings.samples_per_buffer as u64, rate));
        let live_latency = live.then_some(latency);
        let latency_warning = (live && latency > LIVE_LATENCY_WARNING).then(|| {
            let cause = if first_chunk >= latency {
                // The property when set, else the stage config's first chunk.
                let setting = match settings.synthesis.initial_chunk_frames {
                    0 => format!("stage-config '{}'", settings.synthesis.stage_config_name()),
                    n => format!("initial-chunk-frames={n}"),
                };
                format!(
                    "{setting}: the first chunk, {} frames of {} ms, is what each utterance's \
                     audio waits for; 1-4 frames keep it short",
                    info.first_chunk_frames,
                    pts_of(info.samples_per_frame as u64, rate).mseconds()
                )
            } else {
                format!(
                    "samples-per-buffer={}: each buffer is {} ms of audio",
                    settings.samples_per_buffer,
                    latency.mseconds()
                )
            };
            format!(
                "omnittssrc: live latency {} ms, from {cause}",
                latency.mseconds()
            )
        });

        let output = Output::new(
            settings.samples_per_buffer,
            live_latency,
            MAX_QUEUED_SECONDS * rate as usize,
            rate,
        );
        let shared = Shared::new(output);
        let mut texts: Vec<String> = Vec::new();
        if let Some(t) = initial.filter(|t| !nothing_to_speak(t)) {
            texts.push(t);
        }
        texts.extend(early);
        let warned = Arc::new(WarnOnce::default());
        for t in &texts {
            let pieces = settings.utterance_texts(t, auto_split);
            let whole = pieces.len() == 1;
            for text in pieces {
                let request = requests
                    .checked(&settings.synthesis, &info, &text)
                    .map_err(|e| naming_the_split(e, settings.split_sentences, whole))
                    .map_err(|e| e.to_error_msg())?;
                self.warn_voice(&warned, &settings.synthesis, &info);
                shared.lock().queue(text, Ok(request), 0);
            }
            self.warn_text(t, &info, auto_split, settings.split_sentences);
        }
        // An EOS event before the start: the stream ends as it starts. What it drops is named
        // once the element has started; the worker never sees it.
        let eos_at_start = std::mem::take(&mut lock(&self.state).eos_before_start).then(|| {
            let mut inner = shared.lock();
            let refusals = inner.end_stream();
            let dropped = inner.dropped();
            inner.drop_pending();
            (refusals, dropped)
        });
        let worker =
            runtime::spawn_worker(backend, shared.clone(), element.downgrade()).map_err(|e| {
                gst::error_msg!(
                    gst::ResourceError::Failed,
                    ("could not start the worker thread: {}", e)
                )
            })?;
        // The latency the element reports is a live one: non-live, none is said.
        let live_note = if live {
            format!("; live latency {} ms", latency.mseconds())
        } else {
            String::new()
        };
        let ready = match &*requests {
            Requests::Remote { target, .. } => format!(
                "omnittssrc: server '{}' ready (model '{}'; {}; checked in {:.0} ms{})",
                target.url,
                info.model,
                count_of(info.description.speakers.len(), "voice"),
                load_ms,
                live_note
            ),
            Requests::Local { engine, .. } => format!(
                "omnittssrc: model '{}' ready ({}; {}; {}; {}; ready in {:.0} ms{})",
                model,
                info.dir.display(),
                info.description.name,
                count_of(info.description.speakers.len(), "preset speaker"),
                sharing(engine, settings.synthesis.shared_engine),
                load_ms,
                live_note
            ),
        };
        gst::info!(CAT, imp = self, "{ready}");
        // Text pushed while the model loaded (after `early` was taken) is queued now, behind it.
        let pushed_while_loading = {
            let mut state = lock(&self.state);
            state.runtime = Some(Runtime {
                requests,
                shared: shared.clone(),
                worker: Some(worker),
                info,
                auto_split,
                streaming_prompt,
                warned,
                live_latency,
                started: Instant::now(),
            });
            std::mem::take(&mut state.early_texts)
        };
        // gst-launch prints only the debug part of an info message: the text goes there too
        gst::element_imp_info!(
            self,
            gst::ResourceError::Settings,
            ("{}", ready),
            ["{}", ready]
        );
        progress::post_complete(&element, "load", &ready);
        if let Some((refusals, dropped)) = eos_at_start {
            self.announce_eos(&shared, refusals, dropped, EosEnd::AtStart);
        }
        for text in pushed_while_loading {
            self.queue_text(&text);
        }
        if live {
            if let Some(w) = latency_warning {
                gst::element_imp_warning!(self, gst::ResourceError::Settings, ("{}", w));
            }
            let _ = element.post_message(gst::message::Latency::builder().src(&element).build());
        }
        Ok(())
    }
}

impl BaseSrcImpl for OmniTtsSrc {
    /// The work is done by [`OmniTtsSrc::start_runtime`] in `change_state` (READY→PAUSED),
    /// before BaseSrc starts; this only covers a start without that state change.
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        if lock(&self.state).runtime.is_some() {
            return Ok(());
        }
        self.start_runtime()
    }

    fn stop(&self) -> Result<(), gst::ErrorMessage> {
        let rt = {
            let mut state = lock(&self.state);
            state.format = None;
            state.runtime.take()
        };
        if let Some(mut rt) = rt {
            rt.shared.lock().shut_down();
            rt.shared.notify();
            if let Some(w) = rt.worker.take()
                && w.join().is_err()
            {
                gst::warning!(CAT, imp = self, "worker thread panicked");
            }
            // The worker has let go of the engine: dropping the last reference joins its stages.
            drop(rt);
            gst::debug!(
                CAT,
                imp = self,
                "stopped: worker joined, engine share or server client dropped"
            );
        }
        Ok(())
    }

    fn is_seekable(&self) -> bool {
        false
    }

    /// Before start, any rate (the template); once the model is loaded, its rate only.
    fn caps(&self, filter: Option<&gst::Caps>) -> Option<gst::Caps> {
        let caps = match self.rate() {
            Some(rate) => audio::caps(rate),
            None => audio::template_caps(),
        };
        Some(match filter {
            Some(f) => f.intersect_with_mode(&caps, gst::CapsIntersectMode::First),
            None => caps,
        })
    }

    /// BaseSrc's negotiation, after a check that downstream takes one of the model's caps: when
    /// it takes none (another rate or format), an error says so and what to do, instead of
    /// BaseSrc's bare "not-negotiated".
    fn negotiate(&self) -> Result<(), gst::LoggableError> {
        if let Some(ours) = BaseSrcImpl::caps(self, None)
            && let Some(pad) = self.obj().static_pad("src")
            && pad.peer_query_caps(Some(&ours)).is_empty()
        {
            gst::element_imp_error!(
                self,
                gst::CoreError::Negotiation,
                ("{}", audio::refused_by_downstream("omnittssrc", &ours))
            );
            return Err(gst::loggable_error!(CAT, "downstream takes none of {ours}"));
        }
        self.parent_negotiate()
    }

    fn set_caps(&self, caps: &gst::Caps) -> Result<(), gst::LoggableError> {
        let rate = self
            .rate()
            .ok_or_else(|| gst::loggable_error!(CAT, "caps {caps} before the model is loaded"))?;
        let format =
            SampleFormat::from_caps(caps, rate).map_err(|e| gst::loggable_error!(CAT, "{e}"))?;
        gst::debug!(CAT, imp = self, "negotiated {caps}");
        lock(&self.state).format = Some(format);
        let _ = self
            .obj()
            .post_message(gst::message::Latency::builder().src(&*self.obj()).build());
        Ok(())
    }

    /// The LATENCY query: live, min the first chunk's duration (or a buffer's), no max, once the
    /// model is loaded. A live element asked before that answers nothing (the query fails, as
    /// that of a live source whose device is not open does): BaseSrc's answer, a latency of 0,
    /// would make a mixer start its output on it and start it again when the element's latency
    /// message comes.
    fn query(&self, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::Latency(q) = query.view_mut() {
            let (loaded, latency) = {
                let state = lock(&self.state);
                let rt = state.runtime.as_ref();
                (rt.is_some(), rt.and_then(|rt| rt.live_latency))
            };
            if let Some(latency) = latency {
                gst::debug!(CAT, imp = self, "latency: live, min {latency}");
                q.set(true, latency, gst::ClockTime::NONE);
                return true;
            }
            if !loaded && lock(&self.settings).is_live {
                gst::debug!(
                    CAT,
                    imp = self,
                    "latency: not known before the model is loaded"
                );
                return false;
            }
        }
        BaseSrcImplExt::parent_query(self, query)
    }

    /// Events sent to the source pad itself (by an element downstream, or `gst_pad_send_event`).
    /// A flush there is BaseSrc's unlock / unlock_stop only: `create()` returns FLUSHING and the
    /// streaming task pauses, and nothing restarts it; see [`OmniTtsSrc::resume_after_flush`].
    fn event(&self, event: &gst::Event) -> bool {
        match event.view() {
            gst::EventView::FlushStart(_) => {
                // Unlocked first: create() returns FLUSHING from here on, never EOS for the
                // queue the discard empties (non-live), so text pushed before FLUSH_STOP is
                // spoken after it.
                let ret = self.parent_event(event);
                self.discard(Discard::FlushStart);
                ret
            }
            gst::EventView::FlushStop(_) => {
                self.flush_stopped();
                let ret = self.parent_event(event);
                self.resume_after_flush();
                ret
            }
            _ => self.parent_event(event),
        }
    }

    /// No clock sync by BaseSrc: live, `create()` returns each buffer at its PTS itself (see
    /// [`Output`]), so BaseSrc neither waits nor shifts the timestamps.
    fn times(&self, _buffer: &gst::BufferRef) -> (Option<gst::ClockTime>, Option<gst::ClockTime>) {
        (None, None)
    }

    fn unlock(&self) -> Result<(), gst::ErrorMessage> {
        self.set_unlocked(true);
        Ok(())
    }

    fn unlock_stop(&self) -> Result<(), gst::ErrorMessage> {
        self.set_unlocked(false);
        Ok(())
    }
}

impl OmniTtsSrc {
    /// After a FLUSH_STOP sent to the source pad, what `gst_base_src_send_event()` does for one
    /// sent to the element: restart the streaming task, in push mode, and live only while
    /// PLAYING (else BaseSrc starts it on PLAYING). BaseSrc's pad event handler only ends the
    /// flush (unlock_stop): the task, paused when the flushed `create()` returned FLUSHING,
    /// stayed paused, and text pushed later was never spoken. (audiotestsrc goes on after such a
    /// pair only because its streaming thread is nearly always in its push, held by a sink that
    /// syncs to the clock, while the pair comes and goes; its `create()` never waits.)
    /// The pad's segment, which the FLUSH_STOP removed, is sent again before the next buffer:
    /// the same segment, as downstream was not flushed, so running times go on.
    ///
    /// Runs with the pad's stream lock held (the pad takes it for a FLUSH_STOP), so the
    /// streaming thread is not in the middle of a loop.
    fn resume_after_flush(&self) {
        let obj = self.obj();
        let pad = obj.src_pad();
        if pad.mode() != gst::PadMode::Push {
            return;
        }
        let segment = obj.segment();
        if obj.new_segment(&segment).is_err() {
            gst::warning!(
                CAT,
                imp = self,
                "flush-stop: could not queue the segment again"
            );
        }
        let base_src: *mut gst_base::ffi::GstBaseSrc =
            obj.upcast_ref::<gst_base::BaseSrc>().as_ptr();
        // SAFETY: the element is a GstBaseSrc, alive while `obj` is. `live_running` is read under
        // BaseSrc's live lock, and the pad's task is looked up and started under the pad's object
        // lock, as gst_pad_start_task() does; a task stopped meanwhile (the pad deactivated) has
        // been removed from the pad under that lock, so it is never started again. The lock
        // order (stream lock, live lock, pad object lock) is BaseSrc's own.
        unsafe {
            let live_lock = std::ptr::addr_of_mut!((*base_src).live_lock);
            gst::glib::ffi::g_mutex_lock(live_lock);
            let playing = (*base_src).is_live == 0 || (*base_src).live_running != 0;
            let mut restarted = false;
            if playing {
                let _pad_lock = pad.object_lock();
                let task = (*pad.as_ptr()).task;
                if !task.is_null() {
                    restarted = gst::ffi::gst_task_set_state(task, gst::ffi::GST_TASK_STARTED)
                        != gst::glib::ffi::GFALSE;
                }
            }
            gst::glib::ffi::g_mutex_unlock(live_lock);
            gst::debug!(
                CAT,
                imp = self,
                "flush-stop on the pad: streaming task restarted: {restarted}"
            );
        }
    }

    /// A flush ends (FLUSH_STOP, to the element or its pad): the buffer that was on its way
    /// when it began was dropped, so the next one is DISCONT; live, the timeline starts again at
    /// the running time of the next step (a pipeline's flush may have reset it to 0).
    fn flush_stopped(&self) {
        let state = lock(&self.state);
        if let Some(rt) = state.runtime.as_ref() {
            rt.shared.lock().flush_stopped();
        }
    }

    /// BaseSrc `unlock()` / `unlock_stop()`: a blocked `create()` returns FLUSHING.
    fn set_unlocked(&self, unlocked: bool) {
        let state = lock(&self.state);
        if let Some(rt) = state.runtime.as_ref() {
            rt.shared.lock().set_unlocked(unlocked);
            rt.shared.notify();
        }
    }
}

impl PushSrcImpl for OmniTtsSrc {
    /// Asks the output what to do next until it says: a buffer, EOS, FLUSHING, or an error.
    /// Waits (for the worker, or live until a running time) with the queue unlocked, and posts
    /// the steps' notices with no lock held.
    fn create(
        &self,
        _buffer: Option<&mut gst::BufferRef>,
    ) -> Result<CreateSuccess, gst::FlowError> {
        let (shared, started, live, format) = {
            let state = lock(&self.state);
            let Some(rt) = state.runtime.as_ref() else {
                return Err(gst::FlowError::Flushing);
            };
            let Some(format) = state.format else {
                drop(state);
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    ("create() before caps were negotiated")
                );
                return Err(gst::FlowError::NotNegotiated);
            };
            let live = rt.live_latency.is_some();
            (rt.shared.clone(), rt.started, live, format)
        };
        let mut notices: Vec<Notice> = Vec::new();
        let mut inner = shared.lock();
        loop {
            // The clock matters only to a live output.
            let now = match live {
                true => self.running_time(started),
                false => gst::ClockTime::ZERO,
            };
            let step = inner.next_step(now, &mut notices);
            let timeout = match step {
                Step::Wait { until } => {
                    until.map(|t| Duration::from_nanos(t.saturating_sub(now).nseconds()))
                }
                step => {
                    drop(inner);
                    shared.notify();
                    self.post_notices(&mut notices);
                    return match step {
                        Step::Buffer(b) => Ok(CreateSuccess::NewBuffer(b.to_buffer(format)?)),
                        Step::Eos => {
                            gst::debug!(CAT, imp = self, "all text spoken or an EOS event: EOS");
                            Err(gst::FlowError::Eos)
                        }
                        Step::Failed(what) => {
                            gst::element_imp_error!(
                                self,
                                gst::StreamError::Failed,
                                ("the synthesis worker failed: {}", what)
                            );
                            Err(gst::FlowError::Error)
                        }
                        Step::Flushing | Step::Wait { .. } => Err(gst::FlowError::Flushing),
                    };
                }
            };
            // Messages first, never under the lock; then ask again, as they may take a while.
            if !notices.is_empty() {
                drop(inner);
                self.post_notices(&mut notices);
                inner = shared.lock();
                continue;
            }
            inner = shared.wait(inner, timeout);
        }
    }
}
