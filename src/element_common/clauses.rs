//! Clause mode of streamed text (`append-text` on a checkpoint whose streaming prompt mode is
//! poor): the text is cut into clauses as it arrives, and each clause is spoken as one utterance
//! of the engine as soon as it is complete.
//!
//! The cut is that of the whole text, whatever the fragments were: [`ClauseSplitter`] hands out
//! a clause only once no later text can change it, so the clauses of a text fed in any pieces
//! equal [`clauses`] of the whole text.
//!
//! - Sentences are those of `split-sentences` ([`split_sentences`]: UAX #29 boundaries, titles
//!   and initials kept inside a sentence, a full stop before a lower-case word not an end). A
//!   sentence is complete when the text after it has a letter or digit (the boundary depends on
//!   the next word), or at the end of the text.
//! - Within a sentence, a clause ends at clause punctuation: `,` `;` `:` followed by a space
//!   (so `1,000` and `3:30` stay whole), or `—` `，` `；` `：` `、` (no space needed), when the clause
//!   before it and the rest of the sentence both hold at least [`MIN_CLAUSE_WORDS`] words (a CJK
//!   character counts half a word): "Yes, I do." stays one clause, since short clauses come out
//!   worse than whole sentences on a voice trained on sentences. The rest counts as long enough
//!   as soon as that many words of it have begun.

use super::sentences::split_sentences;
use super::turns::{TurnCarry, turns, unfinished_tag};
use crate::models::tts::text::{outside_markup, unspeakable};

/// Words that a clause and the rest of its sentence need for a cut at clause punctuation between
/// them (a CJK character counts half).
pub const MIN_CLAUSE_WORDS: usize = 3;

/// Clause punctuation that ends a clause only when a space follows.
const SPACED_CLAUSE_ENDS: &[char] = &[',', ';', ':'];
/// Clause punctuation that ends a clause without a space after it.
const CLAUSE_ENDS: &[char] = &['—', '，', '；', '：', '、'];

/// Whether `c` is written without spaces between words (Han, kana, Hangul): counted half a word.
fn is_cjk(c: char) -> bool {
    matches!(c as u32,
        0x3040..=0x30FF | 0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xAC00..=0xD7AF | 0xF900..=0xFAFF
        | 0x20000..=0x2FA1F)
}

/// Words begun in `s`, in halves: a run of letters and digits counts 2, a CJK character 1;
/// markup of the special-token form `<|…|>` (a speaker tag) counts none.
fn half_words(s: &str) -> usize {
    outside_markup(s).map(plain_half_words).sum()
}

/// [`half_words`] of text without markup.
fn plain_half_words(s: &str) -> usize {
    let mut n = 0;
    let mut in_word = false;
    for c in s.chars() {
        if is_cjk(c) {
            n += 1;
            in_word = false;
        } else if c.is_alphanumeric() {
            if !in_word {
                n += 2;
            }
            in_word = true;
        } else {
            in_word = false;
        }
    }
    n
}

/// The byte offsets just after the clause punctuation where `sentence` is cut (all of it, or
/// the part seen so far of a sentence still arriving: the cuts found are final either way).
fn clause_cuts(sentence: &str) -> Vec<usize> {
    let min = 2 * MIN_CLAUSE_WORDS;
    let mut cuts = Vec::new();
    let mut last = 0;
    let mut chars = sentence.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let Some(&(j, next)) = chars.peek() else {
            break;
        };
        let ends =
            (SPACED_CLAUSE_ENDS.contains(&c) && next.is_whitespace()) || CLAUSE_ENDS.contains(&c);
        if ends && half_words(&sentence[last..i]) >= min && half_words(&sentence[j..]) >= min {
            cuts.push(j);
            last = j;
        }
    }
    cuts
}

/// The clauses of `sentence`, trimmed.
fn cut(sentence: &str, cuts: &[usize]) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&sentence.len())) {
        let clause = sentence[from..to].trim();
        if !clause.is_empty() {
            out.push(clause.to_string());
        }
        from = to;
    }
    out
}

#[cfg(test)]
/// The clauses of a whole text, in order (what [`ClauseSplitter`] hands out for it, however it
/// was cut).
pub fn clauses(text: &str) -> Vec<String> {
    clauses_with_turns(text, None)
}

#[cfg(test)]
/// [`clauses`] for a model whose speaker-turn tag starts with `turn_tag`.
pub fn clauses_with_turns(text: &str, turn_tag: Option<&'static str>) -> Vec<String> {
    let mut s = ClauseSplitter::with_turns(turn_tag);
    let mut out = s.push(text);
    out.extend(s.finish());
    out
}

