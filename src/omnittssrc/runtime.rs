//! The element's run-time half: the queue shared by `create()` (consumer), the text inputs
//! (`text` / `push-text`, producers of utterances) and the worker thread that drives the
//! [`Backend`]: the [`Engine`](crate::engine::Engine), or a speech server.
//!
//! ```text
//! push-text ─► pending (utterances) ─► worker ─► Backend::submit ─► events ─► Output (items, bounded) ─► create()
//! ```
//!
//! [`Output`] decides what each `create()` returns; this file keeps the text and the worker.
//!
//! Requests arrive complete (the reference voice included: locally the voice-clone prompt, for a
//! server the recording as a data URL) and checked; the worker submits them in order. A text
//! refused when it was queued travels as its error, so that the error is posted in stream order,
//! after the audio of the text queued before it.
//!
//! One mutex ([`Inner`]) and one condvar guard everything; every state change calls
//! `notify_all`. The worker never holds the lock while talking to the backend, and `create()`
//! never holds it while posting bus messages (a synchronous bus handler may call back into the
//! element).

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gst::glib;
use gst::prelude::*;

use crate::element_common::backend::{Backend, Cancel, ClauseRequests, OpenText, Request};
use crate::element_common::clause_speech::{ClauseSink, speak_clauses};
use crate::element_common::messages::{Refusal, UtteranceDone};
use crate::engine::{EngineEvent, FinishReason, Metrics};

use super::CAT;
use super::output::{Item, Notice, Output, Step, Upstream};

/// One queued piece of text with the request built from the properties at the time it was queued.
pub(super) struct Utterance {
    /// Sequence number, unique per element start, from 1.
    pub id: u64,
    /// The text as given (for bus messages).
    pub text: String,
    /// What the engine or the server will be asked to do, or why the text was refused when it
    /// was queued: the refusal is then posted in stream order, after the audio of the utterances
    /// queued before it.
    pub request: Result<Request, String>,
    /// Live mode: the sample position (stream sample counter) the text arrived at; speech is
    /// scheduled there, or right after the previous utterance. 0 in non-live mode.
    pub start_pos: u64,
}

/// What an EOS event drops.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Dropped {
    /// The text of the utterance being output, cut where it is.
    pub cut: Option<String>,
    /// Utterances not begun (queued, being synthesised, or synthesised and waiting).
    pub not_begun: usize,
    /// The first of them's text.
    pub first: Option<String>,
}

/// Everything guarded by the one mutex: the text waiting for the worker, the worker's state, and
/// the [`Output`] it feeds.
pub(super) struct Inner {
    /// Utterances not yet taken by the worker.
    pending: VecDeque<Utterance>,
    /// The worker has taken an utterance and not yet queued its Done/Refused item.
    worker_busy: bool,
    /// The id and text of the utterance the worker has taken.
    busy: Option<(u64, String)>,
    /// Live: an EOS event came while a streamed utterance was unfinished; the stream ends
    /// (`create()` returns EOS) once everything queued up to it has been spoken.
    drain_to_eos: bool,
    /// Live mode: the `start_pos` of the utterance the worker is submitting (its Started item
    /// is not queued yet).
    busy_start: Option<u64>,
    /// Cancels the request in flight.
    canceller: Option<Cancel>,
    /// Bumped by flush and `cancel`: work of an older epoch is discarded.
    epoch: u64,
    /// BaseSrc `unlock()` is in effect: `create()` returns FLUSHING.
    unlocked: bool,
    /// `stop()`: the worker must exit.
    shutdown: bool,
    /// Set when the worker died (panic); `create()` turns it into an element error.
    worker_failure: Option<String>,
    /// Next utterance id.
    next_id: u64,
    /// An EOS event ends the stream before the output reaches what is queued: refusals the worker
    /// finds now are handed back to be posted at once. Unless it drains (`drain_to_eos`),
    /// `create()` returns EOS at its next step.
    ending: bool,
    /// The EOS event's messages (the refusals and the warning naming what it drops) are posted:
    /// only then may `create()` return EOS, so that they reach the bus before the EOS message.
    announced: bool,
    /// The worker's items, turned into buffers.
    output: Output,
}

