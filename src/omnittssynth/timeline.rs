//! The cue timeline: where each cue's speech goes in the one continuous output stream, what the
//! overflow policy does when speech is longer than its slot, and the mixing of cues that play at
//! the same time. Pure sample arithmetic (no GStreamer), driven by the element's output task.
//!
//! Positions are sample counts at 24 kHz from the start of the output segment. A cue starts at its
//! PTS ([`CueStart::At`]) or as soon as possible ([`CueStart::Asap`]); its slot is the text
//! buffer's duration. The output task asks [`Timeline::next`] for the next piece of output, at most
//! `max` samples:
//!
//! ```text
//! cues (start, slot, audio as synthesised) ──► next(max, pace) ──► Audio(mixed) | Silence(n) | Wait | End
//!                                                    └──► notices: Started, Late, Cancel, Done(report)
//! ```
//!
//! Overflow ([`Overflow`]): `clip` cuts a cue at its slot's end (PTS + duration) with a
//! [`CLIP_FADE_SAMPLES`] linear fade-out; `compress` does the same with the audio of a cue whose
//! worker has compressed it into its slot (`compress.rs`: whole, once synthesised; only what
//! `max-compression` could not fit is cut); `overlap` lets it run on and mixes (adds) the cues that
//! start meanwhile; `shift` starts a cue only once the cues before it are done, never before its
//! PTS. In every policy, cues whose slots overlap in the input play mixed unless `shift` orders them.
//! A mix of two or more voices goes through [`soft_limit`], which keeps it within full scale; a
//! lone voice is output as synthesised.
//!
//! End: after EOS, once every cue is over, the output goes on (in silence) to the latest slot end
//! of any cue (its start + slot; a silent cue's too) and GAP end, so that the stream covers the
//! whole cue timeline.
//!
//! Pacing ([`Pace`]): not live, silence is output only up to what the input has told (a later cue's
//! PTS, a GAP's end) and audio is waited for however long synthesis takes, so the timeline is exact.
//! With more than [`MAX_QUEUED_CUES`] cues not yet over (the element then holds its input back until
//! the output reaches what the input has told), not even speech passes that point before EOS: a
//! cue still held upstream may start there (many cues at one PTS).
//! Live, silence may also run up to the running time all input has arrived by, and a cue whose audio
//! is not there when its output is due gets silence instead (it starts or continues later: the
//! overflow policy then treats the delay as speech running long), counted as late.

use std::collections::VecDeque;

use super::overflow::{Action, Overflow};

/// Length of the `clip` fade-out: 10 ms at 24 kHz.
pub const CLIP_FADE_SAMPLES: u64 = 240;

/// Where [`soft_limit`] starts to bend a mix of voices: below it, samples pass unchanged.
pub const LIMIT_KNEE: f32 = 0.8;

/// The soft limiter of mixes (cues playing at the same time, added): the identity up to
/// [`LIMIT_KNEE`], then a tanh curve that joins it smoothly (same value and slope) and never
/// reaches full scale, so a mix stays within (-1, 1) however many voices add up. Stateless, per
/// sample, so the output's chunking does not change it.
pub fn soft_limit(x: f32) -> f32 {
    let a = x.abs();
    if a <= LIMIT_KNEE {
        return x;
    }
    let room = 1.0 - LIMIT_KNEE;
    let y = LIMIT_KNEE + room * ((a - LIMIT_KNEE) / room).tanh();
    y.copysign(x)
}

/// When a cue is to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CueStart {
    /// At this position: the text buffer's PTS.
    At(u64),
    /// As soon as possible (a text buffer without PTS): once the cues before it are done, and
    /// not before this position (where the input had got to when it arrived).
    Asap(u64),
}

impl CueStart {
    /// The earliest position the cue may start at.
    pub fn position(self) -> u64 {
        match self {
            CueStart::At(p) | CueStart::Asap(p) => p,
        }
    }
}

/// What a cue holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CueKind {
    /// Text to speak; its audio arrives with [`Timeline::add_audio`].
    Speech,
    /// Nothing to speak (empty, whitespace, no letter or digit): its slot is silence.
    Silent,
    /// Text that cannot be spoken (not UTF-8, a voice the checkpoint lacks): when the output gets
    /// there, after every cue before it is done, [`Timeline::next`] returns [`Step::Refused`].
    Refused(String),
}

/// How the output is paced; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Not live: exact timeline, waiting for input and synthesis.
    Exact,
    /// Live: all input timestamped before `settled` has arrived; `late`: the next output sample's
    /// deadline has passed.
    Live { settled: u64, late: bool },
}

/// What [`Timeline::next`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// More input (a cue, a GAP, EOS), or live: the clock.
    Input,
    /// Synthesised audio of a cue that is due (live: until its deadline).
    Audio,
}

/// The next piece of output, at the position [`Timeline::position`] had before the call.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Speech samples (cues playing at the same time are mixed: added).
    Audio(Vec<f32>),
    /// This many samples of silence.
    Silence(usize),
    /// Nothing can be output yet.
    Wait(Need),
    /// EOS was received and everything before it is output.
    End,
    /// A refused cue is due: the stream stops here with its error.
    Refused { id: u64, error: String },
}

/// Things that happened during [`Timeline::next`], for the element's messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Notice {
    /// The cue's first audio sample is output at `at`.
    Started { id: u64, at: u64 },
    /// Live: the cue's audio was not ready when due (first time only); silence is output at `at`.
    Late { id: u64, at: u64 },
    /// The cue's synthesis is no longer needed (clipped): cancel it.
    Cancel { id: u64 },
    /// The cue is over: nothing more of it will be output.
    Done(CueReport),
}

/// What became of one cue (the cue message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CueReport {
    pub id: u64,
    pub start: CueStart,
    /// The slot's length (the text buffer's duration), samples.
    pub slot: Option<u64>,
    /// Samples synthesised (for a clipped cue, up to when it was cut).
    pub speech: u64,
    /// Samples of it output.
    pub output: u64,
    /// Position of its first output sample (a silent cue: where it became due, its slot's
    /// silence).
    pub first: Option<u64>,
    /// Position where it ended (past its last output sample, or where it was cut; a silent cue:
    /// its slot's end).
    pub end: u64,
    pub action: Action,
    /// Samples it started after its PTS because the speech before it ran long (`shift`).
    pub shifted: u64,
    /// Live: how many times its audio was late.
    pub late: u32,
    /// Live: samples of silence put in its place while its audio was late.
    pub late_samples: u64,
    /// Samples of speech cut off (`clip`; at least this many when synthesis was still running).
    pub clipped: u64,
    /// Samples its speech is longer than its slot.
    pub overrun: u64,
    /// `compress`: the length its speech (`speech` samples) was compressed to.
    pub compressed: Option<u64>,
    /// Its synthesis had finished.
    pub finished: bool,
}

