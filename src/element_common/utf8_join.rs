//! Text that arrives as bytes in pieces: an application's C strings (`append-text` from C may cut
//! a UTF-8 character between two calls), omnittssynth's text buffers. A character cut between
//! pieces waits for its other bytes; bytes that are not UTF-8 are dropped and reported, so that
//! nothing an application sends can make the element fail.

/// The UTF-8 text of pieces of bytes, joined as they come.
#[derive(Debug, Default)]
pub(crate) struct Utf8Join {
    /// Bytes of an incomplete character at the end of the last piece.
    partial: Vec<u8>,
    /// Bytes taken so far (for the offsets of bad bytes).
    offset: usize,
}

/// What one piece gave.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Joined {
    /// The text that is complete now (may be empty).
    pub text: String,
    /// The first byte that was not UTF-8 and its offset in all the bytes taken, if any.
    pub invalid: Option<(u8, usize)>,
}

impl Utf8Join {
    /// Adds a piece: the text it completes, and the first bad byte among it.
    pub fn push(&mut self, bytes: &[u8]) -> Joined {
        let mut at = self.offset - self.partial.len();
        self.offset += bytes.len();
        let mut buf = std::mem::take(&mut self.partial);
        buf.extend_from_slice(bytes);
        let mut out = Joined::default();
        let mut rest: &[u8] = &buf;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.text.push_str(s);
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // Checked valid by from_utf8 just above.
                    out.text
                        .push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            // An incomplete character at the end: wait for its other bytes.
                            self.partial = rest[valid..].to_vec();
                            return out;
                        }
                        Some(n) => {
                            out.invalid.get_or_insert((rest[valid], at + valid));
                            rest = &rest[valid + n..];
                            at += valid + n;
                        }
                    }
                }
            }
        }
    }

    /// All of a text's bytes at once: its UTF-8 text, and the first bad byte (an incomplete
    /// character at the end included).
    pub fn whole(bytes: &[u8]) -> Joined {
        let mut join = Utf8Join::default();
        let mut joined = join.push(bytes);
        joined.invalid = joined.invalid.or(join.finish());
        joined
    }

    /// The end of the bytes: an incomplete character left is dropped, and reported (its first
    /// byte and offset). The joiner starts afresh.
    pub fn finish(&mut self) -> Option<(u8, usize)> {
        let invalid = self
            .partial
            .first()
            .map(|&b| (b, self.offset - self.partial.len()));
        *self = Utf8Join::default();
        invalid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_cut_anywhere_are_joined() {
        let text = "Café 你好 — €12.50 😀.";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            for cut2 in cut..bytes.len() {
                let mut j = Utf8Join::default();
                let mut got = String::new();
                for piece in [&bytes[..cut], &bytes[cut..cut2], &bytes[cut2..]] {
                    let p = j.push(piece);
                    assert_eq!(p.invalid, None);
                    got.push_str(&p.text);
                }
                assert_eq!(j.finish(), None);
                assert_eq!(got, text, "cut at {cut}, {cut2}");
            }
        }
    }

    #[test]
    fn bad_bytes_are_dropped_and_reported() {
        let mut j = Utf8Join::default();
        let p = j.push(b"ab\xffcd");
        assert_eq!((p.text.as_str(), p.invalid), ("abcd", Some((0xff, 2))));
        let p = j.push(b"e\xc3");
        assert_eq!((p.text.as_str(), p.invalid), ("e", None));
        // An incomplete character at the end is dropped.
        assert_eq!(j.finish(), Some((0xc3, 6)));
        assert_eq!(j.push(b"x").text, "x");
        let w = Utf8Join::whole(b"ok\xe2\x82");
        assert_eq!((w.text.as_str(), w.invalid), ("ok", Some((0xe2, 2))));
    }
}
