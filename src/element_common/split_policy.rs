//! When a text is spoken sentence by sentence: the `split-sentences` property and its `auto` rule,
//! the same in both elements (`omnittssrc`: every sentence an utterance of its own;
//! `omnittssynth`: the sentences of one cue spoken back to back as that cue's audio).
//!
//! `auto` (the default) splits a text into its sentences ([`split_sentences`](super::sentences))
//! when it is longer than the checkpoint's threshold ([`AutoSplit`]), and speaks shorter texts as
//! one utterance, as the reference does. The threshold is the smaller of
//! - what the checkpoint asks for: `split_sentences_above_chars` in its `omnitts.json`
//!   ([`HINTS_FILE`]; the bundled voice, trained on single sentences, asks for 100), and
//! - what one utterance holds with room to spare: the default `max_new_tokens` frames' seconds
//!   (at the model's frame rate) at [`SECONDS_PER_CHAR_BOUND`] a character, 1024 characters
//!   with Qwen3-TTS's built-in 4096 frames.

use std::path::{Path, PathBuf};

use gst::glib;
use gst::prelude::*;

use super::input_error::InputError;
use super::sentences::split_sentences;
use super::turns::{TurnCarry, turns, untagged_lead};
use crate::models::tts::TOO_LONG_FOR_ONE_UTTERANCE;
use crate::models::tts::text::unspeakable;

/// The `split-sentences` property. The values keep the booleans' numbers (`FALSE` = 0,
/// `TRUE` = 1), so `g_object_set (src, "split-sentences", TRUE, NULL)` and gst-launch's
/// `split-sentences=true` keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, glib::Enum)]
#[repr(u32)]
#[enum_type(name = "GstOmniTtsSplitSentences")]
pub(crate) enum SplitSentences {
    /// Every text is one utterance.
    #[enum_value(name = "Never: every text is spoken whole", nick = "false")]
    False = 0,
    /// Every sentence is an utterance.
    #[enum_value(
        name = "Always: every text is split into its sentences, each synthesised on its own",
        nick = "true"
    )]
    True = 1,
    /// Texts longer than the checkpoint's threshold are split (not a text with the model's
    /// speaker-turn tags, which the model batches itself).
    #[default]
    #[enum_value(
        name = "Auto: split texts longer than the checkpoint speaks well as one utterance",
        nick = "auto"
    )]
    Auto = 2,
}

impl SplitSentences {
    /// The value as gst-launch writes it.
    pub fn nick(self) -> &'static str {
        match self {
            SplitSentences::False => "false",
            SplitSentences::True => "true",
            SplitSentences::Auto => "auto",
        }
    }
}

/// `e` naming the `split-sentences` setting `mode` when it refuses a text too long for one
/// utterance ([`TOO_LONG_FOR_ONE_UTTERANCE`]): `whole` when `mode` kept the text whole, else
/// `e`'s text is one sentence of a text `mode` split. Any other error comes back as it is.
pub(crate) fn naming_the_split(mut e: InputError, mode: SplitSentences, whole: bool) -> InputError {
    if e.property == "text" && e.why.starts_with(TOO_LONG_FOR_ONE_UTTERANCE) {
        let what = if whole {
            "the whole text"
        } else {
            "this sentence of the text (it has no sentence boundary to split it at)"
        };
        e.why = format!(
            "{}; with split-sentences={} {what} is one utterance",
            e.why,
            mode.nick()
        );
    }
    e
}

/// The `split-sentences` param spec (`blurb_what`: what one piece becomes in the element, e.g.
/// "its own utterance, queued back to back").
pub(crate) fn split_sentences_param_spec(blurb_what: &str) -> glib::ParamSpec {
    glib::ParamSpecEnum::builder_with_default("split-sentences", SplitSentences::default())
        .nick("Split sentences")
        .blurb(&format!(
            "Speak each sentence of a text as {blurb_what} (blank lines, and Unicode sentence \
             boundaries within a paragraph; a single line break is a space; titles such as Mr. \
             and initials kept inside a sentence): true for every text, false for none, auto for \
             texts longer than the checkpoint speaks well as one utterance (its omnitts.json \
             split_sentences_above_chars: 100 characters for the bundled voice; else a quarter of \
             the default max-new-tokens frames, 1024 characters with the built-in stage config; \
             never a text with the model's speaker-turn tags, such as <|speaker:0|>, whose turns \
             the model batches itself). Applies to text queued after it is set"
        ))
        .mutable_playing()
        .build()
}