impl CueReport {
    /// A flush dropped the cue before its first sample: it never started (its cue message has
    /// neither a start nor an end).
    pub fn never_started(&self) -> bool {
        self.action == Action::Flushed && self.first.is_none()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Pending,
    Playing,
}

#[derive(Debug)]
struct Cue {
    id: u64,
    start: CueStart,
    slot: Option<u64>,
    kind: CueKind,
    state: State,
    /// Synthesised samples not yet output: `audio[head..]`.
    audio: Vec<f32>,
    head: usize,
    /// Samples synthesised so far (after compression, for a compressed cue).
    received: u64,
    /// `compress`: the speech's length before it was compressed.
    original: Option<u64>,
    /// Samples output so far.
    pos: u64,
    finished: bool,
    /// Where the output was when it became due.
    due_at: Option<u64>,
    /// Where its slot ends (its start + the slot), once due; `None` without a slot.
    slot_end: Option<u64>,
    first: Option<u64>,
    /// `clip`: the slot's end, where it is cut.
    cut: Option<u64>,
    /// `clip`: the fade's length (the fade is shorter when the slot is).
    fade: u64,
    /// `clip`: the speech is known to go past the cut (the fade applies).
    truncating: bool,
    /// How far the output had passed its PTS when it arrived.
    arrived_late: u64,
    late: u32,
    late_samples: u64,
    /// The last piece output had its audio late.
    in_late_run: bool,
}

impl Cue {
    fn avail(&self) -> u64 {
        self.received - self.pos
    }

    /// How many samples from `n` can be output now (`None`: it is waiting for audio). Playing
    /// cues only, before its end (`finalize` retires ended cues first).
    fn ready(&mut self, n: u64) -> Option<u64> {
        let avail = self.avail();
        let Some(cut) = self.cut else {
            return (avail > 0).then_some(avail);
        };
        let room = cut - n;
        if avail > room {
            self.truncating = true;
        }
        if self.truncating || self.finished {
            return (avail > 0).then_some(avail.min(room));
        }
        // Until it is known whether the speech goes past the cut, stop before the fade.
        let k = avail.min((cut - self.fade).saturating_sub(n));
        (k > 0).then_some(k)
    }

    fn take(&mut self, len: usize) -> &[f32] {
        let s = &self.audio[self.head..self.head + len];
        self.head += len;
        self.pos += len as u64;
        s
    }

    fn compact(&mut self) {
        if self.head > 24_000 && self.head * 2 > self.audio.len() {
            self.audio.drain(..self.head);
            self.head = 0;
        }
    }
}

/// Cues not yet over beyond which the element's sink pad holds its input back (while the output has
/// not reached what the input has told), and the output, not live, does not pass that point.
pub const MAX_QUEUED_CUES: usize = 64;

/// The timeline of one segment; see the module docs.
#[derive(Debug)]
pub struct Timeline {
    policy: Overflow,
    cues: VecDeque<Cue>,
    /// The next output sample's position.
    n: u64,
    /// What the input has told up to: the latest cue PTS or GAP end.
    horizon: u64,
    /// The latest GAP end or slot end of a cue that became due: the output goes at least this
    /// far before EOS.
    input_end: u64,
    ended: bool,
    notices: Vec<Notice>,
}

impl Timeline {
    /// An empty timeline at position 0.
    pub fn new(policy: Overflow) -> Timeline {
        Timeline {
            policy,
            cues: VecDeque::new(),
            n: 0,
            horizon: 0,
            input_end: 0,
            ended: false,
            notices: Vec::new(),
        }
    }

    /// The next output sample's position.
    pub fn position(&self) -> u64 {
        self.n
    }

    /// What the input has told up to (the latest cue PTS or GAP end).
    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    /// Cues not yet over.
    pub fn cues(&self) -> usize {
        self.cues.len()
    }

    /// Synthesised samples not yet output, over all cues.
    pub fn buffered(&self) -> u64 {
        self.cues.iter().map(Cue::avail).sum()
    }

    /// Adds cue `id` (ids are the caller's, unique). `slot`: the text buffer's duration. A cue
    /// whose PTS the output has already passed (live: it arrived after its deadline) is late from
    /// the start: it counts once, by that much. Not under `shift` while a cue to speak is still
    /// queued before it: it starts after that one's speech, and is late only if its audio is not
    /// there then.
    pub fn push_cue(&mut self, id: u64, start: CueStart, slot: Option<u64>, kind: CueKind) {
        let mut arrived_late = 0;
        if let CueStart::At(p) = start {
            self.horizon = self.horizon.max(p);
            let behind_speech = self.policy == Overflow::Shift
                && self.cues.iter().any(|c| c.kind == CueKind::Speech);
            if !behind_speech {
                arrived_late = self.n.saturating_sub(p);
            }
        }
        if arrived_late > 0 && kind != CueKind::Silent {
            self.notices.push(Notice::Late { id, at: self.n });
        }
        let late = (arrived_late > 0) as u32;
        self.cues.push_back(Cue {
            id,
            start,
            slot,
            kind,
            state: State::Pending,
            audio: Vec::new(),
            head: 0,
            received: 0,
            original: None,
            pos: 0,
            finished: false,
            due_at: None,
            slot_end: None,
            first: None,
            cut: None,
            fade: 0,
            truncating: false,
            arrived_late,
            late,
            late_samples: arrived_late,
            in_late_run: false,
        });
    }

    /// A GAP in the input up to `end`: silence may be output up to there, and the stream goes at
    /// least that far.
    pub fn gap(&mut self, end: u64) {
        self.horizon = self.horizon.max(end);
        self.input_end = self.input_end.max(end);
    }

    /// EOS: no more input.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// Synthesised audio of cue `id`, in order. Returns false when the rest of its speech would
    /// never be heard: the cue is over (clipped, or unknown), or under `clip` its speech is
    /// already longer than its slot (it can only be cut there). Its synthesis can stop.
    pub fn add_audio(&mut self, id: u64, samples: &[f32]) -> bool {
        let clip = self.policy == Overflow::Clip;
        match self.cues.iter_mut().find(|c| c.id == id) {
            Some(c) => {
                c.audio.extend_from_slice(samples);
                c.received += samples.len() as u64;
                !(clip && c.slot.is_some_and(|s| c.received > s))
            }
            None => false,
        }
    }