/// Cuts text that arrives in fragments into clauses, each handed out once it is final.
#[derive(Debug, Default)]
pub struct ClauseSplitter {
    /// Text not yet handed out.
    buf: String,
    /// With the model's speaker-turn tag: a turn's tag ends the clause before it, and every
    /// clause is spoken with its turn's tag ([`super::turns`]).
    turns: Option<TurnCarry>,
}

impl ClauseSplitter {
    /// A splitter for a model whose speaker-turn tag starts with `turn_tag` (`None`: a model
    /// without turns; then as [`ClauseSplitter::default`]).
    pub fn with_turns(turn_tag: Option<&'static str>) -> Self {
        ClauseSplitter {
            buf: String::new(),
            turns: turn_tag.map(TurnCarry::new),
        }
    }

    /// Adds a fragment; returns the clauses it completed.
    pub fn push(&mut self, fragment: &str) -> Vec<String> {
        self.buf.push_str(fragment);
        self.take(false)
    }

    /// The text has ended: the clauses left.
    pub fn finish(&mut self) -> Vec<String> {
        self.take(true)
    }

    fn take(&mut self, end: bool) -> Vec<String> {
        // Turns end at the next turn's tag: every turn but the last is complete. A tag still
        // arriving (`<|speaker:1`) is held back, unseen, until it is whole or is not a tag.
        let segments: Vec<&str> = match &self.turns {
            Some(c) => {
                let held = (!end)
                    .then(|| unfinished_tag(&self.buf, c.tag()))
                    .flatten()
                    .unwrap_or(self.buf.len());
                turns(&self.buf[..held], c.tag()).collect()
            }
            None => vec![self.buf.as_str()],
        };
        let mut out = Vec::new();
        if let Some((last, complete)) = segments.split_last() {
            for s in complete {
                out.extend(final_clauses(s, true));
            }
            out.extend(final_clauses(last, end));
        }
        if end {
            self.buf.clear();
        } else {
            // Drop what was handed out: as many characters other than whitespace as it holds.
            let mut skip: usize = out
                .iter()
                .map(|c| c.chars().filter(|c| !c.is_whitespace()).count())
                .sum();
            let mut at = self.buf.len();
            for (i, c) in self.buf.char_indices() {
                if c.is_whitespace() {
                    continue;
                }
                if skip == 0 {
                    at = i;
                    break;
                }
                skip -= 1;
            }
            self.buf.drain(..at);
        }
        match &mut self.turns {
            // Each clause with its turn's tag; a turn with nothing to speak leaves none.
            Some(c) => out
                .iter()
                .map(|clause| c.carry(clause))
                .filter(|clause| unspeakable(clause).is_none())
                .collect(),
            None => out,
        }
    }
}

