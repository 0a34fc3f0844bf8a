//! `input-mode=fragments`: text buffers are fragments of a running utterance (an LLM's reply
//! from appsrc or an LLM element upstream) rather than timed cues. The utterance is spoken while
//! its text arrives, as `omnittssrc`'s `append-text` speaks it:
//!
//! - it opens at the first fragment whose text has something to speak (a letter or a digit):
//!   one cue at the PTS of the utterance's first fragment with more than whitespace, with no
//!   duration (its speech is as long as it is), so its audio starts at that fragment's running
//!   time;
//! - each fragment's text goes to it as it comes ([`fragment_text`](super::fragment_text): as
//!   bytes, so that a fragment may end in the middle of a UTF-8 character or of a markup tag);
//! - in token mode (checkpoints whose streaming prompt mode is good) one engine request takes
//!   the text token by token as it becomes final; in clause mode (`streaming_prompt: false` in
//!   the checkpoint's `omnitts.json`, or `prompt-mode=non-streaming`) each clause is spoken once
//!   it is complete ([`clause_speech`](crate::element_common::clause_speech)); the
//!   `omnitts/text-stream-mode` message says which, and why.
//!
//! Its first audio thus comes one engine step after the text of its first codec frame (token
//! mode) or after its first clause is complete and synthesised (clause mode), not after its end.
//! It ends at:
//!
//! - a fragment with the `MARKER` buffer flag (it ends the utterance, itself included);
//! - the custom downstream event [`END_TEXT_EVENT`] (`omnitts/end-text`);
//! - a pause: the text so far ends a sentence (`.` `!` `?` `…` `。` `！` `？`, closing quotes or
//!   brackets after it allowed) and the next fragment's PTS, or the end of a GAP event, is at
//!   least `fragment-pause` ms of stream time after the last fragment's PTS (the utterance ends
//!   before that fragment);
//! - EOS (the text so far is spoken before it); a flush drops the text and stops its speech, as
//!   it drops the cues.

use std::sync::Arc;

use gst::ClockTime;
use gst::glib;

use crate::element_common::backend::OpenText;

use super::fragment_text::FragmentText;

/// The `input-mode` property: what a text buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsSynthInputMode")]
pub enum InputMode {
    /// Every buffer is a cue, timed by its PTS and duration.
    #[default]
    #[enum_value(
        name = "Cues: every text buffer is a cue spoken at its PTS within its duration",
        nick = "cues"
    )]
    Cues = 0,
    /// Buffers are fragments of a running utterance.
    #[enum_value(
        name = "Fragments: text buffers join into one utterance, spoken from the first's PTS",
        nick = "fragments"
    )]
    Fragments = 1,
}

/// The custom downstream event (serialized) that ends the utterance of the fragments before it.
pub const END_TEXT_EVENT: &str = "omnitts/end-text";

/// The default `fragment-pause`, ms.
pub const DEFAULT_PAUSE_MS: u32 = 500;

/// The utterance being spoken while its fragments arrive: its cue and its open text.
#[derive(Debug, Clone)]
pub(crate) struct OpenCue {
    /// The cue's id.
    pub id: u64,
    /// Where its text goes (the synthesis worker takes it from there).
    pub open: Arc<OpenText>,
}

/// The fragments of the utterance in progress.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// The fragments' bytes, joined.
    pub bytes: Vec<u8>,
    /// PTS of the first fragment with more than whitespace (the utterance's).
    pub pts: Option<ClockTime>,
    /// PTS of the last fragment that had one.
    pub last_pts: Option<ClockTime>,
    /// The spoken text made from the bytes as they come (created with the first fragment).
    pub text: Option<FragmentText>,
    /// Spoken text not yet given to the open utterance (before it opens: text with nothing to
    /// speak yet).
    pub pending: String,
    /// The open utterance, once its text had something to speak.
    pub open: Option<OpenCue>,
    /// Opening the utterance was refused (its error is on the timeline): the rest of its text
    /// is dropped.
    pub refused: bool,
    /// The open utterance's synthesis ended (the model's end of speech, `max-new-tokens`) before
    /// its text did: the rest is not spoken, and a warning has said so.
    pub unspoken: bool,
}

impl Fragments {
    /// Adds a fragment.
    pub fn push(&mut self, bytes: &[u8], pts: Option<ClockTime>) {
        // The utterance's time is that of its first fragment with more than whitespace: an
        // LLM's reply often starts with a line break well before its first word.
        if pts.is_some() && self.bytes.iter().all(u8::is_ascii_whitespace) {
            self.pts = pts;
        }
        self.bytes.extend_from_slice(bytes);
        if pts.is_some() {
            self.last_pts = pts;
        }
    }

    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Whether the text so far ends a sentence (trailing spaces, closing quotes and brackets
    /// aside).
    pub fn ends_sentence(&self) -> bool {
        let text = String::from_utf8_lossy(&self.bytes);
        let trimmed = text.trim_end().trim_end_matches(|c: char| {
            matches!(
                c,
                '"' | '\'' | ')' | ']' | '»' | '”' | '’' | '」' | '』' | '）'
            )
        });
        trimmed.ends_with(['.', '!', '?', '…', '。', '！', '？'])
    }

    /// Whether stream time `at` is a pause after a sentence end: the utterance ends before it.
    pub fn paused_at(&self, at: Option<ClockTime>, pause: ClockTime) -> bool {
        match (self.last_pts, at) {
            (Some(last), Some(at)) => at >= last + pause && self.ends_sentence(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_utterance_is_timed_by_its_first_fragment_with_more_than_whitespace() {
        let at = ClockTime::from_seconds;
        let mut f = Fragments::default();
        f.push(b"\n ", Some(at(0)));
        f.push(b"  ", Some(at(1)));
        assert_eq!(f.pts, Some(at(1)));
        f.push(b"Hello th", Some(at(2)));
        f.push(b"ere.", Some(at(3)));
        assert_eq!(f.pts, Some(at(2)));
        // A first fragment with words keeps its time; one without PTS takes none.
        let mut f = Fragments::default();
        f.push(b"Hi", Some(at(5)));
        f.push(b" there", None);
        assert_eq!(f.pts, Some(at(5)));
    }

    #[test]
    fn a_pause_ends_a_sentence_only() {
        let ms = ClockTime::from_mseconds;
        let mut f = Fragments::default();
        f.push("Hello wor".as_bytes(), Some(ms(100)));
        f.push("ld. ".as_bytes(), Some(ms(150)));
        assert_eq!(f.pts, Some(ms(100)));
        assert!(f.ends_sentence());
        assert!(!f.paused_at(Some(ms(649)), ms(500)));
        assert!(f.paused_at(Some(ms(650)), ms(500)));
        f.push("And th".as_bytes(), Some(ms(700)));
        assert!(!f.paused_at(Some(ms(5_000)), ms(500)), "no sentence end");
        f.push("en?\" ".as_bytes(), None);
        assert!(f.paused_at(Some(ms(1_200)), ms(500)), "from the last PTS");
        // Half a UTF-8 character is no sentence end, and no error.
        let mut f = Fragments::default();
        f.push(&"Fin。".as_bytes()[..4], Some(ms(0)));
        assert!(!f.ends_sentence());
    }
}