    /// Whether the output needs cue `id`'s audio now: a cue with speech that is playing, or whose
    /// start the output has reached (it waits for that cue's synthesis to go on).
    pub fn needs(&self, id: u64) -> bool {
        self.cues.iter().any(|c| {
            c.id == id
                && c.kind == CueKind::Speech
                && (c.state == State::Playing || c.start.position() <= self.n)
        })
    }

    /// `compress`: cue `id`'s audio is its speech of `original` samples, compressed.
    pub fn compressed(&mut self, id: u64, original: u64) {
        if let Some(c) = self.cues.iter_mut().find(|c| c.id == id) {
            c.original = Some(original);
        }
    }

    /// Cue `id`'s synthesis has finished (whatever the reason): it has no more audio.
    pub fn finish(&mut self, id: u64) {
        if let Some(c) = self.cues.iter_mut().find(|c| c.id == id) {
            c.finished = true;
        }
    }

    /// A flush: every cue is dropped, reported as [`Action::Flushed`] ([`Notice::Done`]) so
    /// that each cue is accounted for: one playing is over where the output is; one not yet due
    /// has no first sample (`first` `None`). The flush's cut is not the policy's: `clipped` is 0.
    pub fn flush(&mut self) {
        let n = self.n;
        for c in std::mem::take(&mut self.cues) {
            if matches!(c.kind, CueKind::Refused(_)) {
                continue;
            }
            // Started only if a sample of it went out (`Notice::Started`): a cue not yet due,
            // or due with none of its audio out (a speech cue whose cancelled synthesis ended
            // without a sample counts as silent from where it became due), has no first sample.
            let mut report = self.report(&c, n);
            report.first = c.first;
            report.end = n;
            report.action = Action::Flushed;
            report.clipped = 0;
            self.notices.push(Notice::Done(report));
        }
    }

    /// The notices collected since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Whether cue `i` may start at `n`: its time has come and, where the order matters (`shift`,
    /// a cue without PTS, a refused cue), every cue before it is over.
    fn eligible(&self, i: usize, n: u64) -> bool {
        let c = &self.cues[i];
        if n < c.start.position() {
            return false;
        }
        let in_order = self.policy == Overflow::Shift
            || matches!(c.start, CueStart::Asap(_))
            || matches!(c.kind, CueKind::Refused(_));
        !in_order || i == 0
    }

    fn report(&self, c: &Cue, end: u64) -> CueReport {
        let shifted = c.due_at.map_or(0, |d| {
            d.saturating_sub(c.start.position())
                .saturating_sub(c.arrived_late)
        });
        let speech = c.original.unwrap_or(c.received);
        let overrun = c.slot.map_or(0, |s| speech.saturating_sub(s));
        let clipped = c.received - c.pos;
        // A silent cue's audio is the silence of its slot: from where it became due to its
        // slot's end. So is a cue to speak whose synthesis ended without a sample (it failed).
        let silent = match c.kind {
            CueKind::Silent => true,
            CueKind::Speech => c.finished && c.received == 0,
            CueKind::Refused(_) => false,
        };
        let (first, end) = if silent {
            (c.due_at, c.slot_end.map_or(end, |e| e.max(end)))
        } else {
            // A cue cut at its slot's end ends there at the latest (one whose whole slot had
            // passed when it became due, live, is retired later than that).
            (c.first, c.cut.map_or(end, |cut| end.min(cut)))
        };
        let action = match (&c.kind, self.policy) {
            (CueKind::Refused(_), _) => Action::Silent,
            _ if silent => Action::Silent,
            (_, p) if p.cuts() && (clipped > 0 || !c.finished) => Action::Clipped,
            (_, Overflow::Compress) if c.original.is_some() => Action::Compressed,
            (_, Overflow::Overlap) if overrun > 0 => Action::Overlapped,
            (_, Overflow::Shift) if shifted > 0 => Action::Shifted,
            (_, Overflow::Shift) if overrun > 0 => Action::Overran,
            _ => Action::Fit,
        };
        CueReport {
            id: c.id,
            start: c.start,
            slot: c.slot,
            speech,
            output: c.pos,
            first,
            end,
            action,
            shifted,
            late: c.late,
            late_samples: c.late_samples,
            clipped,
            overrun,
            compressed: c.original.map(|_| c.received),
            finished: c.finished,
        }
    }

    /// Retires cue `i` at the current position.
    fn retire(&mut self, i: usize) {
        if let Some(c) = self.cues.remove(i) {
            if !c.finished && c.kind == CueKind::Speech {
                self.notices.push(Notice::Cancel { id: c.id });
            }
            let r = self.report(&c, self.n);
            self.notices.push(Notice::Done(r));
        }
    }

    /// Starts the cues that are due and retires the playing ones that are over. Returns a refused
    /// cue that is due.
    fn advance(&mut self) -> Option<(u64, String)> {
        let n = self.n;
        loop {
            let mut changed = false;
            let mut i = 0;
            while i < self.cues.len() {
                let c = &self.cues[i];
                let over = c.state == State::Playing
                    && (c.cut.is_some_and(|cut| n >= cut) || (c.finished && c.avail() == 0));
                if over {
                    self.retire(i);
                    changed = true;
                    continue;
                }
                if c.state == State::Pending && self.eligible(i, n) {
                    if let CueKind::Refused(e) = &c.kind {
                        let r = (c.id, e.clone());
                        self.cues.remove(i);
                        return Some(r);
                    }
                    let silent = c.kind == CueKind::Silent;
                    let c = &mut self.cues[i];
                    c.state = State::Playing;
                    c.due_at = Some(n);
                    // Its slot: from its PTS (a cue without PTS: from now).
                    let begin = match c.start {
                        CueStart::At(p) => p,
                        CueStart::Asap(_) => n,
                    };
                    c.slot_end = c.slot.map(|slot| begin + slot);
                    if self.policy.cuts()
                        && !silent
                        && let Some(cut) = c.slot_end
                    {
                        c.cut = Some(cut);
                        c.fade = CLIP_FADE_SAMPLES.min(cut.saturating_sub(n));
                    }
                    // The stream covers every cue's slot, a silent one's included.
                    if let Some(end) = c.slot_end {
                        self.input_end = self.input_end.max(end);
                    }
                    changed = true;
                    if silent {
                        self.retire(i);
                        continue;
                    }
                }
                i += 1;
            }
            if !changed {
                return None;
            }
        }
    }