/// The queue: one mutex, one condvar.
pub(super) struct Shared {
    inner: Mutex<Inner>,
    cond: Condvar,
}

impl Shared {
    /// Queues a chunk of the utterance of `epoch` for output, waiting for room first
    /// (back-pressure; an empty queue always takes it). Returns false, queuing nothing, when the
    /// utterance stopped being current (flush, cancel, NULL) meanwhile.
    fn push_audio(&self, epoch: u64, samples: Vec<f32>) -> bool {
        let len = samples.len();
        let mut inner = self.lock();
        while inner.is_current(epoch) && !inner.output.has_room(len) {
            inner = self.wait(inner, None);
        }
        if !inner.is_current(epoch) {
            return false;
        }
        inner.output.push(Item::Audio { samples, pos: 0 });
        self.notify();
        true
    }

    /// The queue of a stream whose buffers `output` decides.
    pub fn new(output: Output) -> Arc<Shared> {
        Arc::new(Shared {
            inner: Mutex::new(Inner {
                pending: VecDeque::new(),
                worker_busy: false,
                busy: None,
                drain_to_eos: false,
                busy_start: None,
                canceller: None,
                epoch: 0,
                unlocked: false,
                shutdown: false,
                worker_failure: None,
                next_id: 1,
                ending: false,
                announced: false,
                output,
            }),
            cond: Condvar::new(),
        })
    }

    /// Locks the queue. A poisoned lock (a panic while it was held) is taken over: the data is
    /// plain bookkeeping and every reader re-checks it.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes everyone waiting on the queue (call after every change).
    pub fn notify(&self) {
        self.cond.notify_all();
    }

    /// Waits for a change, or at most `timeout`.
    pub fn wait<'a>(
        &self,
        guard: MutexGuard<'a, Inner>,
        timeout: Option<Duration>,
    ) -> MutexGuard<'a, Inner> {
        match timeout {
            Some(t) => self
                .cond
                .wait_timeout(guard, t)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0),
            None => self.cond.wait(guard).unwrap_or_else(|p| p.into_inner()),
        }
    }
}

/// The element's side.
impl Inner {
    /// Queues an utterance for the worker under the next id; returns it as queued.
    pub fn queue(
        &mut self,
        text: String,
        request: Result<Request, String>,
        start_pos: u64,
    ) -> &Utterance {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.push_back(Utterance {
            id,
            text,
            request,
            start_pos,
        });
        &self.pending[self.pending.len() - 1]
    }

    /// The stream has ended (non-live), or an EOS event ends it (at once, or live once what is
    /// queued before an unfinished streamed utterance is spoken): no more text is accepted.
    pub fn ended(&self) -> bool {
        self.output.ended() || self.ending
    }

    /// Whether utterance `id` is queued, being synthesised or being output.
    pub fn unfinished(&self, id: u64) -> bool {
        self.pending.iter().any(|u| u.id == id)
            || (self.worker_busy && self.busy.as_ref().is_some_and(|b| b.0 == id))
            || self.output.holds(id)
    }

    /// Live EOS with the streamed utterance `id` unfinished: the stream ends once it and what
    /// was queued before it are spoken. The utterances queued behind it (and not taken by the
    /// worker yet) are dropped: returned are their refusals (to be posted now, as are those the
    /// worker finds from now on) and what is dropped of the others (`None`: nothing).
    pub fn drain_then_end(&mut self, id: u64) -> (Vec<Refusal>, Option<Dropped>) {
        self.drain_to_eos = true;
        self.ending = true;
        self.announced = false;
        let mut out = Vec::new();
        let (mut not_begun, mut first) = (0, None);
        let pending = std::mem::take(&mut self.pending);
        for u in pending {
            match u.request {
                Err(error) if u.id > id => out.push(Refusal {
                    id: u.id,
                    text: u.text,
                    error,
                }),
                Ok(_) if u.id > id => {
                    not_begun += 1;
                    first.get_or_insert(u.text);
                }
                _ => self.pending.push_back(u),
            }
        }
        let dropped = first.map(|first| Dropped {
            cut: None,
            not_begun,
            first: Some(first),
        });
        (out, dropped)
    }

