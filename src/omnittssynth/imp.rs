//! GObject/GStreamer implementation of `omnittssynth` (see the module docs in `mod.rs`): the pads,
//! the properties, the events and queries (`input-mode=fragments`: the fragments fed to an open
//! utterance as they arrive), and the start/stop of the engine, the synthesis workers and the
//! output task.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use gst::glib;
use gst::prelude::*;
use gst::subclass::prelude::*;

use crate::element_common::audio::{self, pos_of, pts_of};
use crate::element_common::backend::{Requests, text_stream_mode};
use crate::element_common::input_error::{input_error, quoted};
use crate::element_common::load::{Loaded, load, sharing};
use crate::element_common::messages::{self, count_of};
use crate::element_common::progress;
use crate::element_common::properties::{
    model_info_param_specs, model_info_property, refuse_ready_only, synthesis_param_specs,
};
use crate::element_common::request::{ModelInfo, build_request, validated};
use crate::element_common::settings::SynthesisSettings;
use crate::element_common::split_policy::{
    AutoSplit, SplitSentences, naming_the_split, split_sentences_param_spec, streaming_prompt_hint,
};
use crate::element_common::text_checks::{
    language_warning, markup_warning, strip_markup_tags, text_warnings,
};
use crate::element_common::voice_clone::VoiceCloner;
use crate::element_common::voice_warnings::WarnOnce;
use crate::engine::SharedEngine;
use crate::models::tts::text::unspeakable;

use super::CAT;
use super::compress::{self, Squeeze};
use super::cue_text::{TextFormat, cue_text};
use super::fragment_text::{FragmentText, Pushed};
use super::fragments::{DEFAULT_PAUSE_MS, END_TEXT_EVENT, Fragments, InputMode, OpenCue};
use super::output::{Output, negotiate};
use super::overflow::Overflow;
use super::shared::{CueInfo, Inner, Job, Shared};
use super::synthesis::spawn_workers;
use super::timeline::{CueKind, CueStart, MAX_QUEUED_CUES};
use super::voice::{SPEAKER_CHANGE_EVENT, SpeakerMap, VOICE_EVENT, VoiceChange, speaker_label};

/// A cue this many seconds after the input before it (the latest PTS or GAP end), or with a
/// slot this long, gets a warning (its timestamps are most likely wrong).
const FAR_AHEAD_S: u64 = 3600;

const DEFAULT_LATENCY_MS: u32 = 1000;
const DEFAULT_OVERFLOW: Overflow = Overflow::Clip;

/// Property values.
#[derive(Debug, Clone)]
struct Settings {
    synthesis: SynthesisSettings,
    overflow: Overflow,
    max_compression: f64,
    latency_ms: u32,
    speaker_map: Option<gst::Structure>,
    split_sentences: SplitSentences,
    input_mode: InputMode,
    fragment_pause_ms: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            synthesis: SynthesisSettings::default(),
            overflow: DEFAULT_OVERFLOW,
            max_compression: compress::DEFAULT_FACTOR,
            latency_ms: DEFAULT_LATENCY_MS,
            speaker_map: None,
            split_sentences: SplitSentences::default(),
            input_mode: InputMode::default(),
            fragment_pause_ms: DEFAULT_PAUSE_MS,
        }
    }
}

/// Exists from READY→PAUSED to PAUSED→READY.
struct Runtime {
    engine: Arc<SharedEngine>,
    info: ModelInfo,
    speaker_map: SpeakerMap,
    workers: Vec<std::thread::JoinHandle<()>>,
    policy: Overflow,
    /// When `split-sentences=auto` splits a cue, for the loaded checkpoint.
    auto_split: AutoSplit,
    /// The voice warnings posted since start (omnittssrc's: `instruct` ignored or missing).
    warned: WarnOnce,
    /// `input-mode=fragments`: builds the open utterances' requests.
    requests: Arc<Requests>,
    /// What the checkpoint says of its streaming prompt mode (`streaming_prompt` in its
    /// `omnitts.json`): clause mode for fragments when false.
    streaming_prompt: Option<bool>,
}

/// The element's instance data (lock order: settings, runtime, then the shared state).
pub struct OmniTtsSynth {
    sinkpad: gst::Pad,
    srcpad: gst::Pad,
    settings: Mutex<Settings>,
    runtime: Mutex<Option<Runtime>>,
    shared: Arc<Shared>,
    /// `input-mode=fragments`: the fragments of the utterance in progress (streaming thread;
    /// a flush empties it).
    fragments: Mutex<Fragments>,
    /// The loaded model's sample rate, Hz (0 before start: [`audio::DEFAULT_RATE`] stands in).
    rate: AtomicU32,
    /// A SEGMENT was refused and said so: the pad offers a sticky event again before every
    /// buffer, and the error is posted once (until a segment is taken, or the element stops).
    segment_refused: AtomicBool,
    /// Caps were refused (text caps the element does not speak, or audio caps downstream does
    /// not take) and said so: the sticky CAPS event is offered again before every later event
    /// and buffer, and the error is posted once (until caps are taken, or the element stops).
    caps_refused: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops the fragments of the utterance in progress (flush, stop): its open text ends, so that
/// nothing waits for more of it.
fn drop_fragments(fragments: &Mutex<Fragments>) {
    let f = std::mem::take(&mut *lock(fragments));
    if let Some(cue) = f.open {
        cue.open.end();
    }
}

/// The sink pad's caps: timed UTF-8 text, plain or pango markup (what subparse emits).
fn sink_caps() -> gst::Caps {
    gst::Caps::builder("text/x-raw")
        .field("format", gst::List::new(["utf8", "pango-markup"]))
        .build()
}

#[glib::object_subclass]
impl ObjectSubclass for OmniTtsSynth {
    const NAME: &'static str = "GstOmniTtsSynth";
    type Type = super::OmniTtsSynth;
    type ParentType = gst::Element;

    fn with_class(klass: &Self::Class) -> Self {
        let templ = klass.pad_template("sink").expect("sink template");
        let sinkpad = gst::Pad::builder_from_template(&templ)
            .chain_function(|pad, parent, buffer| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || Err(gst::FlowError::Error),
                    |imp| imp.sink_chain(pad, buffer),
                )
            })
            .event_function(|pad, parent, event| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || false,
                    |imp| imp.sink_event(pad, event),
                )
            })
            .query_function(|pad, parent, query| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || false,
                    |imp| imp.sink_query(pad, query),
                )
            })
            .build();
        let templ = klass.pad_template("src").expect("src template");
        let srcpad = gst::Pad::builder_from_template(&templ)
            .query_function(|pad, parent, query| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || false,
                    |imp| imp.src_query(pad, query),
                )
            })
            .event_function(|pad, parent, event| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || false,
                    |imp| imp.src_event(pad, event),
                )
            })
            .activatemode_function(|pad, parent, mode, active| {
                OmniTtsSynth::catch_panic_pad_function(
                    parent,
                    || Err(gst::loggable_error!(CAT, "panic in activate")),
                    |imp| imp.src_activatemode(pad, mode, active),
                )
            })
            .flags(gst::PadFlags::FIXED_CAPS)
            .build();
        OmniTtsSynth {
            sinkpad,
            srcpad,
            settings: Mutex::new(Settings::default()),
            runtime: Mutex::new(None),
            shared: Arc::new(Shared::new(DEFAULT_OVERFLOW)),
            fragments: Mutex::new(Fragments::default()),
            rate: AtomicU32::new(0),
            segment_refused: AtomicBool::new(false),
            caps_refused: AtomicBool::new(false),
        }
    }
}