    /// The next piece of output, at most `max` samples (≥ 1), paced by `pace`; see the module docs.
    pub fn next(&mut self, max: usize, pace: Pace) -> Step {
        let n = self.n;
        if let Some((id, error)) = self.advance() {
            return Step::Refused { id, error };
        }
        let next_start = self
            .cues
            .iter()
            .filter(|c| c.state == State::Pending)
            .map(|c| c.start.position())
            .filter(|&p| p > n)
            .min();
        let playing: Vec<usize> = (0..self.cues.len())
            .filter(|&i| self.cues[i].state == State::Playing)
            .collect();

        if playing.is_empty() {
            if self.cues.is_empty() && self.ended && n >= self.input_end {
                return Step::End;
            }
            let known = match pace {
                Pace::Exact => self.horizon,
                Pace::Live { settled, .. } => self.horizon.max(settled),
            };
            let bound = match next_start {
                Some(p) => p,
                None if self.ended && self.cues.is_empty() => self.input_end,
                // A cue is pending but not yet due (waits for the one before it): none is playing,
                // so it is due at its own position, which next_start covers; otherwise input.
                None => known,
            };
            let len = (max as u64).min(bound.saturating_sub(n));
            if len == 0 {
                return Step::Wait(Need::Input);
            }
            self.n += len;
            return Step::Silence(len as usize);
        }

        let mut len = max as u64;
        if let Some(p) = next_start {
            len = len.min(p - n);
        }
        if pace == Pace::Exact && !self.ended && self.cues.len() > MAX_QUEUED_CUES {
            // The input is held back with cues that may start at what it has told: not past it.
            len = len.min(self.horizon.saturating_sub(n));
            if len == 0 {
                return Step::Wait(Need::Input);
            }
        }
        let mut contributing = Vec::new();
        let mut starving = Vec::new();
        for &i in &playing {
            match self.cues[i].ready(n) {
                Some(k) => {
                    len = len.min(k);
                    contributing.push(i);
                }
                None => starving.push(i),
            }
        }
        let late = matches!(pace, Pace::Live { late: true, .. });
        if !starving.is_empty() && !late {
            return Step::Wait(Need::Audio);
        }
        let len_us = len as usize;
        let mut out = vec![0.0f32; len_us];
        for &i in &contributing {
            let c = &mut self.cues[i];
            if c.first.is_none() {
                c.first = Some(n);
                self.notices.push(Notice::Started { id: c.id, at: n });
            }
            c.in_late_run = false;
            let fade = c.truncating.then_some((c.cut.unwrap_or(0), c.fade.max(1)));
            let s = c.take(len_us);
            for (j, (o, x)) in out.iter_mut().zip(s).enumerate() {
                let g = match fade {
                    Some((cut, fade)) => {
                        let left = cut - (n + j as u64);
                        (left.min(fade) as f32) / fade as f32
                    }
                    None => 1.0,
                };
                *o += x * g;
            }
            c.compact();
        }
        for &i in &starving {
            let c = &mut self.cues[i];
            c.late_samples += len;
            if !c.in_late_run {
                c.in_late_run = true;
                c.late += 1;
                if c.late == 1 && c.arrived_late == 0 {
                    self.notices.push(Notice::Late { id: c.id, at: n });
                }
            }
        }
        if contributing.len() > 1 {
            // A mix: kept within full scale (a lone voice is output as synthesised).
            for o in &mut out {
                *o = soft_limit(*o);
            }
        }
        self.n += len;
        if contributing.is_empty() {
            Step::Silence(len_us)
        } else {
            Step::Audio(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 480;

    /// A constant "speech" of `len` samples, value `v` (so mixes and cuts are visible).
    fn speech(len: usize, v: f32) -> Vec<f32> {
        vec![v; len]
    }

    /// Runs the timeline non-live to the end; the output samples (silence as 0.0), the sample
    /// ranges that were silence, and the reports by cue id.
    fn run(t: &mut Timeline) -> (Vec<f32>, Vec<(u64, u64)>, Vec<CueReport>) {
        let mut out = Vec::new();
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..100_000 {
            let at = t.position();
            let step = t.next(MAX, Pace::Exact);
            for notice in t.take_notices() {
                if let Notice::Done(r) = notice {
                    reports.push(r);
                }
            }
            match step {
                Step::Audio(s) => out.extend(s),
                Step::Silence(len) => {
                    out.extend(std::iter::repeat_n(0.0, len));
                    match gaps.last_mut() {
                        Some(g) if g.1 == at => g.1 += len as u64,
                        _ => gaps.push((at, at + len as u64)),
                    }
                }
                Step::End => {
                    reports.sort_by_key(|r| r.id);
                    return (out, gaps, reports);
                }
                other => panic!("unexpected {other:?} at {at}"),
            }
        }
        panic!("no end");
    }

    /// Five cues as the SRT test has them (times in samples): a long one, a long gap.
    fn five(policy: Overflow, lens: [usize; 5]) -> Timeline {
        let mut t = Timeline::new(policy);
        let cues = [
            (1_000, 4_000),
            (6_000, 2_000),
            (9_000, 3_000),
            (40_000, 3_000),
            (44_000, 2_000),
        ];
        for (i, (p, d)) in cues.iter().enumerate() {
            let id = i as u64 + 1;
            t.push_cue(id, CueStart::At(*p), Some(*d), CueKind::Speech);
            t.add_audio(id, &speech(lens[i], id as f32));
            t.finish(id);
        }
        t.end();
        t
    }

    #[test]
    fn cues_that_fit_start_on_their_sample_with_silence_between() {
        for policy in [Overflow::Clip, Overflow::Overlap, Overflow::Shift] {
            let mut t = five(policy, [3_000, 1_500, 2_000, 2_500, 1_000]);
            let (out, gaps, reports) = run(&mut t);
            // The last speech ends at 45000, its slot at 46000: silence to there.
            assert_eq!(out.len(), 46_000, "{policy:?}: ends with the last slot");
            assert_eq!(
                gaps,
                [
                    (0, 1_000),
                    (4_000, 6_000),
                    (7_500, 9_000),
                    (11_000, 40_000),
                    (42_500, 44_000),
                    (45_000, 46_000)
                ],
                "{policy:?}"
            );
            assert!(out[1_000..4_000].iter().all(|&x| x == 1.0));
            assert!(out[44_000..45_000].iter().all(|&x| x == 5.0));
            for r in &reports {
                assert_eq!(r.action, Action::Fit, "{policy:?} {r:?}");
                assert_eq!(r.first, Some(r.start.position()));
                assert_eq!(r.output, r.speech);
            }
        }
    }

    #[test]
    fn clip_cuts_at_the_slot_end_with_a_fade() {
        // Cue 2 (slot 6000..8000) speaks 5000 samples.
        let mut t = five(Overflow::Clip, [3_000, 5_000, 2_000, 2_500, 1_000]);
        let (out, gaps, reports) = run(&mut t);
        assert_eq!(out.len(), 46_000);
        assert_eq!(gaps[1], (4_000, 6_000));
        assert_eq!(gaps[2], (8_000, 9_000), "silence from the cut to cue 3");
        let fade_start = 8_000 - CLIP_FADE_SAMPLES as usize;
        assert!(out[6_000..fade_start].iter().all(|&x| x == 2.0));
        // Linear fade to (but not reaching) zero at the cut.
        assert_eq!(out[fade_start], 2.0);
        assert!(out[fade_start..8_000].windows(2).all(|w| w[1] < w[0]));
        assert!((out[7_999] - 2.0 / CLIP_FADE_SAMPLES as f32).abs() < 1e-6);
        let r = &reports[1];
        assert_eq!(r.action, Action::Clipped);
        assert_eq!((r.output, r.clipped, r.overrun), (2_000, 3_000, 3_000));
        assert_eq!(r.end, 8_000);
        assert!(out[9_000..11_000].iter().all(|&x| x == 3.0));
    }

    #[test]
    fn overlap_mixes_the_next_cue_at_its_pts() {
        let mut t = five(Overflow::Overlap, [3_000, 5_000, 2_000, 2_500, 1_000]);
        let (out, gaps, reports) = run(&mut t);
        assert_eq!(out.len(), 46_000);
        assert_eq!(gaps[2], (11_000, 40_000), "no silence before cue 3");
        assert!(out[6_000..9_000].iter().all(|&x| x == 2.0));
        assert!(
            out[9_000..11_000]
                .iter()
                .all(|&x| x == soft_limit(2.0 + 3.0)),
            "mixed, then limited"
        );
        assert_eq!(reports[1].action, Action::Overlapped);
        assert_eq!(reports[1].overrun, 3_000);
        assert_eq!(reports[2].action, Action::Fit);
        assert_eq!(reports[2].first, Some(9_000));
    }

    #[test]
    fn shift_moves_later_cues_never_earlier_than_their_pts() {
        let mut t = five(Overflow::Shift, [3_000, 5_000, 2_000, 2_500, 3_000]);
        let (out, gaps, reports) = run(&mut t);
        // Cue 2 ends at 11000; cue 3 (PTS 9000) starts there and ends at 13000; cue 4 is on time
        // at 40000 (to 42500); cue 5 is on time at 44000 and speaks 3000.
        assert_eq!(gaps[1], (4_000, 6_000));
        assert_eq!(gaps[2], (13_000, 40_000));
        assert!(out[11_000..13_000].iter().all(|&x| x == 3.0));
        assert_eq!(reports[1].action, Action::Overran);
        assert_eq!(
            (reports[2].action, reports[2].shifted),
            (Action::Shifted, 2_000)
        );
        assert_eq!(reports[2].first, Some(11_000));
        assert_eq!(reports[3].action, Action::Fit);
        assert_eq!(reports[4].first, Some(44_000));
        assert_eq!(out.len(), 47_000);

        // A cue due before the previous one ends waits for it, then starts at once.
        let mut t = Timeline::new(Overflow::Shift);
        t.push_cue(1, CueStart::At(0), Some(100), CueKind::Speech);
        t.push_cue(2, CueStart::At(100), Some(100), CueKind::Speech);
        t.add_audio(1, &speech(1_000, 1.0));
        t.add_audio(2, &speech(100, 2.0));
        t.finish(1);
        t.finish(2);
        t.end();
        let (out, gaps, _) = run(&mut t);
        assert!(gaps.is_empty());
        assert_eq!(out.len(), 1_100);
        assert_eq!(out[999..1_001], [1.0, 2.0]);
    }

    /// A flush of a cue that became due but whose synthesis ended (cancelled) before any of its
    /// audio went out: it never started (no `Started` notice, so no first sample in its report),
    /// as a cue not yet due; one with audio out started where it went out.
    #[test]
    fn a_flushed_cue_started_only_if_its_audio_went_out() {
        let mut t = Timeline::new(Overflow::Clip);
        t.push_cue(1, CueStart::At(100), Some(2_000), CueKind::Speech);
        t.push_cue(2, CueStart::At(3_000), Some(2_000), CueKind::Speech);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(100));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Audio));
        t.finish(1);
        t.flush();
        let notices = t.take_notices();
        let reports: Vec<&CueReport> = notices
            .iter()
            .filter_map(|n| match n {
                Notice::Done(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(reports.len(), 2, "{notices:?}");
        assert!(reports.iter().all(|r| r.never_started()), "{notices:?}");
        let mut t = Timeline::new(Overflow::Clip);
        t.push_cue(1, CueStart::At(100), Some(2_000), CueKind::Speech);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(100));
        t.add_audio(1, &speech(50, 1.0));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Audio(speech(50, 1.0)));
        t.flush();
        let notices = t.take_notices();
        assert_eq!(notices[0], Notice::Started { id: 1, at: 100 });
        let Notice::Done(r) = &notices[1] else {
            panic!("{notices:?}")
        };
        assert_eq!((r.first, r.never_started()), (Some(100), false));
    }

    #[test]
    fn waits_for_input_and_audio_when_not_live() {
        let mut t = Timeline::new(Overflow::Clip);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Input));
        t.push_cue(1, CueStart::At(1_000), Some(2_000), CueKind::Speech);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(480));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(480));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(40));
        assert_eq!(t.position(), 1_000);
        // Due, but nothing synthesised yet: wait, however long.
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Audio));
        t.add_audio(1, &speech(100, 1.0));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Audio(speech(100, 1.0)));
        let notices = t.take_notices();
        assert_eq!(notices, [Notice::Started { id: 1, at: 1_000 }]);
        // Within the fade region it must know whether the speech runs past the cut.
        t.add_audio(1, &speech(1_900, 1.0));
        let Step::Audio(s) = t.next(2_000, Pace::Exact) else {
            panic!()
        };
        assert_eq!(s.len(), 2_000 - 100 - CLIP_FADE_SAMPLES as usize);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Audio));
        t.finish(1);
        let Step::Audio(s) = t.next(MAX, Pace::Exact) else {
            panic!()
        };
        assert!(s.iter().all(|&x| x == 1.0), "exactly fits: no fade");
        // The cue is over; the input has told nothing past 1000: wait for it.
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Input));
        let Notice::Done(r) = &t.take_notices()[0] else {
            panic!()
        };
        assert_eq!((r.action, r.end, r.output), (Action::Fit, 3_000, 2_000));
        // A GAP lets silence through; EOS ends the stream at the GAP's end.
        t.gap(3_500);
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(480));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(20));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Wait(Need::Input));
        t.gap(4_000);
        t.end();
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(480));
        assert_eq!(t.next(MAX, Pace::Exact), Step::Silence(20));
        assert_eq!(t.next(MAX, Pace::Exact), Step::End);
    }

    #[test]
    fn silent_refused_and_asap_cues() {
        let mut t = Timeline::new(Overflow::Overlap);
        t.push_cue(1, CueStart::At(0), Some(500), CueKind::Speech);
        t.push_cue(2, CueStart::At(200), Some(500), CueKind::Silent);
        t.push_cue(3, CueStart::Asap(300), None, CueKind::Speech);
        t.push_cue(4, CueStart::At(400), None, CueKind::Refused("bad".into()));
        t.add_audio(1, &speech(1_000, 1.0));
        t.finish(1);
        t.add_audio(3, &speech(100, 3.0));
        t.finish(3);
        let mut out = Vec::new();
        let refused = loop {
            match t.next(MAX, Pace::Exact) {
                Step::Audio(s) => out.extend(s),
                Step::Silence(len) => out.extend(std::iter::repeat_n(0.0, len)),
                Step::Refused { id, error } => break (id, error),
                other => panic!("{other:?}"),
            }
        };
        // The silent cue does not interrupt cue 1; the ASAP cue waits for cue 1 (even in overlap
        // mode); the refused cue comes after the ASAP cue, with all audio before it out.
        assert_eq!(refused, (4, "bad".to_string()));
        assert_eq!(out.len(), 1_100);
        assert!(out[..1_000].iter().all(|&x| x == 1.0));
        assert!(out[1_000..].iter().all(|&x| x == 3.0));
        let reports: Vec<_> = t
            .take_notices()
            .into_iter()
            .filter_map(|n| match n {
                Notice::Done(r) => Some((r.id, r.action, r.first, r.end)),
                _ => None,
            })
            .collect();
        // The silent cue's audio is its slot's silence (under cue 1's speech here).
        assert_eq!(
            reports,
            [
                (2, Action::Silent, Some(200), 700),
                (1, Action::Overlapped, Some(0), 1_000),
                (3, Action::Fit, Some(1_000), 1_100),
            ]
        );
    }

    /// A cue to speak whose synthesis ended without a sample (it failed, or a full engine
    /// refused it) output silence in its slot: it is reported `silent`, not as a cue that fit.
    #[test]
    fn a_speech_cue_that_ends_without_audio_is_reported_silent() {
        for policy in [
            Overflow::Clip,
            Overflow::Overlap,
            Overflow::Shift,
            Overflow::Compress,
        ] {
            let mut t = Timeline::new(policy);
            t.push_cue(1, CueStart::At(0), Some(500), CueKind::Speech);
            t.push_cue(2, CueStart::At(500), Some(500), CueKind::Speech);
            t.finish(1);
            t.add_audio(2, &speech(300, 2.0));
            t.finish(2);
            t.end();
            let (out, _, reports) = run(&mut t);
            assert!(out[..500].iter().all(|&x| x == 0.0), "{policy:?}");
            assert!(out[500..800].iter().all(|&x| x == 2.0), "{policy:?}");
            let reports: Vec<_> = reports
                .iter()
                .map(|r| (r.id, r.action, r.speech, r.output))
                .collect();
            assert_eq!(
                reports,
                [(1, Action::Silent, 0, 0), (2, Action::Fit, 300, 300)],
                "{policy:?}"
            );
        }
    }

    #[test]
    fn eos_comes_after_the_last_slot_a_silent_one_included() {
        for policy in [
            Overflow::Clip,
            Overflow::Overlap,
            Overflow::Shift,
            Overflow::Compress,
        ] {
            // A spoken cue shorter than its slot, then a silent last cue (`♪♪`) at 6000..7000:
            // silence (GAP) to the silent cue's slot end, then EOS.
            let mut t = Timeline::new(policy);
            t.push_cue(1, CueStart::At(1_000), Some(1_000), CueKind::Speech);
            t.push_cue(2, CueStart::At(6_000), Some(1_000), CueKind::Silent);
            t.add_audio(1, &speech(500, 1.0));
            t.finish(1);
            t.end();
            let (out, gaps, reports) = run(&mut t);
            assert_eq!(out.len(), 7_000, "{policy:?}: to the silent cue's slot end");
            assert_eq!(gaps, [(0, 1_000), (1_500, 7_000)], "{policy:?}");
            let r = &reports[1];
            assert_eq!(
                (r.action, r.first, r.end, r.output),
                (Action::Silent, Some(6_000), 7_000, 0),
                "{policy:?}"
            );

            // The last cue's speech shorter than its slot: silence to the slot end; a cue
            // without PTS has its slot from where it starts; a GAP past it goes further.
            let mut t = Timeline::new(policy);
            t.push_cue(1, CueStart::At(0), Some(1_000), CueKind::Speech);
            t.push_cue(2, CueStart::Asap(0), Some(2_000), CueKind::Speech);
            t.add_audio(1, &speech(600, 1.0));
            t.add_audio(2, &speech(300, 2.0));
            t.finish(1);
            t.finish(2);
            t.end();
            let (out, gaps, _) = run(&mut t);
            assert_eq!(out.len(), 2_600, "{policy:?}: cue 2's slot is 600..2600");
            assert_eq!(gaps, [(900, 2_600)], "{policy:?}");
            let mut t = Timeline::new(policy);
            t.push_cue(1, CueStart::At(0), Some(1_000), CueKind::Speech);
            t.add_audio(1, &speech(600, 1.0));
            t.finish(1);
            t.gap(3_000);
            t.end();
            assert_eq!(run(&mut t).0.len(), 3_000, "{policy:?}");
        }
    }

    /// Live, `clip`: a cue that arrives after its whole slot has passed outputs nothing; its
    /// report ends at its slot's end (its lateness counts from its PTS: 1,000 samples).
    #[test]
    fn live_clip_a_cue_past_its_whole_slot_ends_at_its_slot() {
        let live = |settled, late| Pace::Live { settled, late };
        let mut t = Timeline::new(Overflow::Clip);
        assert_eq!(t.next(1_500, live(1_500, false)), Step::Silence(1_500));
        t.push_cue(1, CueStart::At(500), Some(500), CueKind::Speech);
        t.add_audio(1, &speech(300, 1.0));
        t.finish(1);
        t.end();
        while t.next(MAX, live(5_000, false)) != Step::End {}
        let r = t
            .take_notices()
            .into_iter()
            .find_map(|n| match n {
                Notice::Done(r) => Some(r),
                _ => None,
            })
            .expect("its report");
        assert_eq!(
            (r.action, r.first, r.output, r.end, r.late_samples),
            (Action::Clipped, None, 0, 1_000, 1_000)
        );
    }

    /// Live, `shift`: a cue that arrives after its PTS while the cue before it is still playing
    /// past that PTS is shifted, not late: it could not have started sooner, and its audio is
    /// there when its turn comes.
    #[test]
    fn live_shift_a_cue_behind_a_long_one_is_shifted_not_late() {
        let live = |settled, late| Pace::Live { settled, late };
        let mut t = Timeline::new(Overflow::Shift);
        t.push_cue(1, CueStart::At(0), Some(500), CueKind::Speech);
        t.add_audio(1, &speech(1_000, 1.0));
        t.finish(1);
        assert_eq!(t.next(800, live(800, false)), Step::Audio(speech(800, 1.0)));
        // Cue 2 (PTS 600) arrives with the output at 800, inside cue 1's speech.
        t.push_cue(2, CueStart::At(600), Some(500), CueKind::Speech);
        t.add_audio(2, &speech(300, 2.0));
        t.finish(2);
        assert_eq!(
            t.next(MAX, live(1_000, false)),
            Step::Audio(speech(200, 1.0))
        );
        assert_eq!(
            t.next(MAX, live(1_300, false)),
            Step::Audio(speech(300, 2.0))
        );
        t.end();
        while t.next(MAX, live(5_000, false)) != Step::End {}
        let notices = t.take_notices();
        assert!(
            !notices.iter().any(|n| matches!(n, Notice::Late { .. })),
            "{notices:?}"
        );
        let r2 = notices
            .iter()
            .find_map(|n| match n {
                Notice::Done(r) if r.id == 2 => Some(r.clone()),
                _ => None,
            })
            .expect("cue 2's report");
        assert_eq!(
            (r2.late, r2.late_samples, r2.shifted, r2.action),
            (0, 0, 400, Action::Shifted)
        );
        // Arriving after its PTS with nothing before it to play is late, as before.
        let mut t = Timeline::new(Overflow::Shift);
        assert_eq!(t.next(700, live(700, false)), Step::Silence(700));
        t.push_cue(3, CueStart::At(600), Some(500), CueKind::Speech);
        assert_eq!(t.take_notices(), [Notice::Late { id: 3, at: 700 }]);
    }

    #[test]
    fn live_silence_follows_the_clock_and_late_audio_is_replaced() {
        let live = |settled, late| Pace::Live { settled, late };
        let mut t = Timeline::new(Overflow::Shift);
        // No input yet: silence up to what the clock says has arrived.
        assert_eq!(t.next(MAX, live(300, false)), Step::Silence(300));
        assert_eq!(t.next(MAX, live(300, false)), Step::Wait(Need::Input));
        t.push_cue(1, CueStart::At(1_000), Some(1_000), CueKind::Speech);
        t.push_cue(2, CueStart::At(1_500), Some(1_000), CueKind::Speech);
        // A known cue bounds the silence even ahead of the clock.
        assert_eq!(t.next(1_000, live(300, false)), Step::Silence(700));
        // Due, no audio, deadline not passed: wait; passed: silence, counted as late.
        assert_eq!(t.next(MAX, live(1_000, false)), Step::Wait(Need::Audio));
        assert_eq!(t.next(100, live(1_100, true)), Step::Silence(100));
        assert_eq!(t.next(100, live(1_200, true)), Step::Silence(100));
        assert_eq!(t.take_notices(), [Notice::Late { id: 1, at: 1_000 }]);
        t.add_audio(1, &speech(600, 1.0));
        t.finish(1);
        // Chunks end where cue 2 is due (it waits for cue 1 in shift mode).
        assert_eq!(
            t.next(MAX, live(1_200, false)),
            Step::Audio(speech(300, 1.0))
        );
        assert_eq!(
            t.next(MAX, live(1_200, false)),
            Step::Audio(speech(300, 1.0))
        );
        // Cue 1 ended at 1800 (late by 200): shift starts cue 2 there, late again.
        assert_eq!(t.next(MAX, live(1_800, true)), Step::Silence(480));
        let notices = t.take_notices();
        let Notice::Done(r1) = &notices[1] else {
            panic!("{notices:?}")
        };
        assert_eq!((r1.id, r1.late, r1.late_samples), (1, 1, 200));
        assert_eq!(
            (r1.first, r1.end, r1.action),
            (Some(1_200), 1_800, Action::Fit)
        );
        assert_eq!(notices[2], Notice::Late { id: 2, at: 1_800 });
        t.add_audio(2, &speech(100, 2.0));
        t.finish(2);
        assert_eq!(
            t.next(MAX, live(2_280, false)),
            Step::Audio(speech(100, 2.0))
        );
        t.end();
        // Cue 2's slot ends at 2500: the stream goes on to there.
        assert_eq!(t.next(MAX, live(2_380, false)), Step::Silence(120));
        assert_eq!(t.next(MAX, live(2_500, false)), Step::End);
        let Notice::Done(r2) = &t.take_notices()[1] else {
            panic!()
        };
        assert_eq!(
            (r2.shifted, r2.late_samples, r2.action),
            (300, 480, Action::Shifted)
        );
    }

    #[test]
    fn live_late_clip_cue_loses_its_end_and_is_cancelled() {
        let mut t = Timeline::new(Overflow::Clip);
        t.push_cue(1, CueStart::At(0), Some(1_000), CueKind::Speech);
        let late = Pace::Live {
            settled: 5_000,
            late: true,
        };
        assert_eq!(t.next(MAX, late), Step::Silence(480));
        assert_eq!(t.next(MAX, late), Step::Silence(480));
        t.add_audio(1, &speech(2_000, 1.0));
        // 40 samples left before the cut: faded, since the speech is longer.
        let Step::Audio(s) = t.next(MAX, late) else {
            panic!()
        };
        assert_eq!(s.len(), 40);
        assert!(s[0] < 1.0 && s.windows(2).all(|w| w[1] < w[0]));
        let settled = Pace::Live {
            settled: 1_000,
            late: true,
        };
        assert_eq!(t.next(MAX, settled), Step::Wait(Need::Input));
        let notices = t.take_notices();
        assert!(notices.contains(&Notice::Cancel { id: 1 }), "{notices:?}");
        let Some(Notice::Done(r)) = notices.last() else {
            panic!()
        };
        assert_eq!(
            (r.action, r.output, r.late, r.late_samples),
            (Action::Clipped, 40, 1, 960)
        );
        assert!(!t.add_audio(1, &[0.5]), "the cue is over");
        // A cue arriving after its whole slot has passed is late, and clipped to nothing.
        t.push_cue(2, CueStart::At(100), Some(200), CueKind::Speech);
        assert_eq!(t.next(MAX, late), Step::Silence(480));
        let notices = t.take_notices();
        assert_eq!(notices[0], Notice::Late { id: 2, at: 1_000 });
        let Some(Notice::Done(r)) = notices.last() else {
            panic!()
        };
        assert_eq!((r.id, r.action, r.output), (2, Action::Clipped, 0));
        assert_eq!((r.late, r.late_samples), (1, 900));
    }

    #[test]
    fn mixes_stay_within_full_scale_and_a_lone_voice_is_untouched() {
        // The limiter: identity below the knee, continuous, monotonic, below 1 above it.
        assert_eq!(soft_limit(0.5), 0.5);
        assert_eq!(soft_limit(-LIMIT_KNEE), -LIMIT_KNEE);
        assert!((soft_limit(LIMIT_KNEE + 1e-4) - (LIMIT_KNEE + 1e-4)).abs() < 1e-6);
        assert!(soft_limit(1.62) < 1.0 && soft_limit(1.62) > soft_limit(1.2));
        assert!(soft_limit(-9.0) >= -1.0);
        // Five voices at the same sample, each a full-scale sine of its own frequency, as five
        // simultaneous cues under overlap: the mix stays in [-1, 1].
        let len = 4_800;
        let sine = |f: f32| -> Vec<f32> {
            (0..len)
                .map(|i| 0.95 * (std::f32::consts::TAU * f * i as f32 / 24_000.0).sin())
                .collect()
        };
        let mut t = Timeline::new(Overflow::Overlap);
        for id in 1..=5u64 {
            t.push_cue(id, CueStart::At(100), None, CueKind::Speech);
            t.add_audio(id, &sine(110.0 * id as f32));
            t.finish(id);
        }
        // A lone voice afterwards, louder than the knee: untouched.
        t.push_cue(6, CueStart::At(10_000), None, CueKind::Speech);
        let lone = sine(300.0);
        t.add_audio(6, &lone);
        t.finish(6);
        t.end();
        let (out, _, _) = run(&mut t);
        let mix = &out[100..100 + len];
        assert!(mix.iter().all(|x| x.abs() <= 1.0), "mix within full scale");
        let voices: Vec<Vec<f32>> = (1..=5).map(|id| sine(110.0 * id as f32)).collect();
        let unlimited: Vec<f32> = (0..len)
            .map(|i| voices.iter().map(|v| v[i]).sum())
            .collect();
        assert!(
            unlimited.iter().filter(|x| x.abs() > 1.0).count() > 100,
            "the test mix does go past full scale unlimited"
        );
        assert_eq!(
            &out[10_000..],
            &lone[..],
            "a lone voice is output as synthesised"
        );
    }

    #[test]
    fn clip_stops_the_synthesis_of_speech_longer_than_its_slot() {
        // Cue 1 pending (its PTS not reached): under clip, speech past its slot would only be
        // cut, so add_audio asks to stop it; overlap and shift want all of it.
        for (policy, stop) in [
            (Overflow::Clip, true),
            (Overflow::Overlap, false),
            (Overflow::Shift, false),
        ] {
            let mut t = Timeline::new(policy);
            t.push_cue(1, CueStart::At(1_000), Some(500), CueKind::Speech);
            assert!(t.add_audio(1, &speech(500, 0.1)), "{policy:?}: fits so far");
            assert_eq!(!t.add_audio(1, &speech(1, 0.1)), stop, "{policy:?}");
            t.finish(1);
            t.end();
            let (out, _, reports) = run(&mut t);
            let expect = if stop { 1_500 } else { 1_501 };
            assert_eq!(out.len(), expect, "{policy:?}");
            assert_eq!(reports[0].speech, 501);
        }
    }

    #[test]
    fn compress_reports_compressed_cues_and_clips_what_still_does_not_fit() {
        let mut t = Timeline::new(Overflow::Compress);
        // Cue 1: 1200 samples of speech compressed to 800, in a slot of 1000.
        t.push_cue(1, CueStart::At(0), Some(1_000), CueKind::Speech);
        // Cue 2: compressed by the most allowed to 700, its slot 500: cut there, faded.
        t.push_cue(2, CueStart::At(2_000), Some(500), CueKind::Speech);
        // Cue 3: fits as synthesised.
        t.push_cue(3, CueStart::At(3_000), Some(500), CueKind::Speech);
        t.add_audio(1, &speech(800, 0.1));
        t.compressed(1, 1_200);
        t.add_audio(2, &speech(700, 0.2));
        t.compressed(2, 1_050);
        t.add_audio(3, &speech(400, 0.3));
        for id in 1..=3 {
            t.finish(id);
        }
        t.end();
        let (out, _, reports) = run(&mut t);
        // Cue 3's slot end.
        assert_eq!(out.len(), 3_500);
        assert!(out[..800].iter().all(|&x| x == 0.1));
        assert!(out[800..2_000].iter().all(|&x| x == 0.0));
        assert!(out[2_499] < 0.2 && out[2_499] > 0.0, "faded at the cut");
        let r = &reports[0];
        assert_eq!(
            (
                r.action,
                r.speech,
                r.output,
                r.compressed,
                r.overrun,
                r.clipped
            ),
            (Action::Compressed, 1_200, 800, Some(800), 200, 0)
        );
        let r = &reports[1];
        assert_eq!(
            (r.action, r.speech, r.output, r.compressed, r.clipped, r.end),
            (Action::Clipped, 1_050, 500, Some(700), 200, 2_500)
        );
        assert_eq!(
            (reports[2].action, reports[2].compressed),
            (Action::Fit, None)
        );
    }
}