    /// Drops the utterances the worker has not taken (an EOS event before the start ends the
    /// stream before any is spoken: the worker need not synthesise them).
    pub fn drop_pending(&mut self) {
        self.pending.clear();
    }

    /// Live: the sample position that text arriving at running time `now` is due at.
    pub fn arrival_pos(&self, now: Option<gst::ClockTime>) -> u64 {
        self.output.arrival_pos(now)
    }

    /// Whether any text or audio is queued, or an utterance in progress.
    pub fn has_work(&self) -> bool {
        self.worker_busy || !self.pending.is_empty() || self.output.busy()
    }

    /// Drops all queued text and audio, cancels the request in flight and retires the
    /// current utterance; returns its done message (the caller's to post).
    pub fn discard_all(&mut self, samples_per_frame: usize) -> Option<UtteranceDone> {
        self.epoch += 1;
        self.ending = false;
        self.announced = false;
        self.drain_to_eos = false;
        self.pending.clear();
        self.busy_start = None;
        if let Some(c) = &self.canceller {
            c.cancel();
        }
        self.output.cancel(samples_per_frame)
    }

    /// An EOS event ends the stream here: `create()` returns EOS at its next step once the
    /// event's messages are posted ([`Inner::announce_end`]). Returns the refusals still queued
    /// (in stream order), which no `create()` will reach. Refusals the worker finds from now on
    /// come back from it.
    pub fn end_stream(&mut self) -> Vec<Refusal> {
        self.ending = true;
        self.announced = false;
        let mut out = self.output.take_refusals();
        let pending = std::mem::take(&mut self.pending);
        for u in pending {
            match u.request {
                Err(error) => out.push(Refusal {
                    id: u.id,
                    text: u.text,
                    error,
                }),
                Ok(_) => self.pending.push_back(u),
            }
        }
        out
    }

    /// The EOS event's messages are posted: `create()` may return EOS now (it waited, so that
    /// they come before the EOS message on the bus).
    pub fn announce_end(&mut self) {
        self.announced = true;
    }

    /// What an EOS event that ends the stream at once drops ([`Dropped`]); `None` when nothing.
    pub fn dropped(&self) -> Option<Dropped> {
        let current = self.output.in_progress();
        let cut = current.map(|(_, text)| text.to_owned());
        // Not begun, in stream order: synthesised and waiting in the output, being synthesised,
        // then queued for the worker (refusals are posted on their own).
        let mut ids = Vec::new();
        let mut first = None;
        let mut note = |id: u64, text: &str| {
            if !ids.contains(&id) {
                ids.push(id);
                first.get_or_insert_with(|| text.to_owned());
            }
        };
        for (id, text) in self.output.not_begun() {
            note(id, text);
        }
        if self.worker_busy
            && let Some((id, text)) = &self.busy
            && current.is_none_or(|(c, _)| c != *id)
        {
            note(*id, text);
        }
        for u in self.pending.iter().filter(|u| u.request.is_ok()) {
            note(u.id, &u.text);
        }
        let not_begun = ids.len();
        (cut.is_some() || first.is_some()).then_some(Dropped {
            cut,
            not_begun,
            first,
        })
    }

    /// Live: the stream pauses (PLAYING → PAUSED) at running time `now`; see [`Output::pause`].
    pub fn pause(&mut self, now: gst::ClockTime) {
        self.output.pause(now);
    }