/// The checkpoint file in which a voice states how omnitts should treat it (JSON object; read:
/// `split_sentences_above_chars`, a non-negative integer, and `streaming_prompt`, a boolean,
/// [`streaming_prompt_hint`]).
pub const HINTS_FILE: &str = "omnitts.json";

/// Seconds of speech per character that [`AutoSplit`] allows one utterance: 320 ms a character
/// (4 Qwen3-TTS frames), slower than any language is spoken (English about 56 ms a character on
/// the bundled voice, Chinese about 240 ms), so a text under the threshold fits
/// `max_new_tokens`.
pub const SECONDS_PER_CHAR_BOUND: f64 = 0.32;

/// The `auto` rule of one loaded checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutoSplit {
    /// Texts of more characters than this are split.
    pub above_chars: usize,
    /// A text holding this speaker-turn tag is kept whole
    /// ([`ModelDescription::speaker_turn_tag`](crate::models::tts::ModelDescription)): the model
    /// batches its turns itself, each speaker keeping its voice across them.
    pub turn_tag: Option<&'static str>,
}

/// A bad [`HINTS_FILE`]: the file and what is wrong.
#[derive(Debug)]
pub(crate) struct HintsError {
    pub file: PathBuf,
    pub msg: String,
}

impl std::fmt::Display for HintsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.msg)
    }
}

impl AutoSplit {
    /// The threshold for the checkpoint in `dir` whose utterances get `max_new_tokens` frames
    /// by default, `frame_rate` frames a second: its [`HINTS_FILE`]'s
    /// `split_sentences_above_chars` (when there is one) or what [`AutoSplit::by_frames`] says,
    /// whichever is smaller. Errs on an unreadable or malformed hints file.
    pub fn for_checkpoint(
        dir: &Path,
        max_new_tokens: usize,
        frame_rate: f64,
    ) -> Result<Self, HintsError> {
        let by_frames = Self::by_frames(max_new_tokens, frame_rate).above_chars;
        let above_chars = match read_hint(&dir.join(HINTS_FILE))? {
            Some(asked) => asked.min(by_frames),
            None => by_frames,
        };
        Ok(AutoSplit {
            above_chars,
            turn_tag: None,
        })
    }

    /// The threshold without a checkpoint to read hints from (a speech server's model): the
    /// seconds of `max_new_tokens` frames at `frame_rate`, over [`SECONDS_PER_CHAR_BOUND`].
    pub fn by_frames(max_new_tokens: usize, frame_rate: f64) -> Self {
        let seconds = max_new_tokens as f64 / frame_rate.max(1e-9);
        AutoSplit {
            above_chars: (seconds / SECONDS_PER_CHAR_BOUND + 1e-9) as usize,
            turn_tag: None,
        }
    }

    /// This rule, keeping texts with the model's speaker-turn tag whole
    /// ([`ModelDescription::speaker_turn_tag`](crate::models::tts::ModelDescription)).
    pub fn keeping_turns(self, turn_tag: Option<&'static str>) -> Self {
        AutoSplit { turn_tag, ..self }
    }

