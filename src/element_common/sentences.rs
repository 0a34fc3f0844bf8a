//! Sentence splitting for the `split-sentences` property: one text becomes one utterance per
//! sentence, queued back to back.
//!
//! Paragraphs are separated by blank lines; a single line break is a space (hard-wrapped prose
//! stays one sentence). Within a paragraph the boundaries are the Unicode sentence boundaries of
//! UAX #29 (`unicode-segmentation`), which handle `.`, `!`, `?`, closing quotes and brackets, and
//! the CJK full stops (`。！？`); a full stop followed by a lower-case word or a number is not a
//! boundary there (so all-lower-case text splits only at `!` and `?`). UAX #29 does break after
//! titles such as "Mr." before a capitalised word, and after a quoted exclamation or question
//! before its speech tag ("Stop!" she said). So a piece that ends in a common English title or a
//! single-letter initial is joined to the next one, a piece that starts in lower case after a
//! closing quote is joined to the one before, and a piece with no letter or digit (stray
//! punctuation, an emoji) goes with its neighbour, so that no text is lost.

use unicode_segmentation::UnicodeSegmentation;

/// Abbreviations after which a full stop does not end an English sentence (compared without the
/// stop, ASCII case-insensitively).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "st", "mt", "jr", "sr", "messrs", "rev", "gen", "col", "capt",
    "lt", "sgt", "gov", "sen", "rep", "hon", "vs", "e.g", "i.e", "cf", "fig", "vol",
];

/// The sentences of `text`, trimmed, in order, every character of `text` but whitespace in one of
/// them; empty for blank text.
pub(crate) fn split_sentences(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    // Pieces with no letter or digit before the first sentence: they go with the next piece.
    let mut prefix = String::new();
    for paragraph in paragraphs(text) {
        let mut previous: Option<&str> = None;
        for piece in paragraph.split_sentence_bounds() {
            let piece = piece.trim();
            if piece.is_empty() {
                continue;
            }
            if !piece.chars().any(char::is_alphanumeric) {
                match out.last_mut() {
                    Some(last) if prefix.is_empty() => append(last, piece),
                    _ => append(&mut prefix, piece),
                }
                continue;
            }
            let join = previous.is_some_and(|p| ends_in_abbreviation(p) || speech_tag(p, piece));
            let piece_with_prefix = if prefix.is_empty() {
                piece.to_string()
            } else {
                let mut p = std::mem::take(&mut prefix);
                append(&mut p, piece);
                p
            };
            match out.last_mut() {
                Some(last) if join => append(last, &piece_with_prefix),
                _ => out.push(piece_with_prefix),
            }
            previous = Some(piece);
        }
    }
    if !prefix.is_empty() {
        out.push(prefix);
    }
    out
}

/// `text`'s paragraphs (separated by blank lines), each with its line breaks as spaces.
fn paragraphs(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() {
            if !current.is_empty() {
                out.push(std::mem::take(&mut current));
            }
        } else {
            append(&mut current, line);
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// Appends `piece` to `s`, with a space between them when `s` is not empty.
fn append(s: &mut String, piece: &str) {
    if !s.is_empty() {
        s.push(' ');
    }
    s.push_str(piece);
}

/// Whether `piece` is the speech tag of the quoted exclamation or question `previous`
/// ("Stop!" | she said.): `previous` ends in `!` or `?` and a closing quote, `piece` starts in
/// lower case.
fn speech_tag(previous: &str, piece: &str) -> bool {
    let quoted = previous
        .strip_suffix(['"', '\'', '\u{201d}', '\u{2019}'])
        .is_some_and(|p| p.ends_with(['!', '?']));
    let lower = piece
        .chars()
        .find(|c| c.is_alphanumeric())
        .is_some_and(char::is_lowercase);
    quoted && lower
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
    fn line_breaks_are_spaces_and_blank_lines_end_paragraphs() {
        assert_eq!(
            split_sentences(
                "Neither Elizabeth nor\r\nJane could say a word.\n\n  Chapter Two\n\nIt rained."
            ),
            [
                "Neither Elizabeth nor Jane could say a word.",
                "Chapter Two",
                "It rained."
            ]
        );
    }

    #[test]
    fn a_full_stop_before_lower_case_or_a_digit_is_not_a_boundary() {
        // UAX #29 rule SB8: all-lower-case text splits only at `!` and `?`.
        assert_eq!(
            split_sentences("is it late? yes it is. we walked home! the end."),
            ["is it late?", "yes it is. we walked home!", "the end."]
        );
        assert_eq!(
            split_sentences("He left. 3 men came in. Then 2 more."),
            ["He left. 3 men came in.", "Then 2 more."]
        );
    }

    #[test]
    fn no_text_is_lost() {
        assert_eq!(split_sentences("Hello. 😀! Bye."), ["Hello. 😀!", "Bye."]);
        assert_eq!(split_sentences("(!) Fine. Next."), ["(!) Fine.", "Next."]);
        assert_eq!(split_sentences("..."), ["..."]);
        assert_eq!(split_sentences("* * *\n\nIt began."), ["* * * It began."]);
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
