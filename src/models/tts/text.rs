//! Text rules every model shares: what counts as nothing to speak, and language names with their
//! ISO 639-1 codes.

/// Why a text is refused: nothing in it is spoken.
pub const NOTHING_TO_SPEAK: &str =
    "nothing to speak (empty, or only whitespace, control or invisible characters)";

/// Why a text is refused: it has no word or number for the model to say.
pub const NO_WORDS_TO_SPEAK: &str = "nothing the tokenizer can speak: no letter or digit, only \
     punctuation, symbols or emoji (the model turns such text into noise)";

/// Whether `text` has nothing to speak: it is empty or holds only whitespace, control characters
/// and invisible format characters (soft hyphen, zero-width and bidi marks, word joiners, BOM).
pub fn nothing_to_speak(text: &str) -> bool {
    let invisible = |c: char| {
        matches!(c, '\u{00AD}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206F}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}')
    };
    text.chars()
        .all(|c| c.is_whitespace() || c.is_control() || invisible(c))
}

/// Whether `text` has no letter and no digit outside markup: nothing the tokenizer's
/// pre-tokenizer (Qwen2's byte-level BPE pattern, which Fish S2 Pro's tokenizer shares) makes a
/// word or number piece of, only punctuation and symbol pieces (emoji included). Markup of the
/// special-token form `<|…|>` (a speaker tag such as `<|speaker:0|>`) is not words. The reference
/// speaks such text all the same, as noise: with the bundled voice, greedy, `!!!` gives 0.48 s,
/// four emoji 2.5 s and 120 punctuation marks 35.9 s of sound that says nothing.
pub fn no_words_to_speak(text: &str) -> bool {
    !outside_markup(text).any(|t| t.chars().any(char::is_alphanumeric))
}

/// The byte range of `text`'s first markup of the special-token form `<|…|>` (a `<|` that is
/// not closed is text).
fn markup_span(text: &str) -> Option<(usize, usize)> {
    let start = text.find("<|")?;
    let len = text[start..].find("|>")? + 2;
    Some((start, start + len))
}

/// `text`'s first markup of the special-token form `<|…|>` (such as `<|speaker:0|>`).
pub fn first_markup(text: &str) -> Option<&str> {
    markup_span(text).map(|(start, end)| &text[start..end])
}

/// The spans of `text` outside its markup of the special-token form `<|…|>` (a `<|` that is not
/// closed is text), in order.
pub fn outside_markup(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let r = rest?;
        match markup_span(r) {
            Some((start, end)) => {
                rest = Some(&r[end..]);
                Some(&r[..start])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

/// Why `text` cannot be spoken ([`NOTHING_TO_SPEAK`] or [`NO_WORDS_TO_SPEAK`]), or `None`.
pub fn unspeakable(text: &str) -> Option<&'static str> {
    if nothing_to_speak(text) {
        Some(NOTHING_TO_SPEAK)
    } else if no_words_to_speak(text) {
        Some(NO_WORDS_TO_SPEAK)
    } else {
        None
    }
}

/// ISO 639-1 codes of common language names (those of the released Qwen3-TTS checkpoints'
/// `codec_language_id`), accepted as aliases of the names.
pub const LANGUAGE_CODES: [(&str, &str); 10] = [
    ("en", "english"),
    ("zh", "chinese"),
    ("ja", "japanese"),
    ("ko", "korean"),
    ("de", "german"),
    ("fr", "french"),
    ("ru", "russian"),
    ("pt", "portuguese"),
    ("es", "spanish"),
    ("it", "italian"),
];

/// Resolves a language setting against `supported` (lower-case names, `auto` included, as
/// a [`super::ModelDescription`] lists them): trimmed, case-insensitive, a name or the
/// ISO 639-1 code of one ([`LANGUAGE_CODES`]: `en`, `ZH`, …). Returns the name as `supported`
/// spells it; otherwise a message that lists the supported names with their codes.
pub fn resolve_language(supported: &[String], value: &str) -> Result<String, String> {
    let v = value.trim().to_lowercase();
    let name = LANGUAGE_CODES
        .iter()
        .find(|(code, _)| *code == v)
        .map_or(v.as_str(), |(_, name)| name);
    if let Some(l) = supported.iter().find(|l| l.eq_ignore_ascii_case(name)) {
        return Ok(l.clone());
    }
    let listed: Vec<String> = supported
        .iter()
        .map(|l| {
            match LANGUAGE_CODES
                .iter()
                .find(|(_, n)| l.eq_ignore_ascii_case(n))
            {
                Some((code, _)) => format!("{l} ({code})"),
                None => l.clone(),
            }
        })
        .collect();
    Err(format!(
        "unsupported language; supported: {} (names or ISO 639-1 codes, case-insensitive)",
        listed.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_not_words() {
        for none in [
            "<|speaker:0|>",
            "<|speaker:0|><|speaker:1|>",
            "<|speaker:0|>   <|speaker:1|> . ",
            "<|speaker:0|>😀😀",
            "!!! <|im_end|> ?",
        ] {
            assert!(no_words_to_speak(none), "{none:?}");
            assert_eq!(unspeakable(none), Some(NO_WORDS_TO_SPEAK), "{none:?}");
        }
        for some in [
            "<|speaker:0|>Hi",
            "Hi <|speaker:1|>",
            "<|speaker:0|> 42",
            "<|speaker:0 unclosed",
            "a",
            "你好",
        ] {
            assert!(!no_words_to_speak(some), "{some:?}");
        }
        assert!(
            no_words_to_speak("<| !!"),
            "not closed, and no words either"
        );
    }
}
