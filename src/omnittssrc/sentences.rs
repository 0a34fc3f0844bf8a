//! Sentence splitting for the `split-sentences` property: one text becomes one utterance per
//! sentence, queued back to back.
//!
//! Boundaries are the Unicode sentence boundaries of UAX #29 (`unicode-segmentation`), which
//! handle `.`, `!`, `?`, closing quotes and brackets, and the CJK full stops (`。！？`). UAX #29 also
//! breaks after abbreviations such as "Mr." before a capitalised word, and after a quoted
//! exclamation or question before its speech tag ("Stop!" she said). So a piece that ends in a
//! common English title or a single-letter initial is joined to the next one, and a piece that
//! starts with a lower-case letter, or holds no letter or digit (stray punctuation), is joined to
//! the one before.

use unicode_segmentation::UnicodeSegmentation;

/// Abbreviations after which a full stop does not end an English sentence (compared without the
/// stop, ASCII case-insensitively).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "jr", "sr", "messrs", "rev", "gen", "col", "capt",
    "lt", "sgt", "gov", "sen", "rep", "hon", "vs", "e.g", "i.e", "cf", "fig", "vol",
];

/// The sentences of `text`, trimmed, in order; `text` itself (trimmed) when it holds one sentence
/// or none. Never empty for text that holds a letter or digit; empty for blank text.
pub(crate) fn split_sentences(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut joined_to_next = false;
    for piece in text.unicode_sentences() {
        let piece = piece.trim();
        if piece.is_empty() {
            continue;
        }
        let speakable = piece.chars().any(char::is_alphanumeric);
        let continues = piece
            .chars()
            .find(|c| c.is_alphabetic())
            .is_some_and(char::is_lowercase);
        match out.last_mut() {
            Some(last) if joined_to_next || continues || !speakable => {
                last.push(' ');
                last.push_str(piece);
            }
            _ => out.push(piece.to_string()),
        }
        joined_to_next = out.last().is_some_and(|s| ends_in_abbreviation(s));
    }
    out
}

/// Whether `s` ends in "<abbreviation>." or "<single letter>." (an initial, as in "J. Smith").
fn ends_in_abbreviation(s: &str) -> bool {
    let Some(body) = s.strip_suffix('.') else {
        return false;
    };
    let word = body
        .rsplit(|c: char| c.is_whitespace() || c == '(' || c == '"' || c == '\u{201c}')
        .next()
        .unwrap_or(body);
    let mut chars = word.chars();
    let single_letter =
        matches!((chars.next(), chars.next()), (Some(c), None) if c.is_alphabetic());
    single_letter || ABBREVIATIONS.iter().any(|a| a.eq_ignore_ascii_case(word))
}

#[cfg(test)]
mod tests {
    use super::split_sentences;

    #[test]
    fn splits_at_sentence_ends() {
        assert_eq!(
            split_sentences("Hello there. How are you? Fine!  Thanks."),
            ["Hello there.", "How are you?", "Fine!", "Thanks."]
        );
    }

    #[test]
    fn one_sentence_and_blank_text() {
        assert_eq!(
            split_sentences("  No full stop at the end "),
            ["No full stop at the end"]
        );
        assert!(split_sentences("   ").is_empty());
        assert!(split_sentences("").is_empty());
    }

    #[test]
    fn keeps_titles_initials_and_decimals_inside_a_sentence() {
        assert_eq!(
            split_sentences("Mr. Darcy met Mrs. Bennet and J. Smith. It cost 3.5 pounds."),
            [
                "Mr. Darcy met Mrs. Bennet and J. Smith.",
                "It cost 3.5 pounds."
            ]
        );
    }

    #[test]
    fn words_that_are_also_abbreviations_end_sentences() {
        // "no" and "etc." end sentences far more often than they abbreviate.
        assert_eq!(
            split_sentences("He said no. Then he left, etc. The end."),
            ["He said no.", "Then he left, etc.", "The end."]
        );
    }

    #[test]
    fn quotes_and_lowercase_continuations() {
        assert_eq!(
            split_sentences("\"Stop!\" she said. \"Why?\" He left."),
            ["\"Stop!\" she said.", "\"Why?\"", "He left."]
        );
        // A stop followed by a lower-case word is not a boundary (UAX #29 rule SB8).
        assert_eq!(
            split_sentences("See e.g. the notes."),
            ["See e.g. the notes."]
        );
    }

    #[test]
    fn cjk_full_stops_and_stray_punctuation() {
        assert_eq!(
            split_sentences("你好。今天天气很好！"),
            ["你好。", "今天天气很好！"]
        );
        assert_eq!(split_sentences("Wait... ... Go."), ["Wait... ...", "Go."]);
    }
}