/// The clauses of `text` that are final: all of them at the `end` of the text, else those that
/// later text cannot change (trimmed, in order).
fn final_clauses(text: &str, end: bool) -> Vec<String> {
    let sentences = split_sentences(text);
    let mut out = Vec::new();
    let open = match sentences.split_last() {
        None => return out,
        Some(_) if end => None,
        // The boundary before the last piece is final once it has a letter or digit.
        Some((last, _)) if !last.chars().any(char::is_alphanumeric) => return out,
        Some((last, _)) => Some(last),
    };
    let complete = sentences.len() - usize::from(open.is_some());
    for s in &sentences[..complete] {
        out.extend(cut(s, &clause_cuts(s)));
    }
    if let Some(open) = open {
        let cuts = clause_cuts(open);
        if let Some(&to) = cuts.last() {
            out.extend(cut(&open[..to], &cuts[..cuts.len() - 1]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small seeded generator (xorshift), for the fragment cuts.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn sentences_and_clauses() {
        assert_eq!(
            clauses(
                "It was a fine morning, and the rain had stopped at last. Yes, I do. \
                 Mr. Smith paid 1,000 pounds at 3:30, which was too much."
            ),
            [
                "It was a fine morning,",
                "and the rain had stopped at last.",
                "Yes, I do.",
                "Mr. Smith paid 1,000 pounds at 3:30,",
                "which was too much."
            ]
        );
        assert_eq!(
            clauses("今天天气很好，我们去公园散步吧。好的！"),
            ["今天天气很好，", "我们去公园散步吧。", "好的！"]
        );
        assert_eq!(clauses("  "), Vec::<String>::new());
        assert_eq!(clauses("no end in sight"), ["no end in sight"]);
    }

    #[test]
    fn a_clause_is_handed_out_once_final() {
        let mut s = ClauseSplitter::default();
        assert!(s.push("It was a fine morning,").is_empty(), "no space yet");
        assert!(s.push(" and the").is_empty(), "two words of the rest");
        assert_eq!(s.push(" rain"), ["It was a fine morning,"]);
        assert!(s.push(" had stopped.").is_empty(), "the next word decides");
        assert!(s.push(" ").is_empty());
        assert_eq!(s.push("S"), ["and the rain had stopped."]);
        assert!(s.push("he left").is_empty());
        assert_eq!(s.finish(), ["She left"]);
        assert!(s.finish().is_empty());
        // A full stop before a lower-case word is no end.
        let mut s = ClauseSplitter::default();
        assert!(s.push("It cost 3. and").is_empty());
        assert_eq!(s.finish(), ["It cost 3. and"]);
    }

    const TAG: &str = "<|speaker:";

    /// A turn's tag ends the clause before it; every clause keeps its turn's tag; the tag
    /// counts no words; a turn with nothing to speak gives no clause.
    #[test]
    fn turns_end_clauses_and_keep_their_tag() {
        let text = "<|speaker:0|>Hello there my good friend, how are you doing today? Nice \
                    weather <|speaker:1|>Fine thanks, my old friend. <|speaker:2|>!!! \
                    <|speaker:0|>Bye.";
        assert_eq!(
            clauses_with_turns(text, Some(TAG)),
            [
                "<|speaker:0|>Hello there my good friend,",
                "<|speaker:0|>how are you doing today?",
                "<|speaker:0|>Nice weather",
                "<|speaker:1|>Fine thanks, my old friend.",
                "<|speaker:0|>Bye.",
            ]
        );
        // A turn is final once the next one's tag is whole.
        let mut s = ClauseSplitter::with_turns(Some(TAG));
        assert!(s.push("<|speaker:0|>Nice weather <|speaker:1").is_empty());
        assert_eq!(s.push("|>Y"), ["<|speaker:0|>Nice weather"]);
        assert_eq!(s.finish(), ["<|speaker:1|>Y"]);
        // A tag that arrives in pieces after clause punctuation: the cut is the whole text's
        // (the unfinished tag counts no words of the rest of the sentence).
        let text = "<|speaker:0|>Hello there my good friend, oh <|speaker:1|>Yes.";
        let whole = clauses_with_turns(text, Some(TAG));
        assert_eq!(
            whole,
            [
                "<|speaker:0|>Hello there my good friend, oh",
                "<|speaker:1|>Yes."
            ]
        );
        let mut s = ClauseSplitter::with_turns(Some(TAG));
        let mut got = s.push("<|speaker:0|>Hello there my good friend, oh <|speaker:1");
        got.extend(s.push("|>Yes."));
        got.extend(s.finish());
        assert_eq!(got, whole);
        // Without turns the tags are text: the sentence goes on past a tag before lower case.
        assert_eq!(
            clauses("<|speaker:0|>A b. <|speaker:1|>c d."),
            ["<|speaker:0|>A b. <|speaker:1|>c d."]
        );
    }

    #[test]
    fn any_cut_gives_the_clauses_of_the_whole_text() {
        let texts = [
            "It was a fine morning, and the rain had stopped at last. She walked down to the \
             river; the water was high. \"Stop!\" she said. Dr. Jones came at 3:30, late again.",
            "今天天气很好，我们去公园散步吧。好的！我们走吧、快点。",
            "Hello there... What — you again? Well, I never, not in all my years, did see it.",
        ];
        let dialogue = "<|speaker:0|>Hello there my good friend, how are you doing today? Nice \
                        weather. <|speaker:1|>Fine thanks, my old friend, and you? <|speaker:2|>!!! \
                        <|speaker:0|>Bye for now, my dear, oh <|speaker:1|>well, <|speaker:x|>no.";
        let mut rng = Rng(0x005e_ed36);
        for (text, turn_tag) in texts
            .iter()
            .map(|t| (*t, None))
            .chain([(dialogue, Some(TAG)), (texts[0], Some(TAG))])
        {
            let whole = clauses_with_turns(text, turn_tag);
            let chars: Vec<char> = text.chars().collect();
            for round in 0..200 {
                let mut s = ClauseSplitter::with_turns(turn_tag);
                let mut got = Vec::new();
                let mut i = 0;
                while i < chars.len() {
                    // One character at a time in round 0, else 1 to 12.
                    let n = if round == 0 { 1 } else { 1 + rng.below(12) };
                    let piece: String = chars[i..(i + n).min(chars.len())].iter().collect();
                    got.extend(s.push(&piece));
                    i += n;
                }
                got.extend(s.finish());
                assert_eq!(got, whole, "round {round} of {text:?}");
            }
        }
    }
}
