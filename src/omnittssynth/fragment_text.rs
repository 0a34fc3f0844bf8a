//! `input-mode=fragments`: the spoken text of a running utterance, made from its fragments'
//! bytes as they arrive, so that it can go to the engine before the utterance ends. What is
//! handed on ([`FragmentText::push`]) is final: more fragments cannot change it, and all of it
//! joined equals what [`cue_text`](super::cue_text::cue_text) makes of the whole utterance's
//! bytes (for text that is UTF-8):
//!
//! - a UTF-8 character cut between fragments waits for its last byte; bytes that are not UTF-8
//!   are dropped, each run reported once ([`Pushed::invalid`]);
//! - `format=pango-markup`: a tag (`<…>`) or entity (`&…;`) cut between fragments waits for its
//!   end (at most [`MAX_HELD`] bytes: longer, it is no markup and is spoken as text);
//! - ASS override blocks (`{\…}`) and `\N` `\n` `\h` likewise;
//! - whitespace runs become one space, none at the start; a space waits for the next word (none
//!   at the end).
//!
//! Not done here, unlike a cue: SSML tags in `format=utf8` text are spoken as text (whether a
//! `<` opens markup is only known from the whole text), and a drawing (`{\p1}` … `{\p0}`) cut
//! between fragments is spoken after its cut.

use super::cue_text::{TextFormat, strip_ass_overrides, strip_markup};
use crate::element_common::utf8_join::Utf8Join;

/// The most bytes held back for a markup construct whose end has not arrived.
pub(super) const MAX_HELD: usize = 256;

/// The text of one utterance's fragments, made final piece by piece.
#[derive(Debug)]
pub(crate) struct FragmentText {
    format: TextFormat,
    /// The fragments' bytes as UTF-8.
    utf8: Utf8Join,
    /// Decoded text not yet final (an unterminated markup construct at its start).
    held: String,
    /// A space is due before the next non-space character.
    space: bool,
    /// Something was handed on (no leading space).
    started: bool,
}

/// What one fragment gave.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Pushed {
    /// Text that is final now (may be empty).
    pub text: String,
    /// Bytes that were not UTF-8: (the first bad byte, its offset in the utterance's bytes).
    pub invalid: Option<(u8, usize)>,
}

impl FragmentText {
    /// The text of an utterance whose buffers are in `format`.
    pub fn new(format: TextFormat) -> FragmentText {
        FragmentText {
            format,
            utf8: Utf8Join::default(),
            held: String::new(),
            space: false,
            started: false,
        }
    }

