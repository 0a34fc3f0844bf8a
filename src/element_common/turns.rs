//! Speaker-turn tags in text (a model's
//! [`ModelDescription::speaker_turn_tag`](crate::models::tts::ModelDescription), Fish S2 Pro's
//! `<|speaker:N|>`): where a text's turns begin, and which tag each piece of a text cut into
//! sentences (`split-sentences`) or clauses (clause mode) is spoken with, so that a turn's later
//! pieces keep its speaker.
//!
//! A tag is the model's tag start (`<|speaker:`), a number (one or more Unicode decimal digits,
//! as the reference's `\d+`) and `|>`; anything else (`<|speaker:x|>`, an unclosed start) is
//! text, as the model takes it.

/// `text` cut before each of its whole turn tags (`tag` is the tag start): the text before the
/// first tag (possibly empty), then each turn from its tag on.
pub(crate) fn turns<'a>(text: &'a str, tag: &'a str) -> impl Iterator<Item = &'a str> {
    let mut cuts: Vec<usize> = whole_tags(text, tag).filter(|&i| i > 0).collect();
    cuts.push(text.len());
    let mut from = 0;
    cuts.into_iter().map(move |to| {
        let turn = &text[from..to];
        from = to;
        turn
    })
}

/// The text before `text`'s first whole turn tag, when it has a tag and that text has words (the
/// model speaks turns only, so it is not spoken); `None` otherwise.
pub(crate) fn untagged_lead<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let first = whole_tags(text, tag).next()?;
    let lead = &text[..first];
    (!crate::models::tts::text::no_words_to_speak(lead)).then_some(lead.trim())
}

/// Gives each piece of a text, in order, its turn's tag.
#[derive(Debug, Clone)]
pub(crate) struct TurnCarry {
    /// The tag start.
    tag: &'static str,
    /// The tag of the turn the next piece is in, once a tag was seen.
    speaker: Option<String>,
}

impl TurnCarry {
    /// For the model's tag start `tag` (e.g. `<|speaker:`).
    pub fn new(tag: &'static str) -> Self {
        TurnCarry { tag, speaker: None }
    }

    /// The tag start.
    pub fn tag(&self) -> &'static str {
        self.tag
    }

    /// `piece` as it is spoken: a piece that does not open with a whole tag gets the current
    /// turn's tag in front (none before the first tag); the last whole tag in it becomes the
    /// current one.
    pub fn carry(&mut self, piece: &str) -> String {
        let body = piece.trim_start();
        let opens_a_turn = body.starts_with(self.tag) && closed_tag(body, self.tag).is_some();
        let out = match &self.speaker {
            Some(s) if !opens_a_turn => format!("{s}{body}"),
            _ => piece.to_string(),
        };
        if let Some(last) = piece
            .rmatch_indices(self.tag)
            .find_map(|(i, _)| closed_tag(&piece[i..], self.tag))
        {
            self.speaker = Some(last.to_string());
        }
        out
    }
}

/// The offsets of `text`'s whole turn tags, in order.
fn whole_tags<'a>(text: &'a str, tag: &'a str) -> impl Iterator<Item = usize> + 'a {
    text.match_indices(tag)
        .map(|(i, _)| i)
        .filter(move |&i| closed_tag(&text[i..], tag).is_some())
}

/// The whole tag `text` opens with (it starts with the tag start `tag`): `tag`, a number and
/// `|>`; `None` when it is not one.
fn closed_tag<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let rest = text.get(tag.len()..)?;
    let digits: usize = rest
        .chars()
        .take_while(|c| is_decimal_digit(*c))
        .map(char::len_utf8)
        .sum();
    (digits > 0 && rest[digits..].starts_with("|>")).then(|| &text[..tag.len() + digits + 2])
}

/// Whether `c` is a Unicode decimal digit (category Nd), what the reference's `\d` matches.
fn is_decimal_digit(c: char) -> bool {
    static DIGIT: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"^\d$").ok());
    c.is_ascii_digit()
        || (!c.is_ascii()
            && DIGIT
                .as_ref()
                .is_some_and(|d| d.is_match(c.encode_utf8(&mut [0; 4]))))
}