impl OmniTtsSynth {
    /// The loaded model's sample rate, Hz ([`audio::DEFAULT_RATE`] before start).
    fn rate(&self) -> u32 {
        match self.rate.load(Ordering::Relaxed) {
            0 => audio::DEFAULT_RATE,
            r => r,
        }
    }

    fn element(&self) -> gst::Element {
        self.obj().clone().upcast()
    }

    fn policy(&self) -> Overflow {
        lock(&self.runtime)
            .as_ref()
            .map_or(DEFAULT_OVERFLOW, |rt| rt.policy)
    }

    /// Upstream's LATENCY answer (asked once per stream, and again for every downstream query).
    fn upstream_latency(&self) -> Option<(bool, gst::ClockTime, Option<gst::ClockTime>)> {
        let mut q = gst::query::Latency::new();
        let answer = self.sinkpad.peer_query(&mut q).then(|| q.result());
        self.shared.lock().upstream_latency = answer;
        gst::debug!(CAT, imp = self, "upstream latency: {answer:?}");
        answer
    }

    /// Loads the engine (or joins the one loaded for the same checkpoint) and starts the workers.
    fn start(&self) -> Result<(), gst::ErrorMessage> {
        let settings = lock(&self.settings).clone();
        let element = self.element();
        let model = &settings.synthesis.model;
        progress::post_start(&element, "load", &format!("loading model {model}"));
        let t0 = Instant::now();
        let Loaded {
            engine,
            info,
            mut cloner,
        } = load(&element, *CAT, &settings.synthesis, false).inspect_err(|_| {
            progress::post_error(&element, "load", "model loading failed");
        })?;
        let speaker_map = SpeakerMap::parse(settings.speaker_map.as_deref(), &info.description)
            .map_err(|e| e.to_error_msg())?;
        for (label, voice) in speaker_map.entries() {
            let entry_error = |e: &dyn std::fmt::Display| {
                input_error("speaker-map", label, format!("{voice}: {e}"))
            };
            let (_, clone) = build_request(&voice.apply(&settings.synthesis), &info, "probe")
                .map_err(|e| entry_error(&e).to_error_msg())?;
            // A cloned voice's reference is decoded and encoded now, as the properties' is:
            // a bad one fails the state change (and its prompt is cached for the cues).
            if let Some(spec) = clone {
                cloner
                    .prompt(&engine, &spec)
                    .map_err(|e| entry_error(&e).to_error_msg())?;
            }
        }
        let auto_split = AutoSplit::for_checkpoint(
            &info.dir,
            info.base_sampling.max_new_tokens,
            info.description.frame_rate(),
        )
        .map_err(|e| gst::error_msg!(gst::ResourceError::Settings, ("model '{}': {}", model, e)))?
        .keeping_turns(info.description.speaker_turn_tag);
        let streaming_prompt = streaming_prompt_hint(&info.dir).map_err(|e| {
            gst::error_msg!(gst::ResourceError::Settings, ("model '{}': {}", model, e))
        })?;
        let requests = Arc::new(Requests::Local {
            engine: engine.clone(),
            cloner: std::sync::Mutex::new(VoiceCloner::new(info.description.reference.clone())),
        });
        let policy = settings.overflow;
        self.rate
            .store(info.description.sample_rate, Ordering::Relaxed);
        *self.shared.lock() = Inner::new(policy);
        let workers = spawn_workers(engine.clone(), cloner, self.shared.clone()).map_err(|e| {
            gst::error_msg!(
                gst::ResourceError::Failed,
                ("could not start the synthesis threads: {}", e)
            )
        })?;
        let ready = format!(
            "omnittssynth: model '{}' ready ({}; {}; {}; {}; ready in {:.0} ms; \
             overflow {}, latency {} ms)",
            model,
            info.dir.display(),
            info.description.name,
            count_of(info.description.speakers.len(), "preset speaker"),
            sharing(&engine, settings.synthesis.shared_engine),
            t0.elapsed().as_secs_f64() * 1000.0,
            policy.nick(),
            settings.latency_ms
        );
        gst::info!(CAT, imp = self, "{ready}");
        *lock(&self.runtime) = Some(Runtime {
            engine,
            info,
            speaker_map,
            workers,
            policy,
            auto_split,
            warned: WarnOnce::default(),
            requests,
            streaming_prompt,
        });
        progress::post_complete(&element, "load", &ready);
        Ok(())
    }

    /// Stops the workers (cancelling what they synthesise) and lets go of the engine.
    fn stop(&self) {
        self.segment_refused.store(false, Ordering::Relaxed);
        self.caps_refused.store(false, Ordering::Relaxed);
        let policy = self.policy();
        drop_fragments(&self.fragments);
        {
            let mut inner = self.shared.lock();
            inner.shutdown = true;
            inner.flushing = true;
            inner.reset(policy);
            self.shared.cond.notify_all();
        }
        let rt = lock(&self.runtime).take();
        if let Some(rt) = rt {
            for w in rt.workers {
                if w.join().is_err() {
                    gst::warning!(CAT, imp = self, "a synthesis thread panicked");
                }
            }
            drop(rt.engine);
            gst::debug!(CAT, imp = self, "stopped: workers joined, engine released");
        }
    }

    fn src_activatemode(
        &self,
        pad: &gst::Pad,
        mode: gst::PadMode,
        active: bool,
    ) -> Result<(), gst::LoggableError> {
        if mode != gst::PadMode::Push {
            return Err(gst::loggable_error!(
                CAT,
                "the source pad works in push mode only"
            ));
        }
        if !active {
            {
                let mut inner = self.shared.lock();
                inner.flushing = true;
                self.shared.cond.notify_all();
            }
            pad.stop_task()
                .map_err(|e| gst::loggable_error!(CAT, "could not stop the task: {e}"))?;
        } else {
            self.shared.lock().flushing = false;
        }
        Ok(())
    }

    /// The source pad task's fixed parameters, from the settings and the loaded model.
    fn output(&self) -> Output {
        let (latency, samples_per_frame, fragments) = {
            let s = lock(&self.settings);
            let rt = lock(&self.runtime);
            let spf = rt.as_ref().map_or(1920, |rt| rt.info.samples_per_frame);
            (
                gst::ClockTime::from_mseconds(s.latency_ms as u64),
                spf,
                s.input_mode == InputMode::Fragments,
            )
        };
        Output {
            shared: self.shared.clone(),
            srcpad: self.srcpad.clone(),
            element: self.obj().upcast_ref::<gst::Element>().downgrade(),
            latency,
            policy: self.policy(),
            samples_per_frame,
            rate: self.rate(),
            fragments,
        }
    }

