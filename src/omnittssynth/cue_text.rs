//! The text of one cue: a `text/x-raw` buffer's bytes checked as UTF-8 and, for
//! `format=pango-markup` (what `subparse` emits for SRT, WebVTT, SSA), the markup stripped to the
//! text it shows: tags removed, entities (`&amp;`, `&#233;`, …) decoded. In both formats the
//! ASS/SSA override codes that subparse passes through from SSA, ASS and some SRT files are
//! removed as a subtitle renderer does ([`strip_ass_overrides`]: `{\an8}`, `{\i1}`,
//! `{\pos(…)}` blocks dropped, `\N`, `\n` and `\h` spoken as spaces, drawings dropped). Lines
//! are joined with a space, as the cue is spoken as one utterance.

use crate::element_common::text_checks::leading_entity;

/// The sink caps' `format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextFormat {
    /// Plain UTF-8 text.
    Utf8,
    /// Pango markup (UTF-8).
    PangoMarkup,
}

impl TextFormat {
    /// The format named by caps' `format` field.
    pub fn from_caps_format(format: &str) -> Option<TextFormat> {
        match format {
            "utf8" => Some(TextFormat::Utf8),
            "pango-markup" => Some(TextFormat::PangoMarkup),
            _ => None,
        }
    }
}

/// The spoken text of a buffer's `bytes` in `format`. Errors: the bytes are not UTF-8 (naming the
/// first bad byte and its offset).
pub fn cue_text(bytes: &[u8], format: TextFormat) -> Result<String, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        format!(
            "the text is not UTF-8: byte 0x{:02x} at offset {at} of {} (text/x-raw carries UTF-8; \
             convert the file's encoding, or let subparse detect it)",
            bytes[at],
            bytes.len()
        )
    })?;
    let text = match format {
        TextFormat::Utf8 => text.to_string(),
        TextFormat::PangoMarkup => strip_markup(text),
    };
    let text = strip_ass_overrides(&text);
    Ok(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Pango markup → the text it shows: tags (`<i>`, `<span …>`) removed, the XML entities and
/// character references decoded; an `&` that starts no known entity stays as it is.
pub fn strip_markup(markup: &str) -> String {
    let mut out = String::with_capacity(markup.len());
    let mut rest = markup;
    while let Some(c) = rest.chars().next() {
        match c {
            '<' => match rest.find('>') {
                Some(end) => rest = &rest[end + 1..],
                None => {
                    // An unterminated tag: not markup, keep the text.
                    out.push_str(rest);
                    rest = "";
                }
            },
            '&' => {
                let (c, len) = leading_entity(rest);
                out.push(c);
                rest = &rest[len..];
            }
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
    }
    out
}

/// ASS/SSA text → the text a subtitle renderer shows: override blocks (`{\an8}`, `{\i1}`,
/// `{\pos(10,20)}`, `{\c&H00FF00&\b1}`, any `{…}` that starts with a backslash) removed; the
/// hard and soft line breaks `\N`, `\n` and the hard space `\h` become spaces; the drawing
/// commands between `{\p1}` (any `\p` other than `\p0`) and `{\p0}` are dropped, as they are
/// shapes, not text. A `{` that opens no override block, an unterminated block and any other
/// backslash stay as they are.
pub fn strip_ass_overrides(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut drawing = false;
    while let Some(c) = rest.chars().next() {
        if c == '{'
            && rest[1..].starts_with('\\')
            && let Some(end) = rest.find('}')
        {
            if let Some(scale) = drawing_scale(&rest[1..end]) {
                drawing = scale != 0;
            }
            rest = &rest[end + 1..];
            continue;
        }
        if c == '\\' && matches!(rest[1..].chars().next(), Some('N' | 'n' | 'h')) {
            if !drawing {
                out.push(' ');
            }
            rest = &rest[2..];
            continue;
        }
        if !drawing {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The last `\p<scale>` (drawing mode) of an override block's codes, if any (`\pos`, `\pbo`
/// are other codes).
fn drawing_scale(codes: &str) -> Option<u32> {
    codes
        .split('\\')
        .filter_map(|code| code.strip_prefix('p'))
        .filter_map(|n| n.trim().parse::<u32>().ok())
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_stripped_as_subparse_writes_it() {
        let m =
            "<i>Hello</i>, <span foreground=\"red\">Tom &amp; Jerry</span>\n&lt;3 &#233;t&#xE9;";
        assert_eq!(
            cue_text(m.as_bytes(), TextFormat::PangoMarkup).unwrap(),
            "Hello, Tom & Jerry <3 été"
        );
        // Plain text keeps what looks like markup.
        assert_eq!(
            cue_text(b"<i>a</i> &amp;", TextFormat::Utf8).unwrap(),
            "<i>a</i> &amp;"
        );
        assert_eq!(strip_markup("a & b &bogus; c <"), "a & b &bogus; c <");
        assert_eq!(strip_markup("&#1114112;"), "&#1114112;", "not a char");
    }

    #[test]
    fn ass_override_codes_are_removed_as_a_renderer_does() {
        let ass = "{\\an8}{\\pos(320,40)}Top{\\i1} line{\\i0}\\Nsecond\\nthird\\hfourth";
        assert_eq!(
            cue_text(ass.as_bytes(), TextFormat::PangoMarkup).unwrap(),
            "Top line second third fourth"
        );
        assert_eq!(
            cue_text(b"{\\c&H00FF00&\\b1}Green{\\r} text", TextFormat::Utf8).unwrap(),
            "Green text"
        );
        // Pango markup and override codes together, as subparse passes SRT with both.
        assert_eq!(
            cue_text(b"<i>{\\an8}Hi</i> &amp; bye", TextFormat::PangoMarkup).unwrap(),
            "Hi & bye"
        );
        // Drawings are shapes, not text.
        assert_eq!(
            strip_ass_overrides("A{\\p1}m 0 0 l 100 0 100 100{\\p0}B"),
            "AB"
        );
        assert_eq!(strip_ass_overrides("{\\pos(1,2)}x"), "x");
        // Braces and backslashes that are no override codes stay.
        assert_eq!(
            strip_ass_overrides("{note} a\\b {\\open"),
            "{note} a\\b {\\open"
        );
    }

    #[test]
    fn whitespace_is_collapsed_and_bad_bytes_are_named() {
        assert_eq!(
            cue_text(b"  two\r\n lines \t", TextFormat::Utf8).unwrap(),
            "two lines"
        );
        assert_eq!(cue_text(b" \n ", TextFormat::PangoMarkup).unwrap(), "");
        let e = cue_text(b"caf\xe9!", TextFormat::Utf8).unwrap_err();
        assert!(e.contains("byte 0xe9 at offset 3 of 5"), "{e}");
    }
}
