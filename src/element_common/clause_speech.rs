//! Clause mode's synthesis, shared by `omnittssrc` (`append-text`) and `omnittssynth`
//! (`input-mode=fragments`): an open utterance's text is spoken clause by clause as each clause
//! completes ([`OpenText::next_clause`](super::backend::OpenText::next_clause)), every clause a
//! request of its own, the clauses' audio forwarded in order as one utterance.
//!
//! Each clause is submitted while the clause before it is still being synthesised (at most
//! [`CLAUSES_IN_FLIGHT`] at once), so that its audio follows without a gap when synthesis is
//! faster than real time, while the clauses further on do not slow the current one down by
//! sharing its stage-0 steps. Where the audio goes is the element's: a [`ClauseSink`].

use std::collections::VecDeque;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use crate::engine::{EngineEvent, FinishReason, Metrics};
use crate::models::tts::text::{NO_WORDS_TO_SPEAK, unspeakable};

use super::backend::{Backend, Cancel, ClauseRequests, Handle, NextClause};
use super::input_error::quoted;

/// Clauses synthesised at once: the one being played and the next.
pub(crate) const CLAUSES_IN_FLIGHT: usize = 2;

/// How long the driver waits for a clause or an event between checks of [`ClauseSink::current`].
const POLL: Duration = Duration::from_millis(20);

/// Where a clause-mode utterance's events go (the element's output). Called from the worker
/// thread; none of the calls may block for long, except [`ClauseSink::audio`] (back-pressure).
pub(crate) trait ClauseSink {
    /// Whether the utterance is still wanted (false: flushed, cancelled, the element stopping);
    /// checked between events: once false, every clause is cancelled and the driver returns.
    fn current(&self) -> bool;
    /// The first clause was submitted: the utterance starts (`text`: its text so far); its
    /// cancel handle is `cancel`. Returns false when the utterance was discarded meanwhile.
    fn started(&self, cancel: Cancel, text: String) -> bool;
    /// The clause whose events come next is `cancel`'s (the one before it finished).
    fn next_request(&self, cancel: Cancel);
    /// The utterance's first audio, `ttfa_ms` after the driver started.
    fn first_audio(&self, ttfa_ms: f64);
    /// 24 kHz mono samples, in order. Returns false when the rest would never be heard (the
    /// utterance was discarded or cut): every clause is then cancelled.
    fn audio(&self, samples: Vec<f32>) -> bool;
    /// A debug line (`what`) for the element's log.
    fn debug(&self, what: &str);
}

/// How a clause-mode utterance ended.
#[derive(Debug)]
pub(crate) struct ClauseOutcome {
    /// Whether any clause was submitted ([`ClauseSink::started`] was called): when not, nothing
    /// was spoken and `reason` is the refusal (the whole text unspeakable, or the first clause
    /// refused).
    pub started: bool,
    /// The last clause's finish reason, or the first failure (a clause refused or failed:
    /// [`FinishReason::Error`] naming the clause; cut: [`FinishReason::Cancelled`]).
    pub reason: FinishReason,
    /// The clauses' figures: frames and audio added, per-frame times weighted by frames, the
    /// first audio's time and the wall time from the driver's start.
    pub metrics: Metrics,
    /// The utterance's whole text.
    pub text: String,
}

/// Frame-weighted mean of a per-frame figure over the clauses' metrics.
fn per_frame(sum: &mut (f64, usize), value: f64, frames: usize) {
    sum.0 += value * frames as f64;
    sum.1 += frames;
}