    fn start_task(&self) -> bool {
        let output = self.output();
        match self.srcpad.start_task(move || output.step()) {
            Ok(()) => true,
            Err(e) => {
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Failed,
                    ("could not start the output task: {}", e)
                );
                false
            }
        }
    }

    fn sink_query(&self, pad: &gst::Pad, query: &mut gst::QueryRef) -> bool {
        if let gst::QueryViewMut::AcceptCaps(q) = query.view_mut() {
            let caps = q.caps_owned();
            let ok = caps.is_subset(&sink_caps());
            if !ok && caps.is_fixed() {
                self.refuse_once(&self.caps_refused, || {
                    gst::element_imp_error!(
                        self,
                        gst::CoreError::Negotiation,
                        (
                            "text caps '{}' are not supported: omnittssynth speaks text/x-raw \
                             with format utf8 or pango-markup (timed text, e.g. from subparse)",
                            caps
                        )
                    );
                });
            }
            q.set_result(ok);
            return true;
        }
        gst::Pad::query_default(pad, Some(&*self.obj()), query)
    }

    /// Upstream events from downstream: a seek at a rate other than 1.0 is refused here (the
    /// element speaks at rate 1.0 only; passed on, it would come back as a segment the element
    /// must refuse with an error); the rest go upstream.
    fn src_event(&self, pad: &gst::Pad, event: gst::Event) -> bool {
        if let gst::EventView::Seek(seek) = event.view() {
            let (rate, ..) = seek.get();
            if rate != 1.0 {
                gst::warning!(
                    CAT,
                    imp = self,
                    "seek at rate {rate} refused: omnittssynth speaks at rate 1.0 only"
                );
                return false;
            }
        }
        gst::Pad::event_default(pad, Some(&*self.obj()), event)
    }

    fn src_query(&self, pad: &gst::Pad, query: &mut gst::QueryRef) -> bool {
        match query.view_mut() {
            gst::QueryViewMut::Latency(q) => {
                let Some((live, min, max)) = self.upstream_latency() else {
                    return false;
                };
                if live {
                    let ours =
                        gst::ClockTime::from_mseconds(lock(&self.settings).latency_ms as u64);
                    // Max: the element is a queue between its pads (the sink pad takes cues
                    // whatever their time, the output task holds them and their audio for as
                    // long as the pipeline latency asks), so it can wait any latency: none. The
                    // upstream max plus ours (often min + ours exactly, as appsrc answers max 0)
                    // would leave the sink no room for its processing deadline ("please add
                    // queues").
                    gst::debug!(
                        CAT,
                        imp = self,
                        "latency: upstream {min} (max {max:?}) + ours {ours}, max none"
                    );
                    q.set(true, min + ours, gst::ClockTime::NONE);
                } else {
                    q.set(false, min, max);
                }
                true
            }
            gst::QueryViewMut::Position(q) if q.format() == gst::Format::Time => {
                let inner = self.shared.lock();
                let seg = &inner.segment;
                let pos = seg.start().unwrap_or(gst::ClockTime::ZERO)
                    + pts_of(inner.timeline.position(), self.rate());
                q.set(seg.to_stream_time(pos));
                true
            }
            _ => gst::Pad::query_default(pad, Some(&*self.obj()), query),
        }
    }

    /// A sticky event (CAPS, SEGMENT) is refused: `post` posts the error the first time only,
    /// as `refused` records (the pad offers the event again before every later event and
    /// buffer). Returns false (not accepted).
    fn refuse_once(&self, refused: &AtomicBool, post: impl FnOnce()) -> bool {
        if !refused.swap(true, Ordering::Relaxed) {
            post();
        } else {
            gst::debug!(CAT, imp = self, "refused again (error already posted)");
        }
        false
    }

    /// Checks the text caps and sets the output caps (F32LE or S16LE as downstream prefers).
    fn set_caps(&self, caps: &gst::CapsRef) -> bool {
        let format = caps
            .structure(0)
            .filter(|s| s.name() == "text/x-raw")
            .and_then(|s| s.get::<&str>("format").ok())
            .and_then(TextFormat::from_caps_format);
        let Some(format) = format else {
            return self.refuse_once(&self.caps_refused, || {
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    (
                        "text caps '{}' are not supported: omnittssynth speaks text/x-raw with \
                         format utf8 or pango-markup",
                        caps
                    )
                );
            });
        };
        self.shared.lock().text_format = Some(format);
        if self.shared.lock().format.is_some() {
            self.caps_refused.store(false, Ordering::Relaxed);
            return true;
        }
        self.negotiate_output()
    }

    /// Negotiates the output caps with downstream and pushes them (later, the output task
    /// negotiates again when downstream asks); one error when downstream takes none of them.
    fn negotiate_output(&self) -> bool {
        match negotiate(&self.srcpad, self.rate()) {
            Ok((caps, format)) => {
                gst::debug!(CAT, imp = self, "output caps {caps}");
                self.caps_refused.store(false, Ordering::Relaxed);
                self.shared.lock().format = Some(format);
                self.srcpad.push_event(gst::event::Caps::new(&caps))
            }
            Err(why) => self.refuse_once(&self.caps_refused, || {
                gst::element_imp_error!(self, gst::CoreError::Negotiation, ("{}", why));
            }),
        }
    }

    /// An EOS before any segment (no cue came: an empty subtitle file, or an EOS right after
    /// the start): the output starts as upstream's default TIME segment would start it, after a
    /// stream-start of its own when upstream sent none, so that downstream gets what a source
    /// sends before its end (stream-start, caps, a segment, and from the output task an empty
    /// buffer: `wavenc` writes a valid empty WAV). Not after a refused CAPS or SEGMENT, whose
    /// error is posted.
    fn start_empty_stream(&self) {
        if self.caps_refused.load(Ordering::Relaxed) || self.segment_refused.load(Ordering::Relaxed)
        {
            return;
        }
        if self
            .srcpad
            .sticky_event::<gst::event::StreamStart>(0)
            .is_none()
        {
            let id = self.srcpad.create_stream_id(&*self.obj(), None::<&str>);
            self.srcpad.push_event(gst::event::StreamStart::new(&id));
        }
        if self.shared.lock().format.is_none() && !self.negotiate_output() {
            return;
        }
        let segment = gst::FormattedSegment::<gst::ClockTime>::new();
        self.set_segment(&gst::event::Segment::new(&segment), segment.upcast_ref());
    }

    /// A SEGMENT: TIME at rate 1 only. The first one starts the output; a later one (no flush)
    /// waits for the output of the cues before it, then starts a new timeline.
    fn set_segment(&self, event: &gst::Event, segment: &gst::Segment) -> bool {
        let refuse = |why: String| {
            self.refuse_once(&self.segment_refused, || {
                gst::element_imp_error!(self, gst::StreamError::Format, ("{}", why));
            })
        };
        let Some(seg) = segment.downcast_ref::<gst::ClockTime>() else {
            return refuse(format!(
                "segment format {:?}: omnittssynth needs timed text (a TIME segment); a \
                 subtitle file goes through subparse first (filesrc ! subparse ! omnittssynth)",
                segment.format()
            ));
        };
        if seg.rate() != 1.0 {
            return refuse(format!(
                "segment rate {}: omnittssynth speaks at rate 1.0 only",
                seg.rate()
            ));
        }
        self.segment_refused.store(false, Ordering::Relaxed);
        let mut out = seg.clone();
        out.set_stop(gst::ClockTime::NONE);
        if self.shared.lock().upstream_latency.is_none() {
            self.upstream_latency();
        }
        // Fragments: an utterance still open ends with its segment, as at EOS (the new segment
        // waits for the current one's cues to be over).
        {
            let mut f = lock(&self.fragments);
            let done = std::mem::take(&mut *f);
            let _ = self.end_fragments(done, "a new segment");
        }
        let mut inner = self.shared.lock();
        if !inner.have_segment {
            inner.have_segment = true;
            inner.segment = out.clone();
            inner.segment_stop = seg.stop();
            drop(inner);
            let seqnum = event.seqnum();
            self.srcpad
                .push_event(gst::event::Segment::builder(&out).seqnum(seqnum).build());
            return self.start_task();
        }
        gst::debug!(
            CAT,
            imp = self,
            "new segment {out:?}: draining the current one"
        );
        inner.next_segment = Some(out);
        inner.timeline.end();
        self.shared.cond.notify_all();
        while inner.next_segment.is_some() && !inner.flushing && inner.flow.is_ok() {
            inner = self.shared.wait(inner, None);
        }
        // The cues after this event are the new segment's.
        inner.segment_stop = seg.stop();
        true
    }

    /// A cue's slot on the timeline, samples: its text buffer's duration. A duration of less
    /// than one sample (zero) is no slot: the cue is spoken as one without duration, whole.
    fn slot(&self, duration: Option<gst::ClockTime>) -> Option<u64> {
        duration
            .map(|d| pos_of(d, self.rate()))
            .filter(|&samples| samples > 0)
    }

    /// Where a text buffer's PTS is on the timeline (a buffer without PTS: as soon as possible).
    fn cue_start(&self, inner: &Inner, pts: Option<gst::ClockTime>) -> CueStart {
        let start = inner.segment.start().unwrap_or(gst::ClockTime::ZERO);
        match pts {
            Some(p) => CueStart::At(pos_of(p.saturating_sub(start), self.rate())),
            None => {
                // Live: not before the running time it arrived at.
                let now = match inner.upstream_latency {
                    Some((true, upstream, _)) => self
                        .obj()
                        .current_running_time()
                        .and_then(|rt| {
                            inner
                                .segment
                                .position_from_running_time(rt.saturating_sub(upstream))
                        })
                        .map_or(0, |p| pos_of(p.saturating_sub(start), self.rate())),
                    _ => 0,
                };
                CueStart::Asap(inner.timeline.horizon().max(now))
            }
        }
    }

    /// What a cue with `text` (or unreadable bytes) holds, and its request.
    fn cue_kind(
        &self,
        id: u64,
        text: &Result<String, String>,
        pts: Option<gst::ClockTime>,
        slot: Option<u64>,
        voice: &VoiceChange,
        live: bool,
    ) -> Result<(CueKind, Option<Job>), gst::FlowError> {
        let at = pts.display();
        let text = match text {
            Err(why) => {
                return Ok((
                    CueKind::Refused(format!("cue {id} (PTS {at}): {why}")),
                    None,
                ));
            }
            Ok(t) if unspeakable(t).is_some() => return Ok((CueKind::Silent, None)),
            Ok(t) => t,
        };
        let (settings, max_compression, split) = {
            let s = lock(&self.settings);
            (
                voice.apply(&s.synthesis),
                s.max_compression,
                s.split_sentences,
            )
        };
        let rt = lock(&self.runtime);
        let Some(rt) = rt.as_ref() else {
            return Err(gst::FlowError::Flushing);
        };
        let squeeze = slot
            .filter(|_| rt.policy == Overflow::Compress)
            .map(|slot| Squeeze {
                slot,
                max: max_compression,
                rate: rt.info.description.sample_rate,
            });
        for w in rt.warned.new_warnings(&settings, &rt.info) {
            gst::element_imp_warning!(self, gst::ResourceError::Settings, ("{}", w));
        }
        let long = rt.auto_split.long_sentence_warning(split, text);
        for w in text_warnings(text, &rt.info.description).chain(long) {
            gst::element_imp_warning!(self, gst::StreamError::Format, ("cue {}: {}", id, w));
        }
        // A long cue is spoken sentence by sentence (`split-sentences`), back to back, as that
        // cue's audio.
        let mut requests = Vec::new();
        let mut clone = None;
        let pieces = rt.auto_split.pieces(split, text);
        let whole = pieces.len() == 1;
        for piece in pieces {
            // Without a reference to encode first, the engine's checks too (a text too long for
            // one utterance among them); a cloned voice's request is checked when it is
            // submitted, with its reference.
            let checked = build_request(&settings, &rt.info, &piece).and_then(|(request, c)| {
                if c.is_none() {
                    validated(&rt.engine, &request)?;
                }
                Ok((request, c))
            });
            match checked {
                Ok((mut request, c)) => {
                    if live && settings.chunk_frames == 0 {
                        // Live: later chunks as small as the first, so audio keeps pace.
                        request.chunk_frames = Some(rt.info.first_chunk_frames);
                    }
                    requests.push(request);
                    clone = c;
                }
                Err(e) => {
                    let e = naming_the_split(e, split, whole);
                    return Ok((CueKind::Refused(format!("cue {id} (PTS {at}): {e}")), None));
                }
            }
        }
        if requests.len() > 1 {
            gst::debug!(CAT, imp = self, "cue {id}: {} sentences", requests.len());
        }
        let job = Job {
            id,
            epoch: 0,
            requests,
            clone,
            squeeze,
            open: None,
        };
        Ok((CueKind::Speech, Some(job)))
    }

    fn sink_chain(
        &self,
        _pad: &gst::Pad,
        buffer: gst::Buffer,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let (input_mode, pause) = {
            let s = lock(&self.settings);
            (
                s.input_mode,
                gst::ClockTime::from_mseconds(s.fragment_pause_ms.into()),
            )
        };
        if input_mode == InputMode::Fragments {
            let format = self.text_format()?;
            let map = buffer.map_readable().map_err(|_| {
                gst::element_imp_error!(
                    self,
                    gst::StreamError::Decode,
                    ("a text fragment could not be read")
                );
                gst::FlowError::Error
            })?;
            let mut f = lock(&self.fragments);
            if f.paused_at(buffer.pts(), pause) {
                let done = std::mem::take(&mut *f);
                self.end_fragments(done, "a sentence end and a pause")?;
            }
            f.push(map.as_slice(), buffer.pts());
            let pushed = f
                .text
                .get_or_insert_with(|| FragmentText::new(format))
                .push(map.as_slice());
            self.feed_fragments(&mut f, pushed)?;
            if buffer.flags().contains(gst::BufferFlags::MARKER) {
                let done = std::mem::take(&mut *f);
                return self.end_fragments(done, "a fragment with the MARKER flag");
            }
            return Ok(gst::FlowSuccess::Ok);
        }
        if let Some(outside) = self.outside_segment(buffer.pts(), buffer.duration()) {
            gst::debug!(CAT, imp = self, "cue dropped: {outside}");
            return Ok(gst::FlowSuccess::Ok);
        }
        let (pts, duration) = self.clip_to_segment_start(buffer.pts(), buffer.duration());
        self.push_cue(
            |format| match buffer.map_readable() {
                Ok(map) => cue_text(map.as_slice(), format),
                Err(_) => Err("the buffer could not be read".to_string()),
            },
            pts,
            duration,
        )
    }

    /// A cue that straddles the segment's start keeps the part of its slot inside the segment, as
    /// GStreamer clips a buffer's start to its segment: it starts at the segment's start, its
    /// duration shortened by as much (a cue without duration just starts there).
    fn clip_to_segment_start(
        &self,
        pts: Option<gst::ClockTime>,
        duration: Option<gst::ClockTime>,
    ) -> (Option<gst::ClockTime>, Option<gst::ClockTime>) {
        let start = self.shared.lock().segment.start();
        match (pts, start) {
            (Some(p), Some(s)) if p < s => (Some(s), duration.map(|d| d.saturating_sub(s - p))),
            _ => (pts, duration),
        }
    }

    /// Why a cue at `pts` lasting `duration` is wholly outside the segment (it ends at or before
    /// its start, or starts at or after its stop): such a cue is
    /// dropped, as GStreamer clips buffers to their segment. `None` for a cue that is in it,
    /// straddles the start (it is spoken from there, in the rest of its slot:
    /// [`Self::clip_to_segment_start`]) or the stop (it keeps its slot: the output runs on past
    /// the stop), or has no PTS; a cue without duration is outside only past the stop.
    fn outside_segment(
        &self,
        pts: Option<gst::ClockTime>,
        duration: Option<gst::ClockTime>,
    ) -> Option<String> {
        let pts = pts?;
        let inner = self.shared.lock();
        let seg = &inner.segment;
        if let (Some(d), Some(start)) = (duration, seg.start())
            && pts.saturating_add(d) <= start
            && d > gst::ClockTime::ZERO
        {
            return Some(format!(
                "PTS {pts} + {d} ends before the segment start {start}"
            ));
        }
        match inner.segment_stop {
            Some(stop) if pts >= stop => {
                Some(format!("PTS {pts} is at or past the segment stop {stop}"))
            }
            _ => None,
        }
    }

    /// The sink caps' text format; without caps, an error (not negotiated).
    fn text_format(&self) -> Result<TextFormat, gst::FlowError> {
        let inner = self.shared.lock();
        inner.flow?;
        if inner.flushing {
            return Err(gst::FlowError::Flushing);
        }
        match inner.text_format {
            Some(format) => Ok(format),
            None => {
                drop(inner);
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    ("text buffer without caps: omnittssynth takes text/x-raw (put subparse \
                      between a subtitle file and it)")
                );
                Err(gst::FlowError::NotNegotiated)
            }
        }
    }

    /// `input-mode=fragments`: the text that a fragment made final (`pushed`) goes to the
    /// utterance of `f`, which opens once its text has something to speak; bytes that are not
    /// UTF-8 are dropped with a warning.
    fn feed_fragments(&self, f: &mut Fragments, pushed: Pushed) -> Result<(), gst::FlowError> {
        if let Some((byte, at)) = pushed.invalid {
            gst::element_imp_warning!(
                self,
                gst::StreamError::Format,
                (
                    "utterance from PTS {}: the text is not UTF-8: byte 0x{:02x} at offset {} \
                     dropped (text/x-raw carries UTF-8)",
                    f.pts.display(),
                    byte,
                    at
                )
            );
        }
        f.pending.push_str(&pushed.text);
        if f.refused {
            f.pending.clear();
            return Ok(());
        }
        if f.pending.is_empty() || (f.open.is_none() && unspeakable(&f.pending).is_some()) {
            return Ok(());
        }
        let text = std::mem::take(&mut f.pending);
        match &f.open {
            Some(cue) => {
                let taken = cue.open.append(&text);
                {
                    let mut inner = self.shared.lock();
                    if let Some(info) = inner.infos.get_mut(&cue.id) {
                        info.text = cue.open.text();
                    }
                }
                if !taken && !f.unspoken {
                    gst::element_imp_warning!(
                        self,
                        gst::StreamError::Format,
                        (
                            "cue {} (PTS {}): its synthesis ended (the model's end of speech, \
                             max-new-tokens or an error) before its text did: the text from '{}' \
                             on is not spoken",
                            cue.id,
                            f.pts.display(),
                            quoted(text.trim())
                        )
                    );
                    f.unspoken = true;
                }
            }
            None => match self.open_cue(f.pts, &text)? {
                Some(cue) => f.open = Some(cue),
                None => f.refused = true,
            },
        }
        Ok(())
    }

    /// `input-mode=fragments`: opens the utterance that starts with `text` (the first with
    /// something to speak) as a cue at `pts`, its synthesis started at once (token or clause
    /// mode, posted in an `omnitts/text-stream-mode` message). `None`: its voice or sampling
    /// was refused (the error is on the timeline, at its place).
    fn open_cue(
        &self,
        pts: Option<gst::ClockTime>,
        text: &str,
    ) -> Result<Option<OpenCue>, gst::FlowError> {
        let (id, voice, live, epoch) = {
            let mut inner = self.shared.lock();
            inner.flow?;
            if inner.flushing {
                return Err(gst::FlowError::Flushing);
            }
            let id = inner.next_id;
            inner.next_id += 1;
            let live = inner.upstream_latency.is_some_and(|(l, _, _)| l);
            (id, inner.voice.clone(), live, inner.epoch)
        };
        let mut settings = voice.apply(&lock(&self.settings).synthesis);
        let (requests, info, hint) = {
            let rt = lock(&self.runtime);
            let Some(rt) = rt.as_ref() else {
                return Err(gst::FlowError::Flushing);
            };
            for w in rt.warned.new_warnings(&settings, &rt.info) {
                gst::element_imp_warning!(self, gst::ResourceError::Settings, ("{}", w));
            }
            (rt.requests.clone(), rt.info.clone(), rt.streaming_prompt)
        };
        if live && settings.chunk_frames == 0 {
            // Live: later chunks as small as the first, so audio keeps pace.
            settings.chunk_frames = info.first_chunk_frames as u32;
        }
        let (mode, why) =
            text_stream_mode(&info.description, settings.prompt_mode.prompt_mode(), hint);
        let at = pts.display();
        let (kind, job, cue) = match requests.checked_open(&settings, &info, mode) {
            Ok((request, open)) => {
                open.append(text);
                let job = Job {
                    id,
                    epoch,
                    requests: Vec::new(),
                    clone: None,
                    squeeze: None,
                    open: Some(request),
                };
                (CueKind::Speech, Some(job), Some(OpenCue { id, open }))
            }
            Err(e) => (
                CueKind::Refused(format!("utterance {id} (PTS {at}): {e}")),
                None,
                None,
            ),
        };
        gst::info!(
            CAT,
            imp = self,
            "utterance {id} opens at PTS {at} in {} mode: {why}",
            mode.name()
        );
        self.queue_cue(id, epoch, pts, None, kind, job, text.to_string())?;
        if cue.is_some() {
            let element = self.obj();
            let _ = element.post_message(messages::text_stream_mode(
                element.upcast_ref(),
                id,
                mode.name(),
                &why,
            ));
        }
        Ok(cue)
    }

    /// `input-mode=fragments`: the utterance of fragments `f` ends (`why`, for the debug log):
    /// the rest of its text goes to it and its text ends. One that never opened (nothing to
    /// speak, or only the rest has some) becomes a cue as in cue mode, at its first fragment's
    /// PTS.
    fn end_fragments(
        &self,
        mut f: Fragments,
        why: &str,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        if f.is_empty() {
            return self.shared.lock().flow;
        }
        gst::debug!(
            CAT,
            imp = self,
            "fragments end ({why}): {} bytes from PTS {}",
            f.bytes.len(),
            f.pts.display()
        );
        if let Some(rest) = f.text.as_mut().map(FragmentText::finish) {
            self.feed_fragments(&mut f, rest)?;
        }
        if let Some(cue) = &f.open {
            cue.open.end();
            let text = cue.open.text();
            if let Some(w) = lock(&self.runtime)
                .as_ref()
                .and_then(|rt| language_warning(&text, &rt.info.description.languages))
            {
                gst::element_imp_warning!(
                    self,
                    gst::StreamError::Format,
                    ("cue {}: {}", cue.id, w)
                );
            }
            let mut inner = self.shared.lock();
            if let Some(info) = inner.infos.get_mut(&cue.id) {
                info.text = text;
            }
            return inner.flow;
        }
        if f.refused {
            return self.shared.lock().flow;
        }
        // Never opened: nothing to speak in it (a silent cue, as in cue mode).
        let text = std::mem::take(&mut f.pending);
        self.push_cue(|_| Ok(text), f.pts, None)
    }

    /// Queues a cue: its text (from `read`, given the negotiated text format), PTS and duration.
    fn push_cue(
        &self,
        read: impl FnOnce(TextFormat) -> Result<String, String>,
        pts: Option<gst::ClockTime>,
        duration: Option<gst::ClockTime>,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let (id, format, voice, live, epoch) = {
            let mut inner = self.shared.lock();
            inner.flow?;
            if inner.flushing {
                return Err(gst::FlowError::Flushing);
            }
            let Some(format) = inner.text_format else {
                drop(inner);
                gst::element_imp_error!(
                    self,
                    gst::CoreError::Negotiation,
                    ("text buffer without caps: omnittssynth takes text/x-raw (put subparse \
                      between a subtitle file and it)")
                );
                return Err(gst::FlowError::NotNegotiated);
            };
            let id = inner.next_id;
            inner.next_id += 1;
            let live = inner.upstream_latency.is_some_and(|(l, _, _)| l);
            (id, format, inner.voice.clone(), live, inner.epoch)
        };
        let text = read(format);
        // Plain text with markup the element does not interpret (SSML): the tags go, with a
        // warning (pango markup is stripped by cue_text, as its caps say).
        let text = text.map(|t| match strip_markup_tags(&t) {
            Some((plain, names)) if format == TextFormat::Utf8 => {
                gst::element_imp_warning!(
                    self,
                    gst::StreamError::Format,
                    ("cue {}: {}", id, markup_warning(&t, &names, &plain))
                );
                plain.split_whitespace().collect::<Vec<_>>().join(" ")
            }
            _ => t,
        });
        // A duration that ends past the largest signed timestamp is a negative one read as
        // unsigned (subparse gives an SRT cue that ends before it starts 2^64 ns less the
        // difference): honoured, its slot would be centuries of silence and no EOS.
        // Where a cue without duration starts: under shift, after the speech before it.
        let whole_from = if self.policy() == Overflow::Shift {
            "from its PTS, once the speech before it is over (overflow=shift)"
        } else {
            "from its PTS"
        };
        let duration = match duration {
            Some(d) if ends_past_time(pts, d) => {
                gst::element_imp_warning!(
                    self,
                    gst::StreamError::Format,
                    (
                        "cue {} (PTS {}) has a duration ({}) that ends past the largest \
                         timestamp, most likely an end before its start: it is spoken whole \
                         {}, as a cue without duration",
                        id,
                        pts.display(),
                        d,
                        whole_from
                    )
                );
                None
            }
            d => d,
        };
        let slot = self.slot(duration);
        let (kind, job) = self.cue_kind(id, &text, pts, slot, &voice, live)?;
        if let Some(d) = duration
            && slot.is_none()
            && kind == CueKind::Speech
        {
            // A zero duration (as an SRT cue `00:00:05,000 --> 00:00:05,000` gets from subparse)
            // is no slot to fit speech into: the cue is spoken as one without duration.
            gst::element_imp_warning!(
                self,
                gst::StreamError::Format,
                (
                    "cue {} (PTS {}) has a zero duration ({}): it is spoken whole {}, as a cue \
                     without duration (no slot end, never clipped)",
                    id,
                    pts.display(),
                    d,
                    whole_from
                )
            );
        }
        self.queue_cue(
            id,
            epoch,
            pts,
            duration,
            kind,
            job,
            text.unwrap_or_default(),
        )
    }

    /// Puts cue `id` of `epoch` (its PTS and duration, what it holds, its synthesis job, its
    /// text) on the timeline and its job in the workers' queue; waits while too many cues are
    /// queued ahead of the output.
    #[allow(clippy::too_many_arguments)]
    fn queue_cue(
        &self,
        id: u64,
        epoch: u64,
        pts: Option<gst::ClockTime>,
        duration: Option<gst::ClockTime>,
        kind: CueKind,
        job: Option<Job>,
        text: String,
    ) -> Result<gst::FlowSuccess, gst::FlowError> {
        let slot = self.slot(duration);
        let mut inner = self.shared.lock();
        if inner.epoch != epoch || inner.flushing {
            return Err(gst::FlowError::Flushing);
        }
        let start = self.cue_start(&inner, pts);
        gst::debug!(
            CAT,
            imp = self,
            "cue {id}: {start:?}, slot {slot:?}, {kind:?}: {text:?}"
        );
        // Timestamps an hour or more from the input before them are most likely wrong: the
        // element would output silence all that time, without a word.
        let far = u64::from(self.rate()) * FAR_AHEAD_S;
        let ahead = match start {
            CueStart::At(at) => at.saturating_sub(inner.timeline.horizon()),
            CueStart::Asap(_) => 0,
        };
        let far_warning = (ahead > far || slot.is_some_and(|s| s > far)).then(|| {
            let secs = |samples: u64| pts_of(samples, self.rate());
            format!(
                "cue {} (PTS {}, duration {}) is {} after the input before it and its slot lasts \
                 {}: silence is output until it and to its end; its timestamps may be wrong",
                id,
                pts.display(),
                duration.display(),
                secs(ahead),
                secs(slot.unwrap_or(0))
            )
        });
        inner.timeline.push_cue(id, start, slot, kind);
        inner.infos.insert(
            id,
            CueInfo {
                text,
                pts,
                duration,
                ttfa_ms: None,
                finish: None,
                since: Instant::now(),
            },
        );
        if let Some(mut job) = job {
            job.epoch = epoch;
            inner.jobs.push_back(job);
        }
        self.shared.cond.notify_all();
        if let Some(w) = far_warning {
            // Posted without the lock: a bus handler may call back into the element.
            drop(inner);
            gst::element_imp_warning!(self, gst::StreamError::Format, ("{}", w));
            inner = self.shared.lock();
        }
        // Upstream waits while many cues are queued, unless the output has reached what the
        // input has told: then the next cues may be due there (any number of cues may share a
        // PTS), and the output waits for them.
        while inner.timeline.cues() > MAX_QUEUED_CUES
            && inner.timeline.position() < inner.timeline.horizon()
            && !inner.flushing
            && inner.flow.is_ok()
        {
            inner = self.shared.wait(inner, None);
        }
        if inner.flushing {
            return Err(gst::FlowError::Flushing);
        }
        inner.flow
    }

    /// A voice change from an event: validated now (a voice the checkpoint lacks refuses the
    /// stream at this point of it, after the cues before it).
    fn change_voice(&self, voice: Result<VoiceChange, String>, what: &str) {
        let checked = voice.and_then(|v| {
            let settings = v.apply(&lock(&self.settings).synthesis);
            let rt = lock(&self.runtime);
            match rt.as_ref() {
                Some(rt) => build_request(&settings, &rt.info, "probe")
                    .map(|_| v)
                    .map_err(|e| e.to_string()),
                None => Ok(v),
            }
        });
        let mut inner = self.shared.lock();
        match checked {
            Ok(v) => {
                gst::info!(CAT, imp = self, "{what}: voice now {v}");
                inner.voice = v;
            }
            Err(e) => {
                let id = inner.next_id;
                inner.next_id += 1;
                let at = CueStart::At(inner.timeline.horizon());
                inner
                    .timeline
                    .push_cue(id, at, None, CueKind::Refused(format!("{what}: {e}")));
                self.shared.cond.notify_all();
            }
        }
    }

    fn custom_event(&self, s: &gst::StructureRef) {
        match s.name().as_str() {
            VOICE_EVENT => {
                let mut voice = self.shared.lock().voice.clone();
                let change = VoiceChange::from_structure(s).map(|v| {
                    voice.merge(&v);
                    voice
                });
                self.change_voice(change, &format!("{VOICE_EVENT} event '{s}'"));
            }
            SPEAKER_CHANGE_EVENT => {
                let change = speaker_label(s).map(|label| {
                    let mapped = {
                        let rt = lock(&self.runtime);
                        label
                            .as_deref()
                            .and_then(|l| rt.as_ref().and_then(|rt| rt.speaker_map.get(l)))
                            .cloned()
                    };
                    if mapped.is_none() && label.is_some() {
                        gst::info!(
                            CAT,
                            imp = self,
                            "speaker {label:?} is not in speaker-map: the properties' voice"
                        );
                    }
                    mapped.unwrap_or_default()
                });
                self.change_voice(change, &format!("{SPEAKER_CHANGE_EVENT} event '{s}'"));
            }
            _ => {}
        }
    }

    fn sink_event(&self, pad: &gst::Pad, event: gst::Event) -> bool {
        gst::log!(CAT, obj = pad, "event {event:?}");
        use gst::EventView;
        match event.view() {
            EventView::StreamStart(_) => self.srcpad.push_event(event),
            EventView::Caps(c) => self.set_caps(c.caps()),
            EventView::Segment(s) => self.set_segment(&event, s.segment()),
            EventView::Gap(g) => {
                let (pts, duration) = g.get();
                let pause = lock(&self.settings).fragment_pause_ms;
                let end = pts + duration.unwrap_or(gst::ClockTime::ZERO);
                {
                    let mut f = lock(&self.fragments);
                    if f.paused_at(Some(end), gst::ClockTime::from_mseconds(pause.into())) {
                        let done = std::mem::take(&mut *f);
                        let _ = self.end_fragments(done, "a sentence end and a pause (GAP)");
                    }
                }
                let mut inner = self.shared.lock();
                let start = inner.segment.start().unwrap_or(gst::ClockTime::ZERO);
                let end = (pts + duration.unwrap_or(gst::ClockTime::ZERO)).saturating_sub(start);
                inner.timeline.gap(pos_of(end, self.rate()));
                self.shared.cond.notify_all();
                true
            }
            EventView::Eos(_) => {
                // Fragments: the text so far is spoken before the end.
                {
                    let mut f = lock(&self.fragments);
                    let done = std::mem::take(&mut *f);
                    let _ = self.end_fragments(done, "EOS");
                }
                let stopped = |inner: &Inner| {
                    matches!(
                        inner.flow,
                        Err(e) if e != gst::FlowError::Flushing && e != gst::FlowError::Eos
                    )
                };
                let mut inner = self.shared.lock();
                if !inner.have_segment && !stopped(&inner) {
                    drop(inner);
                    self.start_empty_stream();
                    inner = self.shared.lock();
                }
                // Still without a segment (refused), or after an error stopped the output (a
                // refused cue, downstream's error), EOS goes straight on: an application that
                // answers an error with EOS gets its EOS.
                if !inner.have_segment || stopped(&inner) {
                    drop(inner);
                    return self.srcpad.push_event(event);
                }
                inner.timeline.end();
                self.shared.cond.notify_all();
                true
            }
            EventView::FlushStart(_) => {
                {
                    let mut inner = self.shared.lock();
                    inner.flushing = true;
                    for c in inner.cancellers.values() {
                        c.cancel();
                    }
                    self.shared.cond.notify_all();
                }
                // A flush drops the fragments, as it drops the cues (the open utterance's
                // synthesis was cancelled with them).
                drop_fragments(&self.fragments);
                let ret = self.srcpad.push_event(event);
                let _ = self.srcpad.pause_task();
                ret
            }
            EventView::FlushStop(_) => {
                let policy = self.policy();
                let output = self.output();
                let element = self.obj().upcast_ref::<gst::Element>().clone();
                let mut msgs = Vec::new();
                {
                    let mut inner = self.shared.lock();
                    // The cues that were playing are over: their utterance-done (cancelled)
                    // and cue messages, as for any cue cut short.
                    inner.timeline.flush();
                    output.notices(&element, &mut inner, &mut msgs);
                    inner.reset(policy);
                    inner.flushing = false;
                    self.shared.cond.notify_all();
                }
                Output::post(&element, &mut msgs);
                self.srcpad.push_event(event)
            }
            EventView::CustomDownstream(c) => {
                if let Some(s) = c.structure() {
                    if s.name() == END_TEXT_EVENT {
                        let mut f = lock(&self.fragments);
                        let done = std::mem::take(&mut *f);
                        let _ = self.end_fragments(done, END_TEXT_EVENT);
                    }
                    self.custom_event(s);
                }
                self.queue_event(event);
                true
            }
            _ if event.is_serialized() => {
                self.queue_event(event);
                true
            }
            _ => gst::Pad::event_default(pad, Some(&*self.obj()), event),
        }
    }

    /// Queues a serialized event to go downstream when the output reaches where the input was.
    fn queue_event(&self, event: gst::Event) {
        let mut inner = self.shared.lock();
        let at = inner.timeline.horizon();
        inner.events.push_back((at, event));
        self.shared.cond.notify_all();
    }
}

