//! Speaker-turn tags in text (a model's
//! [`ModelDescription::speaker_turn_tag`](crate::models::tts::ModelDescription), Fish S2 Pro's
//! `<|speaker:N|>`): where a text's turns begin, and which tag each piece of a text cut into
//! sentences (`split-sentences`) or clauses (clause mode) is spoken with, so that a turn's later
//! pieces keep its speaker.
//!
//! A tag is the model's tag start (`<|speaker:`) up to the `|>` that closes it; an unclosed one is
//! text.

/// `text` cut before each of its whole turn tags (`tag` is the tag start): the text before the
/// first tag (possibly empty), then each turn from its tag on.
pub(crate) fn turns<'a>(text: &'a str, tag: &'a str) -> impl Iterator<Item = &'a str> {
    let mut cuts: Vec<usize> = text
        .match_indices(tag)
        .map(|(i, _)| i)
        .filter(|&i| i > 0 && closed_tag(&text[i..], tag).is_some())
        .collect();
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
    let first = text
        .match_indices(tag)
        .map(|(i, _)| i)
        .find(|&i| closed_tag(&text[i..], tag).is_some())?;
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
            .rfind(self.tag)
            .and_then(|i| closed_tag(&piece[i..], self.tag))
        {
            self.speaker = Some(last.to_string());
        }
        out
    }
}

/// The tag `text` opens with (it starts with `tag`): up to its closing `|>`; `None` when it is
/// not closed.
fn closed_tag<'a>(text: &'a str, tag: &str) -> Option<&'a str> {
    let close = text.get(tag.len()..)?.find("|>")?;
    Some(&text[..tag.len() + close + 2])
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
            ]
        );
    }
}