/// Speaks a clause-mode utterance to its end with `backend`, its events into `sink`. Returns
/// `None` when the utterance was discarded ([`ClauseSink::current`] turned false): its clauses
/// are cancelled and nothing is left to report.
pub(crate) fn speak_clauses(
    backend: &Backend,
    clauses: &ClauseRequests,
    sink: &dyn ClauseSink,
) -> Option<ClauseOutcome> {
    let t0 = Instant::now();
    let mut handles: VecDeque<Handle> = VecDeque::new();
    let (mut started, mut text_done, mut first_audio) = (false, false, false);
    let mut failure: Option<FinishReason> = None;
    let mut last_reason = FinishReason::Eos;
    let mut total = Metrics::default();
    let (mut ar, mut dec, mut rtf) = ((0.0, 0), (0.0, 0), (0.0, 0.0));
    let mut n_clauses = 0usize;
    loop {
        if !sink.current() {
            for h in &handles {
                h.cancel();
            }
            return None;
        }
        // Submit the clauses complete so far (waiting for one only when nothing is in flight).
        while failure.is_none() && !text_done && handles.len() < CLAUSES_IN_FLIGHT {
            let wait = if handles.is_empty() {
                POLL
            } else {
                Duration::ZERO
            };
            let clause = match clauses.open.next_clause(wait) {
                NextClause::Clause(c) => c,
                NextClause::Waiting => break,
                NextClause::Ended => {
                    text_done = true;
                    break;
                }
            };
            if unspeakable(&clause).is_some() {
                sink.debug(&format!("nothing to speak in {clause:?}"));
                continue;
            }
            n_clauses += 1;
            sink.debug(&format!("clause {n_clauses}: {clause:?}"));
            match clauses.build(&clause).and_then(|r| backend.submit(r)) {
                Ok(h) => {
                    if !started {
                        started = true;
                        if !sink.started(h.canceller(), clauses.open.text()) {
                            h.cancel();
                        }
                    }
                    handles.push_back(h);
                }
                Err(e) => {
                    failure = Some(FinishReason::Error(format!(
                        "clause {n_clauses} of the streamed text ({clause:?}): {e}"
                    )));
                }
            }
        }
        let Some(h) = handles.front() else {
            if failure.is_some() || text_done {
                break;
            }
            continue;
        };
        let ev = match h.recv_timeout(POLL) {
            Ok(ev) => ev,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                handles.pop_front();
                failure.get_or_insert(FinishReason::Error(
                    "the engine stopped without finishing a clause of the utterance".into(),
                ));
                break;
            }
        };
        match ev {
            EngineEvent::Started => {}
            EngineEvent::FirstAudio { .. } => {
                if !std::mem::replace(&mut first_audio, true) {
                    let ttfa_ms = t0.elapsed().as_secs_f64() * 1000.0;
                    total.ttfa_ms = Some(ttfa_ms);
                    sink.first_audio(ttfa_ms);
                }
            }
            EngineEvent::Audio(chunk) => {
                if chunk.samples.is_empty() {
                    continue;
                }
                if !sink.audio(chunk.samples) {
                    if !sink.current() {
                        continue;
                    }
                    failure.get_or_insert(FinishReason::Cancelled);
                    break;
                }
            }
            EngineEvent::Finished { reason, metrics } => {
                handles.pop_front();
                total.frames += metrics.frames;
                total.audio_ms += metrics.audio_ms;
                per_frame(&mut ar, metrics.ar_ms_per_frame, metrics.frames);
                per_frame(&mut dec, metrics.decoder_ms_per_frame, metrics.frames);
                rtf.0 += metrics.rtf * metrics.audio_ms;
                rtf.1 += metrics.audio_ms;
                match reason {
                    FinishReason::Cancelled | FinishReason::Error(_) => {
                        failure.get_or_insert(reason);
                        break;
                    }
                    r => last_reason = r,
                }
                // The next clause's request is already in flight; its events come next.
                if let Some(next) = handles.front() {
                    sink.next_request(next.canceller());
                }
            }
        }
    }
    for h in &handles {
        h.cancel();
    }
    let mean = |(sum, n): (f64, usize)| if n == 0 { 0.0 } else { sum / n as f64 };
    total.ar_ms_per_frame = mean(ar);
    total.decoder_ms_per_frame = mean(dec);
    total.rtf = if rtf.1 > 0.0 { rtf.0 / rtf.1 } else { 0.0 };
    total.wall_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let text = clauses.open.text();
    let reason = match failure {
        Some(f) => f,
        None if n_clauses == 0 => FinishReason::Error(format!(
            "text '{}': {}",
            quoted(&text),
            unspeakable(&text).unwrap_or(NO_WORDS_TO_SPEAK)
        )),
        None => last_reason,
    };
    sink.debug(&format!(
        "{n_clauses} clauses finished: {reason:?}, {} frames",
        total.frames
    ));
    Some(ClauseOutcome {
        started,
        reason,
        metrics: total,
        text,
    })
}
