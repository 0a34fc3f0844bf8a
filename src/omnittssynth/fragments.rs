//! `input-mode=fragments`: text buffers are fragments of a running utterance (an LLM's reply
//! from appsrc or an LLM element upstream) rather than timed cues. Fragments join, as bytes (a
//! fragment may end in the middle of a UTF-8 character), until an end:
//!
//! - a fragment with the `MARKER` buffer flag (it ends the utterance, itself included);
//! - the custom downstream event [`END_TEXT_EVENT`] (`omnitts/end-text`);
//! - a pause: the text so far ends a sentence (`.` `!` `?` `…` `。` `！` `？`, closing quotes or
//!   brackets after it allowed) and the next fragment's PTS, or the end of a GAP event, is at
//!   least `fragment-pause` ms of stream time after the last fragment's PTS (the utterance ends
//!   before that fragment);
//! - EOS (the text so far is spoken before it); a flush drops the text, as it drops the cues.
//!
//! The joined text becomes one cue with the PTS of its first fragment and no duration (its
//! speech is as long as it is), so its audio starts at the first fragment's running time.

use gst::ClockTime;
use gst::glib;

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
        name = "Fragments: text buffers join into one utterance until an end (MARKER flag, \
                omnitts/end-text event, a sentence end followed by fragment-pause, EOS), spoken \
                from the first fragment's PTS",
        nick = "fragments"
    )]
    Fragments = 1,
}

/// The custom downstream event (serialized) that ends the utterance of the fragments before it.
pub const END_TEXT_EVENT: &str = "omnitts/end-text";

/// The default `fragment-pause`, ms.
pub const DEFAULT_PAUSE_MS: u32 = 500;

/// The fragments of the utterance in progress.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    /// The fragments' bytes, joined.
    pub bytes: Vec<u8>,
    /// PTS of the first fragment (the utterance's).
    pub pts: Option<ClockTime>,
    /// PTS of the last fragment that had one.
    pub last_pts: Option<ClockTime>,
}

impl Fragments {
    /// Adds a fragment.
    pub fn push(&mut self, bytes: &[u8], pts: Option<ClockTime>) {
        if self.bytes.is_empty() && self.pts.is_none() {
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