/// Whether a cue at `pts` (none: 0) lasting `duration` ends past `i64::MAX` ns (292 years), the
/// largest signed timestamp: a negative duration read as unsigned, not a slot.
fn ends_past_time(pts: Option<gst::ClockTime>, duration: gst::ClockTime) -> bool {
    pts.map_or(0, gst::ClockTime::nseconds)
        .checked_add(duration.nseconds())
        .is_none_or(|end| end > i64::MAX as u64)
}

impl ObjectImpl for OmniTtsSynth {
    fn properties() -> &'static [glib::ParamSpec] {
        static PROPERTIES: LazyLock<Vec<glib::ParamSpec>> = LazyLock::new(|| {
            let mut props = synthesis_param_specs();
            props.extend([
                glib::ParamSpecEnum::builder_with_default("overflow", DEFAULT_OVERFLOW)
                    .nick("Overflow")
                    .blurb(
                        "What to do when a cue's speech is longer than its slot (the text \
                         buffer's duration), or live, when its audio is late",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecDouble::builder("max-compression")
                    .nick("Maximum compression")
                    .blurb(
                        "overflow=compress: the most a cue's speech may be sped up (pitch kept) \
                         to fit its slot, as a factor (1.5: 1.5 times as fast); speech that \
                         would need more is compressed by this much and then clipped at its \
                         slot's end",
                    )
                    .minimum(1.0)
                    .maximum(compress::MAX_FACTOR)
                    .default_value(compress::DEFAULT_FACTOR)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("latency")
                    .nick("Latency")
                    .blurb(
                        "Live: milliseconds the element may take from a cue's running time to \
                         its first audio; added to the upstream latency in the LATENCY query. A \
                         cue later than that is handled by the overflow policy, with a warning",
                    )
                    .minimum(20)
                    .maximum(60_000)
                    .default_value(DEFAULT_LATENCY_MS)
                    .mutable_ready()
                    .build(),
                glib::ParamSpecBoxed::builder::<gst::Structure>("speaker-map")
                    .nick("Speaker map")
                    .blurb(
                        "Voices for the speaker labels of rstranscribe/speaker-change events, \
                         e.g. \"map, spk_0=ryan, spk_1=[voice, speaker=aiden, instruct=calm]\": \
                         a string is a preset speaker (CustomVoice), a voice description \
                         (VoiceDesign) or a reference recording (Base, x-vector only); a \
                         structure gives speaker, instruct, language, ref-audio, ref-text, \
                         x-vector-only. Unmapped labels speak with the properties' voice",
                    )
                    .mutable_ready()
                    .build(),
                split_sentences_param_spec(
                    "a synthesis of its own, the sentences of one cue spoken back to back as \
                     that cue's audio (within its slot and overflow policy, one cue message)",
                ),
                glib::ParamSpecEnum::builder_with_default("input-mode", InputMode::default())
                    .nick("Input mode")
                    .blurb(
                        "What a text buffer is: cues (each buffer a cue at its PTS, within its \
                         duration), or fragments of a running utterance (an LLM's reply), \
                         spoken while they arrive (token or clause mode, as append-text) as one \
                         cue at its first fragment's PTS, with no duration, until an end: a \
                         buffer with the MARKER flag, an omnitts/end-text custom downstream \
                         event, a sentence end followed by fragment-pause ms without a fragment \
                         (by PTS, or a GAP event), or EOS",
                    )
                    .mutable_ready()
                    .build(),
                glib::ParamSpecUInt::builder("fragment-pause")
                    .nick("Fragment pause")
                    .blurb(
                        "input-mode=fragments: a gap of at least this many milliseconds of \
                         stream time after a sentence end ends the utterance; the gap is read \
                         from the next fragment's PTS or a GAP event's end, not from the clock \
                         (a stream that just stops sending needs MARKER, end-text or EOS)",
                    )
                    .minimum(1)
                    .maximum(600_000)
                    .default_value(DEFAULT_PAUSE_MS)
                    .mutable_playing()
                    .build(),
            ]);
            props.extend(model_info_param_specs());
            props
        });
        PROPERTIES.as_ref()
    }