    /// Live: the stream resumes (PAUSED → PLAYING) at running time `now`; see [`Output::resume`].
    pub fn resume(&mut self, now: gst::ClockTime) {
        self.output.resume(now);
    }

    /// A flush began (FLUSH_START): everything is dropped, as for `cancel`
    /// ([`Inner::discard_all`]); live, text pushed until the flush ends is due at once
    /// ([`Output::flush_started`]). Returns the current utterance's done message.
    pub fn flush_started(&mut self, samples_per_frame: usize) -> Option<UtteranceDone> {
        self.output.flush_started();
        self.discard_all(samples_per_frame)
    }

    /// A flush ended (FLUSH_STOP): the next buffer is DISCONT, live at the running time of the
    /// next step ([`Output::flush_stopped`]).
    pub fn flush_stopped(&mut self) {
        self.output.flush_stopped();
    }

    /// BaseSrc `unlock()` (true) and `unlock_stop()` (false).
    pub fn set_unlocked(&mut self, unlocked: bool) {
        self.unlocked = unlocked;
    }

    /// `stop()`: the worker exits, `create()` returns FLUSHING, everything queued is dropped.
    pub fn shut_down(&mut self) {
        self.shutdown = true;
        self.unlocked = true;
        self.discard_all(1);
    }

    /// What `create()` does next, at running time `now` (live mode); notices to post go to
    /// `notices`.
    pub fn next_step(&mut self, now: gst::ClockTime, notices: &mut Vec<Notice>) -> Step {
        if self.unlocked {
            return Step::Flushing;
        }
        if let Some(what) = self.worker_failure.take() {
            return Step::Failed(what);
        }
        // An EOS event: at once, or (drain) once everything up to the streamed utterance is out;
        // not before its messages are posted (they come first on the bus), which is at once.
        if self.ending && (!self.drain_to_eos || !self.has_work()) {
            return match self.announced {
                true => Step::Eos,
                false => Step::Wait { until: None },
            };
        }
        let up = Upstream {
            idle: self.pending.is_empty() && !self.worker_busy,
            submitting: self.busy_start.is_some(),
            next_start: self
                .pending
                .front()
                .map(|u| u.start_pos)
                .or(self.busy_start),
        };
        self.output.next(&up, now, notices)
    }
}

/// The worker's side.
impl Inner {
    /// The next utterance to submit and the epoch it belongs to; the worker is busy from here
    /// until [`Inner::worker_done`].
    fn take_utterance(&mut self) -> Option<(Utterance, u64)> {
        let u = self.pending.pop_front()?;
        self.worker_busy = true;
        self.busy = Some((u.id, u.text.clone()));
        self.busy_start = Some(u.start_pos);
        Some((u, self.epoch))
    }

    /// Whether work of `epoch` is still wanted.
    fn is_current(&self, epoch: u64) -> bool {
        self.epoch == epoch && !self.shutdown
    }

    /// The utterance was refused before it started: its error keeps its place in the stream, or
    /// comes back when the stream is ending (the worker posts it).
    fn refuse(&mut self, epoch: u64, id: u64, text: String, error: String) -> Option<Refusal> {
        self.worker_busy = false;
        self.busy_start = None;
        if self.epoch != epoch {
            return None;
        }
        if self.ending {
            return Some(Refusal { id, text, error });
        }
        self.output.push(Item::Refused(Refusal { id, text, error }));
        None
    }

    /// The backend accepted the utterance; false when it is no longer wanted.
    fn start(&mut self, epoch: u64, canceller: Cancel, item: Item) -> bool {
        self.busy_start = None;
        if !self.is_current(epoch) {
            return false;
        }
        self.canceller = Some(canceller);
        self.output.push(item);
        true
    }

    /// Queues an item of `epoch` (dropped when that epoch was discarded).
    fn push(&mut self, epoch: u64, item: Item) {
        if self.epoch == epoch {
            self.output.push(item);
        }
    }

    /// The worker is done with its utterance.
    fn worker_done(&mut self) {
        self.canceller = None;
        self.busy = None;
        self.worker_busy = false;
    }
}

