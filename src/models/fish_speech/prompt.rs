//! The prompt: the reference's conversation format, as rows of ids.
//!
//! A prompt is `1 + num_codebooks` rows of equal length T: row 0 holds token ids, rows 1..=10 the
//! codes of the reference (cloned) speech at its semantic positions and 0 elsewhere. Each text
//! piece is tokenised on its own, in this order:
//!
//! ```text
//! <|im_start|>system\n  SYSTEM  <|im_end|>\n
//! <|im_start|>user\n  TEXT  <|im_end|>\n
//! <|im_start|>assistant\n<|voice|>
//! ```
//!
//! SYSTEM is `convert the provided text to speech`, or with a reference voice
//! `convert the provided text to speech reference to the following:\n\nText:\n`, then the
//! transcript (prefixed with `<|speaker:0|>` unless it has a speaker tag), `\n\nSpeech:\n`, then
//! the reference codes as a raw span (no `<|audio_start|>`/`<|audio_end|>` around it): token
//! `semantic_begin + code0` in row 0 and the 10 codes in rows 1..=10.
//!
//! TEXT with `<|speaker:N|>` tags ([`SPEAKER_TAG`]) is split into turns (text before the first tag
//! is dropped, each turn trimmed as Python's `str.strip` trims) and grouped into batches of at most 5 turns and `chunk_length` UTF-8 bytes
//! joined by newlines; each batch is one generation, earlier batches and their generated codes
//! staying in the prompt as history ([`PromptBuilder::build`]'s `history`).

use super::error::{FishError, Result};
use super::tokenizer::{FishTokenizer, IM_END, IM_START, SPEAKER_TAG, VOICE};

/// The system text of a text-only prompt.
pub const SYSTEM_TEXT: &str = "convert the provided text to speech";
/// The system text before a reference transcript.
pub const SYSTEM_CLONE: &str =
    "convert the provided text to speech reference to the following:\n\nText:\n";
/// Between the transcript and the reference codes.
pub const SPEECH_HEADER: &str = "\n\nSpeech:\n";
/// The reference's default batch size in UTF-8 bytes.
pub const CHUNK_LENGTH: usize = 512;
/// Turns per batch.
pub const MAX_SPEAKERS: usize = 5;

/// Codes of several frames, `[num_codebooks][frames]`.
pub type Codes = Vec<Vec<u32>>;

/// A reference voice: its codes and transcript.
#[derive(Debug, Clone)]
pub struct VoiceReference {
    /// `[num_codebooks][frames]` (the codec encoder's output).
    pub codes: Codes,
    pub transcript: String,
}

/// Prompt rows: `rows[0]` token ids, `rows[1 + i]` codebook i, all of one length.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub rows: Vec<Vec<u32>>,
}

impl Prompt {
    /// Positions.
    pub fn len(&self) -> usize {
        self.rows[0].len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Builds prompts for one tokenizer and codebook count.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    pub tokenizer: FishTokenizer,
    pub num_codebooks: usize,
}

impl PromptBuilder {
    /// The batches of `text` (see the module docs); `text` itself when it has no speaker tag.
    pub fn batches(&self, text: &str, chunk_length: usize) -> Result<Vec<String>> {
        self.tokenizer.check_user_text("text", text)?;
        let turns = split_by_speaker(text);
        if turns.is_empty() {
            return Ok(vec![text.to_string()]);
        }
        Ok(group_turns(&turns, MAX_SPEAKERS, chunk_length))
    }

    /// The prompt of one batch: `voice` the optional reference, `history` earlier batches of the
    /// same request with their generated codes.
    pub fn build(
        &self,
        batch: &str,
        voice: Option<&VoiceReference>,
        history: &[(String, Codes)],
    ) -> Result<Prompt> {
        self.tokenizer.check_user_text("text", batch)?;
        let mut p = Rows::new(self.num_codebooks);
        self.text(&mut p, &format!("{IM_START}system\n"))?;
        match voice {
            None => self.text(&mut p, SYSTEM_TEXT)?,
            Some(v) => {
                self.tokenizer.check_user_text("ref_text", &v.transcript)?;
                self.text(&mut p, SYSTEM_CLONE)?;
                let transcript = if has_speaker_tag(&v.transcript) {
                    v.transcript.clone()
                } else {
                    format!("<|speaker:0|>{}", v.transcript)
                };
                self.text(&mut p, &transcript)?;
                self.text(&mut p, SPEECH_HEADER)?;
                self.codes(&mut p, &v.codes, "reference codes")?;
            }
        }
        self.text(&mut p, &format!("{IM_END}\n"))?;
        for (text, codes) in history {
            self.user(&mut p, text)?;
            self.text(&mut p, &format!("{IM_START}assistant\n{VOICE}"))?;
            self.codes(&mut p, codes, "history codes")?;
            self.text(&mut p, &format!("{IM_END}\n"))?;
        }
        self.user(&mut p, batch)?;
        self.text(&mut p, &format!("{IM_START}assistant\n{VOICE}"))?;
        Ok(Prompt { rows: p.rows })
    }

    /// [`Self::build`] with the oldest entries of `history` left out while the prompt takes more
    /// than `limit` positions (where the reference stops with an error); the number left out
    /// comes with it. A prompt over `limit` even without history is returned as it is.
    pub fn build_within(
        &self,
        batch: &str,
        voice: Option<&VoiceReference>,
        history: &[(String, Codes)],
        limit: usize,
    ) -> Result<(Prompt, usize)> {
        let mut dropped = 0;
        loop {
            let p = self.build(batch, voice, &history[dropped..])?;
            if p.len() <= limit || dropped == history.len() {
                return Ok((p, dropped));
            }
            dropped += 1;
        }
    }