    fn set_property(&self, _id: usize, value: &glib::Value, pspec: &glib::ParamSpec) {
        let started = lock(&self.runtime).is_some();
        if refuse_ready_only(&self.element(), pspec, value, started) {
            return;
        }
        let name = pspec.name();
        let mut s = lock(&self.settings);
        gst::debug!(CAT, imp = self, "set {name} = {value:?}");
        match name {
            "overflow" => s.overflow = value.get().expect("type checked upstream"),
            "max-compression" => s.max_compression = value.get().expect("type checked upstream"),
            "latency" => s.latency_ms = value.get().expect("type checked upstream"),
            "speaker-map" => s.speaker_map = value.get().expect("type checked upstream"),
            "split-sentences" => s.split_sentences = value.get().expect("type checked upstream"),
            "input-mode" => s.input_mode = value.get().expect("type checked upstream"),
            "fragment-pause" => s.fragment_pause_ms = value.get().expect("type checked upstream"),
            other => {
                if !s.synthesis.set_property(other, value) {
                    gst::warning!(CAT, imp = self, "unknown property {other}");
                }
            }
        }
    }

    fn property(&self, _id: usize, pspec: &glib::ParamSpec) -> glib::Value {
        // The loaded checkpoint's sampling defaults, read before the settings are locked.
        let loaded = lock(&self.runtime)
            .as_ref()
            .map(|rt| rt.info.base_sampling.clone());
        let s = lock(&self.settings);
        match pspec.name() {
            "overflow" => s.overflow.to_value(),
            "max-compression" => s.max_compression.to_value(),
            "latency" => s.latency_ms.to_value(),
            "speaker-map" => s.speaker_map.to_value(),
            "split-sentences" => s.split_sentences.to_value(),
            "input-mode" => s.input_mode.to_value(),
            "fragment-pause" => s.fragment_pause_ms.to_value(),
            other => {
                if let Some(v) = s.synthesis.property(other, loaded.as_ref()) {
                    return v;
                }
                drop(s);
                let rt = lock(&self.runtime);
                let loaded = rt.as_ref().map(|rt| (&rt.info, Some(&**rt.engine)));
                model_info_property(other, loaded).unwrap_or_else(|| {
                    gst::warning!(CAT, imp = self, "unknown property {other}");
                    pspec.default_value().clone()
                })
            }
        }
    }