/// How long the worker waits on the backend between checks of the stop/cancel flags.
const POLL: Duration = Duration::from_millis(20);
/// How long the worker waits for a cancelled request to report Finished before giving up on it.
const CANCEL_GRACE: Duration = Duration::from_secs(10);

/// Spawns the worker. It holds the backend (a reference to the engine, or the server's client)
/// until it exits, which happens on `shutdown`.
pub(super) fn spawn_worker(
    backend: Backend,
    shared: Arc<Shared>,
    element: glib::WeakRef<gst::Element>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("omnitts-worker".into())
        .spawn(move || {
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                worker_loop(&backend, &shared, &element)
            }));
            if let Err(panic) = run {
                let what = crate::engine::panic_message(&*panic);
                let mut inner = shared.lock();
                inner.worker_failure = Some(what);
                inner.worker_done();
                shared.notify();
            }
            // The element's stop() drops the element's share; the engine's last share joins its
            // stage threads.
            drop(backend);
        })
}

fn worker_loop(backend: &Backend, shared: &Shared, element: &glib::WeakRef<gst::Element>) {
    loop {
        // Take the next utterance.
        let (utt, epoch) = {
            let mut inner = shared.lock();
            loop {
                if inner.shutdown {
                    return;
                }
                if let Some(taken) = inner.take_utterance() {
                    break taken;
                }
                inner = shared.wait(inner, None);
            }
        };
        let Utterance {
            id,
            text,
            request,
            start_pos,
        } = utt;
        gst::debug!(CAT, "worker: submitting utterance {id}: {text:?}");
        let request = match request {
            Ok(Request::Clauses(clauses)) => {
                speak_clause_utterance(backend, shared, element, id, start_pos, epoch, clauses);
                shared.lock().worker_done();
                shared.notify();
                if element.upgrade().is_none() {
                    return;
                }
                continue;
            }
            other => other,
        };
        // An open utterance's text: what has arrived when it starts, all of it when it is done.
        let open = match &request {
            Ok(Request::LocalOpen(_, open) | Request::RemoteOpen(_, open)) => Some(open.clone()),
            _ => None,
        };
        let full_text = || open.as_ref().map(|o| o.text());
        let submitted = request.and_then(|r| backend.submit(r));
        let handle = match submitted {
            Ok(h) => h,
            Err(error) => {
                let late = shared.lock().refuse(epoch, id, text, error);
                shared.notify();
                if let (Some(r), Some(element)) = (late, element.upgrade()) {
                    let _ = element.post_message(r.message(&element));
                }
                continue;
            }
        };
        {
            let started = Item::Started {
                id,
                text: full_text().unwrap_or(text),
                start_pos,
                open: open.clone(),
            };
            if !shared.lock().start(epoch, handle.canceller(), started) {
                handle.cancel();
            }
            shared.notify();
        }

        // Forward events until Finished.
        let mut cancelled_at: Option<Instant> = None;
        loop {
            let ev = match handle.recv_timeout(POLL) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    let stale = !shared.lock().is_current(epoch);
                    if stale {
                        handle.cancel();
                        let t = *cancelled_at.get_or_insert_with(Instant::now);
                        if t.elapsed() > CANCEL_GRACE {
                            gst::warning!(
                                CAT,
                                "worker: utterance {id} did not stop within {CANCEL_GRACE:?} of cancel"
                            );
                            break;
                        }
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // The engine dropped the request without Finished.
                    if let Some(o) = &open {
                        o.utterance_over();
                    }
                    let reason = FinishReason::Error(
                        "the engine or the server request stopped without finishing the utterance"
                            .into(),
                    );
                    shared.lock().push(
                        epoch,
                        Item::Done {
                            id,
                            reason,
                            metrics: Metrics::default(),
                            text: full_text(),
                        },
                    );
                    shared.notify();
                    break;
                }
            };
            match ev {
                EngineEvent::Started => {}
                EngineEvent::Audio(chunk) => {
                    let len = chunk.samples.len();
                    if len == 0 {
                        continue;
                    }
                    if !shared.push_audio(epoch, chunk.samples) {
                        handle.cancel();
                        cancelled_at.get_or_insert_with(Instant::now);
                    }
                }
                EngineEvent::FirstAudio { ttfa_ms } => {
                    shared.lock().push(epoch, Item::FirstAudio { id, ttfa_ms });
                    shared.notify();
                }
                EngineEvent::Finished { reason, metrics } => {
                    gst::debug!(
                        CAT,
                        "worker: utterance {id} finished: {reason:?}, {} frames",
                        metrics.frames
                    );
                    // An open text's later fragments are refused from here on, so that none is
                    // taken after its done message (the application may append on seeing it).
                    if let Some(o) = &open {
                        o.utterance_over();
                    }
                    let mut inner = shared.lock();
                    if inner.epoch != epoch
                        && let FinishReason::Error(e) = &reason
                    {
                        // Discarded utterance, but an engine error is still worth a log line.
                        gst::warning!(CAT, "worker: discarded utterance {id} failed: {e}");
                    }
                    inner.push(
                        epoch,
                        Item::Done {
                            id,
                            reason,
                            metrics,
                            text: full_text(),
                        },
                    );
                    shared.notify();
                    break;
                }
            }
        }
        shared.lock().worker_done();
        shared.notify();
        if element.upgrade().is_none() {
            return;
        }
    }
}