    fn user(&self, p: &mut Rows, text: &str) -> Result<()> {
        self.text(p, &format!("{IM_START}user\n"))?;
        self.text(p, text)?;
        self.text(p, &format!("{IM_END}\n"))
    }

    fn text(&self, p: &mut Rows, text: &str) -> Result<()> {
        for id in self.tokenizer.encode(text)? {
            p.push(id, None);
        }
        Ok(())
    }

    fn codes(&self, p: &mut Rows, codes: &Codes, what: &'static str) -> Result<()> {
        if codes.len() != self.num_codebooks {
            return Err(FishError::InvalidRequest {
                field: what,
                msg: format!(
                    "{} codebooks, the model has {}",
                    codes.len(),
                    self.num_codebooks
                ),
            });
        }
        let frames = codes[0].len();
        if codes.iter().any(|c| c.len() != frames) {
            return Err(FishError::InvalidRequest {
                field: what,
                msg: "codebooks of different lengths".into(),
            });
        }
        let n_sem = self.tokenizer.num_semantic() as u32;
        for t in 0..frames {
            let c0 = codes[0][t];
            if c0 >= n_sem {
                return Err(FishError::InvalidRequest {
                    field: what,
                    msg: format!("semantic code {c0} ≥ {n_sem}"),
                });
            }
            let frame: Vec<u32> = codes.iter().map(|c| c[t]).collect();
            p.push(self.tokenizer.semantic_begin + c0, Some(&frame));
        }
        Ok(())
    }
}

struct Rows {
    rows: Vec<Vec<u32>>,
}

impl Rows {
    fn new(num_codebooks: usize) -> Self {
        Self {
            rows: vec![Vec::new(); num_codebooks + 1],
        }
    }

    fn push(&mut self, token: u32, codes: Option<&[u32]>) {
        self.rows[0].push(token);
        for (i, row) in self.rows[1..].iter_mut().enumerate() {
            row.push(codes.map_or(0, |c| c[i]));
        }
    }
}

fn has_speaker_tag(s: &str) -> bool {
    SPEAKER_TAG.is_match(s)
}

/// Speaker turns: each tag with the text up to the next tag, trimmed as Python's `str.strip`
/// trims; text before the first tag is dropped.
pub fn split_by_speaker(text: &str) -> Vec<String> {
    let tags: Vec<(usize, usize)> = SPEAKER_TAG
        .find_iter(text)
        .map(|m| (m.start(), m.end()))
        .collect();
    tags.iter()
        .enumerate()
        .map(|(k, &(start, end))| {
            let next = tags.get(k + 1).map_or(text.len(), |t| t.0);
            python_strip(&format!("{}{}", &text[start..end], &text[end..next])).to_string()
        })
        .collect()
}

/// `s.strip()` in Python: Rust's whitespace and the separators U+001C–U+001F, which Python's
/// `str.isspace` counts too.
fn python_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Groups turns into batches of at most `max_speakers` turns and `max_bytes` UTF-8 bytes (a turn
/// longer than that is a batch of its own), joined by newlines.
pub fn group_turns(turns: &[String], max_speakers: usize, max_bytes: usize) -> Vec<String> {
    let mut batches = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut bytes = 0;
    for turn in turns {
        let n = turn.len();
        if current.len() >= max_speakers || (bytes + n > max_bytes && !current.is_empty()) {
            batches.push(current.join("\n"));
            current = vec![turn];
            bytes = n;
        } else {
            current.push(turn);
            bytes += n;
        }
    }
    if !current.is_empty() {
        batches.push(current.join("\n"));
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_drop_the_text_before_the_first_tag_and_are_trimmed() {
        let t = split_by_speaker("ignored <|speaker:0|> Hi there.  <|speaker:1|>Hello, fox!");
        assert_eq!(t, ["<|speaker:0|> Hi there.", "<|speaker:1|>Hello, fox!"]);
        assert!(split_by_speaker("no tags <|speaker:x|>").is_empty());
    }

    #[test]
    fn tags_and_trimming_follow_pythons_rules() {
        // `\d` is any decimal digit (fullwidth ３, Arabic-Indic ٣), not ² or an ASCII letter.
        let t = split_by_speaker("<|speaker:３|>a<|speaker:٣|>b<|speaker:²|>c<|speaker:|>d");
        assert_eq!(
            t,
            [
                "<|speaker:３|>a",
                "<|speaker:٣|>b<|speaker:²|>c<|speaker:|>d"
            ]
        );
        // A tag nested in a broken one is found.
        assert_eq!(
            split_by_speaker("<|speaker:<|speaker:2|>x"),
            ["<|speaker:2|>x"]
        );
        // U+001C–U+001F are whitespace to `str.strip`; U+200B is not.
        let t = split_by_speaker("<|speaker:1|>\u{1f} x \u{1c}\u{3000}<|speaker:2|>y\u{200b}");
        assert_eq!(t, ["<|speaker:1|>\u{1f} x", "<|speaker:2|>y\u{200b}"]);
        assert!(has_speaker_tag("x<|speaker:٠٧|>"));
        assert!(!has_speaker_tag("<|speaker:1 |>"));
    }

    #[test]
    fn grouping_by_count_and_bytes() {
        let turns: Vec<String> = (0..7).map(|i| format!("<|speaker:{i}|>abc")).collect();
        let b = group_turns(&turns, 5, 512);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].lines().count(), 5);
        let b = group_turns(&turns, 5, 40);
        assert_eq!(b.len(), 4, "{b:?}");
    }
}