    fn constructed(&self) {
        self.parent_constructed();
        let obj = self.obj();
        obj.add_pad(&self.sinkpad).expect("add sink pad");
        obj.add_pad(&self.srcpad).expect("add src pad");
    }
}

impl GstObjectImpl for OmniTtsSynth {}

impl ElementImpl for OmniTtsSynth {
    fn metadata() -> Option<&'static gst::subclass::ElementMetadata> {
        static METADATA: LazyLock<gst::subclass::ElementMetadata> = LazyLock::new(|| {
            gst::subclass::ElementMetadata::new(
                "Timed-text speech synthesizer",
                "Filter/Audio/Text",
                "Speaks timed text (subtitles, captions) with Qwen3-TTS or Fish S2 Pro at each cue's running \
                 time: one continuous mono stream at the model's rate (24 kHz Qwen3-TTS, 44.1 kHz Fish S2 Pro), silence between cues",
                "omnitts developers",
            )
        });
        Some(&*METADATA)
    }

    fn pad_templates() -> &'static [gst::PadTemplate] {
        static PAD_TEMPLATES: LazyLock<Vec<gst::PadTemplate>> = LazyLock::new(|| {
            let sink = gst::PadTemplate::new(
                "sink",
                gst::PadDirection::Sink,
                gst::PadPresence::Always,
                &sink_caps(),
            )
            .expect("static pad template");
            let src = gst::PadTemplate::new(
                "src",
                gst::PadDirection::Src,
                gst::PadPresence::Always,
                &audio::template_caps(),
            )
            .expect("static pad template");
            vec![sink, src]
        });
        PAD_TEMPLATES.as_ref()
    }

    fn change_state(
        &self,
        transition: gst::StateChange,
    ) -> Result<gst::StateChangeSuccess, gst::StateChangeError> {
        if transition == gst::StateChange::ReadyToPaused
            && let Err(e) = self.start()
        {
            self.post_error_message(e);
            return Err(gst::StateChangeError);
        }
        if transition == gst::StateChange::PausedToReady {
            let mut inner = self.shared.lock();
            inner.flushing = true;
            self.shared.cond.notify_all();
        }
        let ret = self.parent_change_state(transition);
        if transition == gst::StateChange::PausedToReady {
            self.stop();
        }
        if ret.is_err() && transition == gst::StateChange::ReadyToPaused {
            self.stop();
        }
        ret
    }
}