/// `omnittssrc`'s side of a clause-mode utterance: its items go to the output in stream order.
struct ClauseOutput<'a> {
    shared: &'a Shared,
    id: u64,
    start_pos: u64,
    epoch: u64,
    /// The text the clauses come from.
    open: Arc<OpenText>,
}

impl ClauseSink for ClauseOutput<'_> {
    fn current(&self) -> bool {
        self.shared.lock().is_current(self.epoch)
    }

    fn started(&self, cancel: Cancel, text: String) -> bool {
        let item = Item::Started {
            id: self.id,
            text,
            start_pos: self.start_pos,
            open: Some(self.open.clone()),
        };
        let ok = self.shared.lock().start(self.epoch, cancel, item);
        self.shared.notify();
        ok
    }

    fn next_request(&self, cancel: Cancel) {
        self.shared.lock().canceller = Some(cancel);
    }

    fn first_audio(&self, ttfa_ms: f64) {
        let item = Item::FirstAudio {
            id: self.id,
            ttfa_ms,
        };
        self.shared.lock().push(self.epoch, item);
        self.shared.notify();
    }

    fn audio(&self, samples: Vec<f32>) -> bool {
        self.shared.push_audio(self.epoch, samples)
    }

    fn debug(&self, what: &str) {
        gst::debug!(CAT, "worker: utterance {}: {what}", self.id);
    }
}