    /// The pieces `mode` makes of `text`: its sentences when it splits it (and it has any),
    /// else the text itself, whole. With the model's speaker-turn tag, each tag starts a
    /// sentence, a sentence that does not open with a tag is spoken by the speaker of the tag
    /// before it (that tag is put in front of it), so a turn's later sentences keep their
    /// speaker; the words before the first tag are left out, as the model leaves them out of the
    /// whole text, and so are turns with nothing to speak (alone, they would be refused).
    pub fn pieces(self, mode: SplitSentences, text: &str) -> Vec<String> {
        let pieces = if !self.splits(mode, text) {
            Vec::new()
        } else if let Some(tag) = self.turn_tag {
            // A turn tag starts a sentence (the sentence rules alone would join `Hi. <|speaker:1|>
            // hello` into one: a sentence does not end before a lowercase letter). Text before
            // the first tag is left out, as the model leaves it out of the whole text.
            let lead = untagged_lead(text, tag).is_some();
            turns(text, tag)
                .skip(usize::from(lead))
                .flat_map(split_sentences)
                .collect()
        } else {
            split_sentences(text)
        };
        if pieces.is_empty() {
            return vec![text.to_string()];
        }
        let Some(tag) = self.turn_tag else {
            return pieces;
        };
        let mut carry = TurnCarry::new(tag);
        let pieces: Vec<String> = pieces.iter().map(|p| carry.carry(p)).collect();
        // A turn with nothing to speak (`<|speaker:1|>!!!`) is left out, as the whole text
        // would be spoken without a word from it; a text of nothing else stays as it is, for
        // the element to refuse.
        let spoken: Vec<String> = pieces
            .into_iter()
            .filter(|p| unspeakable(p).is_none())
            .collect();
        if spoken.is_empty() {
            vec![text.to_string()]
        } else {
            spoken
        }
    }

    /// The warning for a `text` that `mode` splits (or would, `auto`) where a piece is still
    /// longer than [`AutoSplit::above_chars`]: a sentence with no boundary to split it at (a
    /// long text without sentence punctuation), which the checkpoint speaks as one utterance past
    /// what it speaks well (babble, or a cut at `max-new-tokens`). With `split-sentences=false`,
    /// which keeps texts whole by choice, the warning is for a whole text that `auto` would
    /// split (the checkpoint may babble, stop early or be cut off; the text is still spoken
    /// whole; a dialogue with the model's speaker-turn tags is not warned about, as `auto` keeps
    /// it whole too).
    pub fn long_sentence_warning(self, mode: SplitSentences, text: &str) -> Option<String> {
        if mode == SplitSentences::False {
            let whole = text.trim();
            return self.splits(SplitSentences::Auto, text).then(|| {
                format!(
                    "a text of {} characters ('{}') is longer than the {} characters this \
                     checkpoint speaks well as one utterance, and split-sentences=false speaks \
                     it whole: it may be spoken as babble, end early or be cut off at \
                     max-new-tokens; split-sentences=auto speaks it sentence by sentence",
                    whole.chars().count(),
                    super::input_error::quoted(whole),
                    self.above_chars
                )
            });
        }
        let whole = matches!(mode, SplitSentences::Auto) && !self.splits(mode, text);
        if whole {
            return None;
        }
        let long = self
            .pieces(SplitSentences::True, text)
            .into_iter()
            .find(|p| p.trim().chars().nth(self.above_chars).is_some())?;
        Some(format!(
            "a sentence of {} characters ('{}') is longer than the {} characters this checkpoint \
             speaks well as one utterance and has no sentence boundary to split it at: it may \
             be spoken as babble or cut off at max-new-tokens; add sentence punctuation or send \
             shorter text",
            long.trim().chars().count(),
            super::input_error::quoted(long.trim()),
            self.above_chars
        ))
    }

    /// Whether `mode` splits `text` into sentences.
    pub fn splits(self, mode: SplitSentences, text: &str) -> bool {
        match mode {
            SplitSentences::False => false,
            SplitSentences::True => true,
            SplitSentences::Auto => {
                !self.turn_tag.is_some_and(|tag| text.contains(tag))
                    && text.trim().chars().nth(self.above_chars).is_some()
            }
        }
    }
}

/// The hints file `file` as a JSON object, `None` if there is no such file.
fn read_hints(
    file: &Path,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, HintsError> {
    let err = |msg: String| HintsError {
        file: file.to_path_buf(),
        msg,
    };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e.to_string())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("invalid JSON: {e}")))?;
    match v {
        serde_json::Value::Object(obj) => Ok(Some(obj)),
        _ => Err(err("expected a JSON object".into())),
    }
}