/// Where `text` could still become a tag once more text arrives: the offset of a trailing tag
/// start that is not yet whole (`<|speaker:1`), or of a trailing proper prefix of the tag start
/// (`<|spe`); `None` when its end cannot.
pub(crate) fn unfinished_tag(text: &str, tag: &str) -> Option<usize> {
    if let Some(i) = text.rfind(tag) {
        let rest = &text[i + tag.len()..];
        let digits = rest.trim_start_matches(is_decimal_digit);
        // `<|speaker:`, `<|speaker:12`, `<|speaker:12|`: a tag may still come.
        if digits.is_empty() || digits == "|" {
            return Some(i);
        }
    }
    (1..tag.len())
        .rev()
        .filter(|&n| tag.is_char_boundary(n))
        .find(|&n| text.ends_with(&tag[..n]))
        .map(|n| text.len() - n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: &str = "<|speaker:";

    #[test]
    fn turns_begin_at_whole_tags() {
        let text = "Intro. <|speaker:0|>Hi. Yes <|speaker:12|>no <|speaker:3 open";
        assert_eq!(
            turns(text, TAG).collect::<Vec<_>>(),
            [
                "Intro. ",
                "<|speaker:0|>Hi. Yes ",
                "<|speaker:12|>no <|speaker:3 open"
            ]
        );
        assert_eq!(
            turns("<|speaker:0|>a", TAG).collect::<Vec<_>>(),
            ["<|speaker:0|>a"]
        );
        assert_eq!(turns("", TAG).collect::<Vec<_>>(), [""]);
    }

    #[test]
    fn text_before_the_first_tag_is_found() {
        assert_eq!(
            untagged_lead("Intro words. <|speaker:0|>Hi.", TAG),
            Some("Intro words.")
        );
        assert_eq!(
            untagged_lead(" ... <|speaker:0|>Hi.", TAG),
            None,
            "no words"
        );
        assert_eq!(untagged_lead("<|speaker:0|>Hi.", TAG), None);
        assert_eq!(untagged_lead("No tag at all.", TAG), None);
        assert_eq!(untagged_lead("Open <|speaker:0 tag", TAG), None);
        assert_eq!(untagged_lead("Not a tag <|speaker:x|>Hi.", TAG), None);
    }

    #[test]
    fn a_tag_is_the_start_a_number_and_its_end() {
        assert_eq!(closed_tag("<|speaker:12|>Hi", TAG), Some("<|speaker:12|>"));
        assert_eq!(closed_tag("<|speaker:３|>Hi", TAG), Some("<|speaker:３|>"));
        for not in [
            "<|speaker:|>",
            "<|speaker:x|>",
            "<|speaker:1 |>",
            "<|speaker:1",
            "<|speaker:",
        ] {
            assert_eq!(closed_tag(not, TAG), None, "{not}");
        }
        // An open start up to a later tag's end is no tag: the turns are those of the model.
        assert_eq!(
            turns("<|speaker:0|>A <|speaker:4 open. B <|speaker:5|>C", TAG).collect::<Vec<_>>(),
            ["<|speaker:0|>A <|speaker:4 open. B ", "<|speaker:5|>C"]
        );
    }

    #[test]
    fn an_unfinished_tag_at_the_end_is_found() {
        for (text, at) in [
            ("Hi <", Some(3)),
            ("Hi <|spe", Some(3)),
            ("Hi <|speaker:", Some(3)),
            ("Hi <|speaker:12", Some(3)),
            ("Hi <|speaker:12|", Some(3)),
            ("Hi <|speaker:12|>", None),
            ("Hi <|speaker:x", None),
            ("Hi", None),
            ("Hi |", None),
        ] {
            assert_eq!(unfinished_tag(text, TAG), at, "{text}");
        }
    }

    #[test]
    fn pieces_carry_their_turns_tag() {
        let mut c = TurnCarry::new(TAG);
        let got: Vec<String> = [
            "Before.",
            "<|speaker:0|>One.",
            " Two.",
            "Three <|speaker:1|>four.",
            "Five.",
            "<|speaker:2 open.",
            "Six.",
            "<|speaker:3|>Seven <|speaker:4 open.",
            "Eight.",
        ]
        .iter()
        .map(|p| c.carry(p))
        .collect();
        assert_eq!(
            got,
            [
                "Before.",
                "<|speaker:0|>One.",
                "<|speaker:0|>Two.",
                "<|speaker:0|>Three <|speaker:1|>four.",
                "<|speaker:1|>Five.",
                "<|speaker:1|><|speaker:2 open.",
                "<|speaker:1|>Six.",
                "<|speaker:3|>Seven <|speaker:4 open.",
                "<|speaker:3|>Eight.",
            ]
        );
    }
}