/// Speaks a clause-mode utterance (`append-text` in clause mode) with the shared clause driver
/// ([`speak_clauses`]): one Started (when the first clause is submitted), one FirstAudio, one
/// Done with the whole text and the clauses' metrics summed. A clause the backend refuses or
/// that fails ends the utterance with that error; when nothing was submitted the error keeps
/// its place in the stream as a refusal; a discard (flush, `cancel`) cancels every clause.
fn speak_clause_utterance(
    backend: &Backend,
    shared: &Shared,
    element: &glib::WeakRef<gst::Element>,
    id: u64,
    start_pos: u64,
    epoch: u64,
    clauses: ClauseRequests,
) {
    let sink = ClauseOutput {
        shared,
        id,
        start_pos,
        epoch,
        open: clauses.open.clone(),
    };
    let Some(outcome) = speak_clauses(backend, &clauses, &sink) else {
        // Discarded: the output retires the utterance itself.
        return;
    };
    if !outcome.started {
        // Nothing was submitted: the error keeps its place in the stream.
        let error = match outcome.reason {
            FinishReason::Error(e) => e,
            other => format!("{other:?}"),
        };
        let late = shared.lock().refuse(epoch, id, outcome.text, error);
        shared.notify();
        if let (Some(r), Some(element)) = (late, element.upgrade()) {
            let _ = element.post_message(r.message(&element));
        }
        return;
    }
    shared.lock().push(
        epoch,
        Item::Done {
            id,
            reason: outcome.reason,
            metrics: outcome.metrics,
            text: Some(outcome.text),
        },
    );
    shared.notify();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element_common::audio::Samples;

    fn queue_one(inner: &mut Inner, text: &str) -> u64 {
        inner.queue(text.into(), Err("refused".into()), 0).id
    }

    #[test]
    fn create_sees_flushing_failure_and_the_end() {
        let shared = Shared::new(Output::new(480, None, 1000, 24_000));
        let mut inner = shared.lock();
        let mut notices = Vec::new();
        let now = gst::ClockTime::ZERO;
        assert_eq!(
            inner.next_step(now, &mut notices),
            Step::Eos,
            "nothing to speak"
        );
        assert!(inner.ended());

        let shared = Shared::new(Output::new(480, None, 1000, 24_000));
        let mut inner = shared.lock();
        assert_eq!(queue_one(&mut inner, "a"), 1);
        assert_eq!(queue_one(&mut inner, "b"), 2);
        assert!(inner.has_work());
        // Text is waiting for the worker: no EOS yet.
        assert_eq!(
            inner.next_step(now, &mut notices),
            Step::Wait { until: None }
        );
        inner.set_unlocked(true);
        assert_eq!(inner.next_step(now, &mut notices), Step::Flushing);
        inner.set_unlocked(false);
        inner.worker_failure = Some("boom".into());
        assert_eq!(
            inner.next_step(now, &mut notices),
            Step::Failed("boom".into())
        );

        // The worker takes one; a refusal of the current epoch keeps its place.
        let (u, epoch) = inner.take_utterance().unwrap();
        assert_eq!(u.id, 1);
        inner.refuse(epoch, u.id, u.text, "speaker 'x': unknown".into());
        // A discard drops what is queued and what older epochs bring later.
        assert!(inner.discard_all(1920).is_none());
        assert!(!inner.has_work());
        inner.refuse(epoch, 2, "b".into(), "stale".into());
        inner.push(
            epoch,
            Item::Audio {
                samples: vec![0.0; 10],
                pos: 0,
            },
        );
        assert_eq!(inner.next_step(now, &mut notices), Step::Eos);
        assert!(notices.is_empty(), "{notices:?}");
    }

    /// An EOS event ends the stream at the next step, audio still queued or not (the EOS is
    /// `create()`'s to return, not BaseSrc's); live, draining up to a streamed utterance, once
    /// that is out.
    #[test]
    fn an_eos_event_ends_at_the_next_step() {
        let now = gst::ClockTime::ZERO;
        let mut notices = Vec::new();
        let shared = Shared::new(Output::new(480, None, 10_000, 24_000));
        let mut inner = shared.lock();
        let id = inner.queue("a".into(), Err("x".into()), 0).id;
        let (u, epoch) = inner.take_utterance().unwrap();
        assert_eq!(u.id, id);
        inner.output.push(Item::Started {
            id,
            text: "a".into(),
            start_pos: 0,
            open: None,
        });
        inner.push(
            epoch,
            Item::Audio {
                samples: vec![0.5; 2000],
                pos: 0,
            },
        );
        assert!(matches!(
            inner.next_step(now, &mut notices),
            Step::Buffer(_)
        ));
        inner.end_stream();
        assert!(inner.ended());
        // Not before the EOS event's messages are posted.
        assert_eq!(
            inner.next_step(now, &mut notices),
            Step::Wait { until: None }
        );
        inner.announce_end();
        assert_eq!(inner.next_step(now, &mut notices), Step::Eos);
        assert_eq!(inner.next_step(now, &mut notices), Step::Eos);
        // A flush (or stop) still wins.
        inner.set_unlocked(true);
        assert_eq!(inner.next_step(now, &mut notices), Step::Flushing);

        // Draining: the queued audio first.
        let shared = Shared::new(Output::new(
            480,
            Some(gst::ClockTime::from_mseconds(80)),
            10_000,
            24_000,
        ));
        let mut inner = shared.lock();
        let id = inner.queue("b".into(), Err("x".into()), 0).id;
        let (_, epoch) = inner.take_utterance().unwrap();
        inner.output.push(Item::Started {
            id,
            text: "b".into(),
            start_pos: 0,
            open: None,
        });
        inner.push(
            epoch,
            Item::Audio {
                samples: vec![0.5; 480],
                pos: 0,
            },
        );
        assert_eq!(inner.drain_then_end(id), (vec![], None));
        inner.announce_end();
        assert!(matches!(
            inner.next_step(now, &mut notices),
            Step::Buffer(_)
        ));
        inner.worker_done();
        let done = Item::Done {
            id,
            reason: crate::engine::FinishReason::Eos,
            metrics: crate::engine::Metrics::default(),
            text: None,
        };
        inner.push(epoch, done);
        let late = gst::ClockTime::from_seconds(1);
        let steps = (0..10)
            .position(|_| inner.next_step(late, &mut notices) == Step::Eos)
            .expect("EOS once drained");
        assert!(steps > 0, "not before the done item is out");
        assert!(!inner.has_work());
    }

    #[test]
    fn live_text_is_due_at_its_arrival() {
        let shared = Shared::new(Output::new(
            480,
            Some(gst::ClockTime::from_mseconds(80)),
            1000,
            24_000,
        ));
        let mut inner = shared.lock();
        let mut notices = Vec::new();
        let r0 = gst::ClockTime::from_mseconds(100);
        assert_eq!(inner.arrival_pos(Some(r0)), 0, "before the first step");
        let Step::Buffer(b) = inner.next_step(r0, &mut notices) else {
            panic!("live silence expected");
        };
        assert_eq!(b.samples, Samples::Silence(480));
        assert_eq!(
            inner.arrival_pos(Some(r0 + gst::ClockTime::from_seconds(1))),
            24_000
        );
        inner.queue("later".into(), Err("x".into()), 24_000);
        // Not due yet: silence up to it (480 per buffer) at each buffer's running time.
        let due = r0 + gst::ClockTime::from_nseconds(20_000_000);
        assert_eq!(
            inner.next_step(r0, &mut notices),
            Step::Wait { until: Some(due) }
        );
        let Step::Buffer(b) = inner.next_step(due, &mut notices) else {
            panic!("live silence expected");
        };
        assert_eq!(
            (b.offset, b.pts, b.samples),
            (480, due, Samples::Silence(480))
        );
    }

    #[test]
    fn refusals_behind_an_eos_come_back() {
        let shared = Shared::new(Output::new(480, None, 1000, 24_000));
        let mut inner = shared.lock();
        for text in ["a", "b", "c"] {
            queue_one(&mut inner, text);
        }
        let (u, epoch) = inner.take_utterance().unwrap();
        assert!(inner.refuse(epoch, u.id, u.text, "queued".into()).is_none());
        // The one the output holds, then those still pending, in stream order.
        let ids: Vec<u64> = inner.end_stream().iter().map(|r| r.id).collect();
        assert_eq!(ids, [1, 2, 3]);
        // One the worker refuses from now on comes back to be posted by it.
        queue_one(&mut inner, "d");
        let (u, epoch) = inner.take_utterance().unwrap();
        let late = inner.refuse(epoch, u.id, u.text, "late".into());
        assert_eq!(late.map(|r| r.id), Some(4));
        assert!(inner.end_stream().is_empty());
    }
}