    /// Adds a fragment's bytes; returns the text that became final.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        let joined = self.utf8.push(bytes);
        self.held.push_str(&joined.text);
        let invalid = joined.invalid;
        let cut = self.final_len();
        let ready: String = self.held.drain(..cut).collect();
        Pushed {
            text: self.clean(&ready),
            invalid,
        }
    }

    /// The end of the text: everything held is final (an unterminated construct is text, an
    /// incomplete character is dropped). Returns the rest of the text, and the bad bytes.
    pub fn finish(&mut self) -> Pushed {
        let invalid = self.utf8.finish();
        let ready = std::mem::take(&mut self.held);
        self.space = false;
        Pushed {
            text: self.clean(&ready),
            invalid,
        }
    }

    /// How much of `held` is final: up to the start of the first markup construct whose end
    /// has not arrived (one that started more than [`MAX_HELD`] bytes before the end is text).
    /// The scan goes as `strip_markup` and `strip_ass_overrides` do, a complete construct at a
    /// time, so that the cut is never inside one.
    fn final_len(&self) -> usize {
        let h = &self.held;
        let pango = self.format == TextFormat::PangoMarkup;
        let mut i = 0;
        while let Some(c) = h[i..].chars().next() {
            let after = &h[i + c.len_utf8()..];
            let (open, end) = match c {
                '<' if pango => match after.find('>') {
                    Some(e) => (false, Some(e + 1)),
                    None => (true, None),
                },
                '&' if pango => match after.find(';') {
                    Some(e) if e < 10 => (false, Some(e + 1)),
                    _ => (after.len() < 10 && !after.contains(';'), None),
                },
                '{' if after.is_empty() => (true, None),
                '{' if after.starts_with('\\') => match after.find('}') {
                    Some(e) => (false, Some(e + 1)),
                    None => (true, None),
                },
                '\\' if after.is_empty() => (true, None),
                _ => (false, None),
            };
            if open && h.len() - i <= MAX_HELD {
                return i;
            }
            i += c.len_utf8() + end.unwrap_or(0);
        }
        h.len()
    }

    /// Final text → spoken text: markup and override codes removed, whitespace collapsed across
    /// fragments.
    fn clean(&mut self, ready: &str) -> String {
        if ready.is_empty() {
            return String::new();
        }
        let text = match self.format {
            TextFormat::Utf8 => ready.to_string(),
            TextFormat::PangoMarkup => strip_markup(ready),
        };
        let text = strip_ass_overrides(&text);
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            if c.is_whitespace() {
                self.space = self.started;
                continue;
            }
            if std::mem::take(&mut self.space) {
                out.push(' ');
            }
            self.started = true;
            out.push(c);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::cue_text::cue_text;
    use super::*;

    /// Every cut of `bytes` into fragments of `sizes` (cycled) gives `cue_text`'s text.
    fn same_as_whole(bytes: &[u8], format: TextFormat, sizes: &[usize]) {
        let want = cue_text(bytes, format).expect("UTF-8");
        let mut t = FragmentText::new(format);
        let (mut got, mut i, mut k) = (String::new(), 0, 0);
        while i < bytes.len() {
            let n = sizes[k % sizes.len()].min(bytes.len() - i);
            let p = t.push(&bytes[i..i + n]);
            assert_eq!(p.invalid, None);
            got.push_str(&p.text);
            i += n;
            k += 1;
        }
        got.push_str(&t.finish().text);
        assert_eq!(got, want, "{format:?} cut in {sizes:?}");
    }

    #[test]
    fn any_cut_gives_the_text_of_the_whole() {
        let cases: [(&str, TextFormat); 4] = [
            ("  Hello   wor\nld.  Café, 你好。 ", TextFormat::Utf8),
            (
                "<i>It</i> rains &amp; it <b>pours</b>, &#233;h.",
                TextFormat::PangoMarkup,
            ),
            ("{\\an8}Top\\Nline {not a block} end", TextFormat::Utf8),
            ("a < b & c > d; e", TextFormat::PangoMarkup),
        ];
        for (text, format) in cases {
            for sizes in [&[1][..], &[2, 3], &[5, 1, 7], &[1000]] {
                same_as_whole(text.as_bytes(), format, sizes);
            }
        }
    }

    #[test]
    fn text_is_final_as_soon_as_it_can_be() {
        let mut t = FragmentText::new(TextFormat::PangoMarkup);
        assert_eq!(t.push(b"Hello <i").text, "Hello");
        assert_eq!(t.push(b">wor").text, " wor");
        assert_eq!(t.push(b"ld &am").text, "ld");
        assert_eq!(t.push(b"p; caf\xc3").text, " & caf");
        assert_eq!(t.push(b"\xa9 ").text, "\u{e9}");
        assert_eq!(t.finish().text, "");
        // An unterminated `<` longer than the bound is text.
        let mut t = FragmentText::new(TextFormat::PangoMarkup);
        assert_eq!(t.push(b"a <").text, "a");
        let long = "b".repeat(MAX_HELD + 1);
        assert!(t.push(long.as_bytes()).text.starts_with(" <b"));
    }

    #[test]
    fn bad_bytes_are_dropped_and_reported() {
        let mut t = FragmentText::new(TextFormat::Utf8);
        let p = t.push(b"ab\xffcd");
        assert_eq!(p.text, "abcd");
        assert_eq!(p.invalid, Some((0xff, 2)));
        let p = t.push(b"e\xc3");
        assert_eq!((p.text.as_str(), p.invalid), ("e", None));
        let p = t.finish();
        assert_eq!(p.invalid, Some((0xc3, 6)));
    }
}