/// `split_sentences_above_chars` of the hints file `file`, `None` if there is no such file or
/// field.
fn read_hint(file: &Path) -> Result<Option<usize>, HintsError> {
    let Some(obj) = read_hints(file)? else {
        return Ok(None);
    };
    match obj.get("split_sentences_above_chars") {
        None => Ok(None),
        Some(n) => n
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| HintsError {
                file: file.to_path_buf(),
                msg: format!(
                    "split_sentences_above_chars: expected a non-negative integer, got {n}"
                ),
            }),
    }
}

/// What the checkpoint in `dir` says of its streaming prompt mode: `streaming_prompt` in its
/// [`HINTS_FILE`] (`false`: it speaks poorly in it, e.g. the bundled voice, trained on the
/// non-streaming prompt only, which stops after about a second; text streamed into it is then
/// spoken clause by clause). `None` when the file or the field is absent. Errs on an unreadable
/// or malformed file, or a value that is not a boolean.
pub(crate) fn streaming_prompt_hint(dir: &Path) -> Result<Option<bool>, HintsError> {
    let file = dir.join(HINTS_FILE);
    let Some(obj) = read_hints(&file)? else {
        return Ok(None);
    };
    match obj.get("streaming_prompt") {
        None => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| HintsError {
            file,
            msg: format!("streaming_prompt: expected true or false, got {v}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refusal of a text too long for one utterance names the setting that made it one;
    /// other refusals are left as they are.
    #[test]
    fn a_too_long_text_names_the_split_setting() {
        use super::super::input_error::input_error;
        let too_long = || {
            input_error(
                "text",
                "word word",
                format!("{TOO_LONG_FOR_ONE_UTTERANCE}: 9 text ids, at most 8 here"),
            )
        };
        let e = naming_the_split(too_long(), SplitSentences::False, true);
        assert!(
            e.why
                .ends_with("; with split-sentences=false the whole text is one utterance"),
            "{e}"
        );
        let e = naming_the_split(too_long(), SplitSentences::Auto, false);
        assert!(
            e.why
                .contains("with split-sentences=auto this sentence of the text"),
            "{e}"
        );
        let other = input_error("text", "?!", "has no letter or digit");
        let e = naming_the_split(other, SplitSentences::False, true);
        assert_eq!(e.why, "has no letter or digit");
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("omnitts-split-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_bundled_voice_asks_for_100_characters() {
        let voice = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en");
        let auto = AutoSplit::for_checkpoint(&voice, 2048, 12.5).unwrap();
        assert_eq!(auto.above_chars, 100);
        let short = "It was a fine morning. The rain had stopped at last.";
        let long = "It was a fine morning, and the rain had stopped at last. ".repeat(2);
        assert!(!auto.splits(SplitSentences::Auto, short));
        assert!(auto.splits(SplitSentences::Auto, &long));
        assert!(auto.splits(SplitSentences::True, short));
        assert!(!auto.splits(SplitSentences::False, &long));
        // The threshold counts characters of the trimmed text, not bytes.
        let at = "é".repeat(100);
        assert!(!auto.splits(SplitSentences::Auto, &format!("  {at}\n")));
        assert!(auto.splits(SplitSentences::Auto, &format!("{at}é")));
        assert_eq!(auto.pieces(SplitSentences::Auto, short), [short]);
        assert_eq!(auto.pieces(SplitSentences::True, short).len(), 2);
        assert_eq!(auto.pieces(SplitSentences::True, "   "), ["   "]);
    }

    #[test]
    fn a_long_sentence_without_a_boundary_is_warned_about() {
        let auto = AutoSplit {
            above_chars: 40,
            turn_tag: None,
        };
        let run_on = "and then it goes on and on without any stop at all for ever more";
        for mode in [SplitSentences::Auto, SplitSentences::True] {
            let w = auto.long_sentence_warning(mode, run_on).expect("a warning");
            for word in [
                "64 characters",
                "40 characters",
                "no sentence boundary",
                "and then",
            ] {
                assert!(w.contains(word), "{word}: {w}");
            }
            // A long sentence among short ones is found too.
            let mixed = format!("Hi. {run_on}. Bye.");
            assert!(auto.long_sentence_warning(mode, &mixed).is_some());
            // Sentences each within the threshold: nothing to say.
            let fine = "This sentence is short. So is this one. And this one as well.";
            assert_eq!(auto.long_sentence_warning(mode, fine), None);
        }
        // Kept whole by choice: said for a whole text past the threshold, however it is cut
        // into sentences; not for a short one.
        let sentences = "This sentence is short. So is this one. And this one as well.";
        for text in [run_on, sentences] {
            let w = auto
                .long_sentence_warning(SplitSentences::False, text)
                .expect("a warning");
            let n = format!("a text of {} characters", text.chars().count());
            for word in [
                n.as_str(),
                "40 characters",
                "split-sentences=false",
                "babble",
            ] {
                assert!(w.contains(word), "{word}: {w}");
            }
        }
        assert_eq!(
            auto.long_sentence_warning(SplitSentences::False, "A short text."),
            None
        );
        // A dialogue in the model's speaker-turn tags, which auto keeps whole too: no warning.
        let turns = auto.keeping_turns(Some("<|speaker:"));
        let dialogue = format!("<|speaker:0|>{run_on}");
        assert_eq!(
            turns.long_sentence_warning(SplitSentences::False, &dialogue),
            None
        );
        // Short enough for auto to keep whole.
        assert_eq!(
            auto.long_sentence_warning(SplitSentences::Auto, "short, no stop"),
            None
        );
    }

    #[test]
    fn auto_keeps_a_text_with_speaker_turns_whole() {
        let auto = AutoSplit::by_frames(400, 12.5).keeping_turns(Some("<|speaker:"));
        let turn = "<|speaker:0|>Hello there, how are you today? <|speaker:1|>Fine, thanks. ";
        let dialogue = turn.repeat(20);
        assert!(dialogue.chars().count() > auto.above_chars);
        assert_eq!(
            auto.pieces(SplitSentences::Auto, &dialogue),
            vec![dialogue.clone()]
        );
        // Set to true, it still splits, and every sentence keeps its turn's speaker; without the
        // tag, auto splits a long text.
        let pieces = auto.pieces(SplitSentences::True, &dialogue);
        assert!(pieces.len() > 20);
        assert_eq!(
            pieces[0].trim(),
            "<|speaker:0|>Hello there, how are you today?"
        );
        assert_eq!(pieces[1].trim(), "<|speaker:1|>Fine, thanks.");
        let plain = "Hello there, how are you today? Fine, thanks. ".repeat(20);
        assert!(auto.pieces(SplitSentences::Auto, &plain).len() > 20);
        let untagged_model = AutoSplit::by_frames(400, 12.5);
        assert!(untagged_model.pieces(SplitSentences::Auto, &dialogue).len() > 20);
    }

    #[test]
    fn a_turns_later_sentences_keep_its_speaker() {
        let auto = AutoSplit::by_frames(400, 12.5).keeping_turns(Some("<|speaker:"));
        let text = "<|speaker:0|>One. Two! <|speaker:12|>Three? Four. \
                    Five <|speaker:3|>six. Seven. <|speaker:4 not closed. Eight.";
        let pieces: Vec<String> = auto
            .pieces(SplitSentences::True, text)
            .iter()
            .map(|p| p.trim().to_string())
            .collect();
        assert_eq!(
            pieces,
            [
                "<|speaker:0|>One.",
                "<|speaker:0|>Two!",
                "<|speaker:12|>Three?",
                "<|speaker:12|>Four.",
                "<|speaker:12|>Five",
                "<|speaker:3|>six.",
                "<|speaker:3|>Seven. <|speaker:4 not closed.",
                "<|speaker:3|>Eight.",
            ]
        );
        // Words before the first tag are left out, as the model leaves them out of the whole
        // text (the elements warn).
        assert_eq!(
            auto.pieces(SplitSentences::True, &format!("Before any tag. {text}"))
                .iter()
                .map(|p| p.trim().to_string())
                .collect::<Vec<_>>(),
            pieces
        );
        // Turns with nothing to speak are left out; a text of nothing else stays whole.
        let sparse = "<|speaker:0|> <|speaker:1|>Hello. <|speaker:2|>!!! Again.";
        assert_eq!(
            auto.pieces(SplitSentences::True, sparse)
                .iter()
                .map(|p| p.trim())
                .collect::<Vec<_>>(),
            ["<|speaker:1|>Hello.", "<|speaker:2|>Again."]
        );
        assert_eq!(
            auto.pieces(SplitSentences::True, "<|speaker:0|> <|speaker:1|>!!"),
            ["<|speaker:0|> <|speaker:1|>!!"]
        );
        // A model without turn tags gets the sentences as they are: nothing added.
        let plain = AutoSplit::by_frames(400, 12.5).pieces(SplitSentences::True, text);
        assert!(plain.len() > 3);
        assert!(plain.iter().all(|p| text.contains(p.trim())), "{plain:?}");
    }

    #[test]
    fn without_hints_a_quarter_of_max_new_tokens() {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        assert_eq!(
            AutoSplit::for_checkpoint(&fixture, 4096, 12.5)
                .unwrap()
                .above_chars,
            1024
        );
        // A small frame budget lowers the bundled voice's threshold too.
        let voice = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en");
        assert_eq!(
            AutoSplit::for_checkpoint(&voice, 200, 12.5)
                .unwrap()
                .above_chars,
            50
        );
    }

    #[test]
    fn bad_hints_are_named() {
        let d = scratch("bad");
        for (body, want) in [
            (
                "{\"split_sentences_above_chars\": -3}",
                "non-negative integer, got -3",
            ),
            (
                "{\"split_sentences_above_chars\": \"x\"}",
                "non-negative integer",
            ),
            ("[1]", "expected a JSON object"),
            ("{", "invalid JSON"),
        ] {
            std::fs::write(d.join(HINTS_FILE), body).unwrap();
            let e = AutoSplit::for_checkpoint(&d, 4096, 12.5)
                .unwrap_err()
                .to_string();
            assert!(e.contains(HINTS_FILE) && e.contains(want), "{body}: {e}");
        }
        std::fs::write(d.join(HINTS_FILE), "{\"other\": 1}").unwrap();
        assert_eq!(
            AutoSplit::for_checkpoint(&d, 4096, 12.5)
                .unwrap()
                .above_chars,
            1024
        );
        std::fs::write(d.join(HINTS_FILE), "{\"split_sentences_above_chars\": 0}").unwrap();
        let always = AutoSplit::for_checkpoint(&d, 4096, 12.5).unwrap();
        assert!(always.splits(SplitSentences::Auto, "Hi."));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_bundled_voice_says_its_streaming_prompt_is_poor() {
        let voice = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/omnitts-en");
        assert_eq!(streaming_prompt_hint(&voice).unwrap(), Some(false));
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        assert_eq!(streaming_prompt_hint(&fixture).unwrap(), None);
        let d = scratch("stream");
        std::fs::write(d.join(HINTS_FILE), "{\"streaming_prompt\": true}").unwrap();
        assert_eq!(streaming_prompt_hint(&d).unwrap(), Some(true));
        std::fs::write(d.join(HINTS_FILE), "{\"streaming_prompt\": \"no\"}").unwrap();
        let e = streaming_prompt_hint(&d).unwrap_err().to_string();
        assert!(
            e.contains(HINTS_FILE) && e.contains("true or false, got \"no\""),
            "{e}"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn booleans_keep_their_numbers() {
        use glib::translate::IntoGlib;
        assert_eq!(SplitSentences::False.into_glib(), 0);
        assert_eq!(SplitSentences::True.into_glib(), 1);
        assert_eq!(SplitSentences::default(), SplitSentences::Auto);
    }
}
