//! Incremental tokenization of text that arrives in fragments (an LLM's reply streamed into an
//! utterance): [`IncrementalTokenizer`] commits only the token ids that no later fragment can
//! change, so that once the text ends the committed ids equal the tokenization of the whole text.
//!
//! The Qwen2 tokenizer runs, on the whole string: added-token extraction (`<|im_end|>`, …), the
//! NFC normalizer, the pre-tokenizer's regex split into pieces ([`QWEN2_PATTERN`]) and byte-level
//! BPE within each piece. A fragment can change the tail of the text's tokenization in four ways,
//! each of which the tokenizer holds back:
//!
//! - an incomplete UTF-8 sequence at the end of a fragment (bytes held until the character is
//!   whole; an invalid sequence is an error naming its offset);
//! - NFC: a combining mark (or a Hangul vowel or final jamo) that arrives later composes with the
//!   character before it, so text is tokenized only up to the last character that starts a new
//!   normalization segment (canonical combining class 0, NFC quick check `Yes`);
//! - the regex split: a piece at the end can grow (`wor` + `ld`), and a run of whitespace is split
//!   according to what follows it (`\s+(?!\S)`, `\s*[\r\n]+`), so only a piece boundary after a
//!   non-whitespace character, with the character after it received (or an added token's edge),
//!   is final: every alternative of the regex that could end a piece there reads no further than
//!   that next character, and the whitespace pieces before it end at a non-whitespace character
//!   already received. A Chinese clause is one piece (`\p{L}+`), committed at its punctuation;
//! - added tokens: text that could still become one (`<|im_` …) holds back from where it starts.
//!
//! BPE never merges across pieces, so the pieces before a final boundary have their final ids.
//!
//! [`QWEN2_PATTERN`]: super::tokenizer::QWEN2_PATTERN

use tokenizers::{OffsetReferential, OffsetType, PreTokenizer};
use unicode_normalization_alignments::{IsNormalized, char::canonical_combining_class};

use super::ModelError;
use super::tokenizer::TextTokenizer;

/// Why streamed text was refused: the bytes are not UTF-8 (field `text`).
fn not_utf8(offset: usize, byte: u8) -> ModelError {
    ModelError::InvalidRequest {
        field: "text".into(),
        value: format!("byte 0x{byte:02x} at offset {offset}"),
        msg: "streamed text is not valid UTF-8".into(),
    }
}

/// Whether no character before `c` can change when the text is NFC-normalised: `c` starts a new
/// normalization segment (canonical combining class 0, and it never composes with what precedes
/// it: NFC quick check `Yes`).
fn nfc_boundary_before(c: char) -> bool {
    canonical_combining_class(c) == 0
        && matches!(
            unicode_normalization_alignments::is_nfc_quick(std::iter::once(c)),
            IsNormalized::Yes
        )
}

/// Tokenizes text given in fragments, committing ids that later text cannot change (module
/// documentation). `prefix` and `suffix` wrap the text as the prompt does (the assistant role
/// header and tail), so the committed ids are those of `prefix + text + suffix` as one string.
pub struct IncrementalTokenizer<'t> {
    tok: &'t TextTokenizer,
    /// `prefix` and every complete character received.
    text: String,
    /// Bytes of an incomplete UTF-8 character at the end of the last fragment (at most 3).
    partial: Vec<u8>,
    /// Bytes received so far (for error offsets).
    received: usize,
    /// `text[..committed]` is tokenized into `ids` for good.
    committed: usize,
    ids: Vec<u32>,
    /// Contents of the tokenizer's added tokens (which the text could still complete).
    added: Vec<String>,
    finished: bool,
}

impl<'t> IncrementalTokenizer<'t> {
    /// A tokenizer of `prefix + fragments… + suffix` (the suffix given to [`Self::finish`]).
    pub fn new(tok: &'t TextTokenizer, prefix: &str) -> Self {
        Self {
            tok,
            text: prefix.to_string(),
            partial: Vec::new(),
            received: 0,
            committed: 0,
            ids: Vec::new(),
            added: tok.added_token_contents(),
            finished: false,
        }
    }

    /// Ids committed so far (never changed afterwards).
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The text received so far (prefix included; an incomplete last character left out).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether [`Self::finish`] was called.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Adds a fragment of text and commits what became final; returns how many ids were
    /// committed now. Errors: [`ModelError::InvalidRequest`] (field `text`) for bytes that are not
    /// UTF-8 (the offset counts every byte pushed) or text after [`Self::finish`]; a tokenizer
    /// failure.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> Result<usize, ModelError> {
        if self.finished {
            return Err(ModelError::InvalidRequest {
                field: "text".into(),
                value: String::from_utf8_lossy(bytes).chars().take(40).collect(),
                msg: "text after the end of the streamed text".into(),
            });
        }
        let start = self.received - self.partial.len();
        self.received += bytes.len();
        let mut buf = std::mem::take(&mut self.partial);
        buf.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&buf) {
            Ok(s) => s.len(),
            Err(e) => match e.error_len() {
                // An incomplete character at the end: keep it for the next fragment.
                None => e.valid_up_to(),
                Some(_) => {
                    let at = e.valid_up_to();
                    return Err(not_utf8(start + at, buf[at]));
                }
            },
        };
        // `buf[..valid]` was checked above.
        self.text.push_str(
            std::str::from_utf8(&buf[..valid])
                .map_err(|e| ModelError::Tokenizer(format!("streamed text: {e}")))?,
        );
        self.partial = buf[valid..].to_vec();
        self.commit()
    }

    /// [`Self::push_bytes`] of a string.
    pub fn push(&mut self, text: &str) -> Result<usize, ModelError> {
        self.push_bytes(text.as_bytes())
    }

    /// Ends the text with `suffix` and commits everything; returns how many ids were committed
    /// now. Errors: an incomplete UTF-8 character at the end (field `text`), a tokenizer failure.
    pub fn finish(&mut self, suffix: &str) -> Result<usize, ModelError> {
        if self.finished {
            return Ok(0);
        }
        if let Some(&b) = self.partial.first() {
            return Err(ModelError::InvalidRequest {
                field: "text".into(),
                value: format!(
                    "byte 0x{b:02x} at offset {}",
                    self.received - self.partial.len()
                ),
                msg: "streamed text ends inside a UTF-8 character".into(),
            });
        }
        self.finished = true;
        self.text.push_str(suffix);
        let rest = self.tok.encode(&self.text[self.committed..])?;
        self.committed = self.text.len();
        self.ids.extend_from_slice(&rest);
        Ok(rest.len())
    }

    /// Commits the pieces before the last final boundary of the uncommitted text.
    fn commit(&mut self) -> Result<usize, ModelError> {
        let tail = &self.text[self.committed..];
        // The NFC-stable end: before the last character that starts a normalization segment.
        let Some(stable) = tail
            .char_indices()
            .rev()
            .find(|&(i, c)| i > 0 && nfc_boundary_before(c))
            .map(|(i, _)| i)
        else {
            return Ok(0);
        };
        let w = &tail[..stable];
        // Where text that could still become an added token starts.
        let hold = (0..w.len())
            .filter(|&s| w.is_char_boundary(s))
            .find(|&s| {
                let rest = &w[s..];
                self.added
                    .iter()
                    .any(|t| t.len() > rest.len() && t.starts_with(rest))
            })
            .unwrap_or(w.len());
        let Some(b) = self.tok.last_final_boundary(w, hold)? else {
            return Ok(0);
        };
        let piece = &w[..b];
        let new = self.tok.encode(piece)?;
        // Defensive: the pieces before `b` must tokenize as they do inside `w`.
        let whole = self.tok.encode(w)?;
        if !whole.starts_with(&new) {
            return Ok(0);
        }
        self.committed += b;
        self.ids.extend_from_slice(&new);
        Ok(new.len())
    }
}

impl TextTokenizer {
    /// Contents of the added tokens (special or not).
    pub fn added_token_contents(&self) -> Vec<String> {
        self.inner
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| t.content)
            .collect()
    }

    /// The last boundary `b ≤ hold`, `0 < b < w.len()`, of the split of `w` (added tokens, then
    /// the pre-tokenizer's pieces) that no text appended to `w` can move (module documentation).
    fn last_final_boundary(&self, w: &str, hold: usize) -> Result<Option<usize>, ModelError> {
        let tk = &self.inner;
        let mut pts = tk
            .get_added_vocabulary()
            .extract_and_normalize(tk.get_normalizer(), w);
        if let Some(pre) = tk.get_pre_tokenizer() {
            pre.pre_tokenize(&mut pts)
                .map_err(|e| ModelError::Tokenizer(format!("pre-tokenizing streamed text: {e}")))?;
        } else {
            // Without a pre-tokenizer BPE runs over whole segments: nothing is final before
            // the end.
            return Ok(None);
        }
        let splits = pts.get_splits(OffsetReferential::Original, OffsetType::Byte);
        let non_ws = |c: Option<char>| c.is_some_and(|c| !c.is_whitespace());
        let mut best = None;
        let mut prev_added = false;
        for (_, (start, _), tokens) in &splits {
            let b = *start;
            let added = tokens.is_some();
            if b > 0 && b < w.len() && b <= hold {
                // `b < w.len()`: the character after the boundary is there.
                let before = w[..b].chars().next_back();
                if prev_added || added || non_ws(before) {
                    best = Some(b);
                }
            }
            prev_added = added;
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// The tiny fixture's tokenizer (`tests/fixtures/tiny-customvoice`: the Qwen2 vocabulary
    /// pruned, 835 merges) with merges added for what a cut could change and its own merges do
    /// not cover (runs of spaces and newlines, punctuation with newlines; its Chinese merges are
    /// there already: `今天天气` is one id), so that a wrong commit shows in the ids.
    fn tokenizer() -> &'static TextTokenizer {
        static TOK: std::sync::OnceLock<TextTokenizer> = std::sync::OnceLock::new();
        TOK.get_or_init(build_tokenizer)
    }

    fn build_tokenizer() -> TextTokenizer {
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-customvoice");
        let dir = std::env::temp_dir().join(format!("omnitts-text-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut vocab: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(fixture.join("vocab.json")).expect("vocab"),
        )
        .expect("vocab json");
        let mut merges = std::fs::read_to_string(fixture.join("merges.txt")).expect("merges");
        // New tokens take the ids of the vocabulary's last (obscure, multi-byte) entries, so that
        // the ids stay contiguous below the added tokens'.
        let used: std::collections::HashSet<String> = merges
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(' '))
            .flat_map(|(a, b)| [a.to_string(), b.to_string(), format!("{a}{b}")])
            .collect();
        let mut spare: Vec<(u64, String)> = vocab
            .iter()
            .filter(|(k, _)| k.chars().count() >= 3 && !used.contains(*k))
            .map(|(k, v)| (v.as_u64().expect("id"), k.clone()))
            .collect();
        spare.sort_unstable();
        let mut add = |vocab: &mut serde_json::Map<String, serde_json::Value>, t: &str| {
            if !vocab.contains_key(t) {
                let (id, old) = spare.pop().expect("a spare id");
                vocab.remove(&old);
                vocab.insert(t.to_string(), id.into());
            }
        };
        let mut merge = |a: &str, b: &str| {
            for t in [a, b, &format!("{a}{b}")] {
                add(&mut vocab, t);
            }
            merges.push_str(&format!("{a} {b}\n"));
        };
        let (sp, nl, cr) = ("\u{120}", "\u{10A}", "\u{10D}");
        for (a, b) in [
            (sp, sp),
            (nl, nl),
            (cr, nl),
            (nl, sp),
            (sp, nl),
            (".", nl),
            ("!", nl),
            (".", "."),
            ("?", "!"),
        ] {
            merge(a, b);
        }
        let (sp2, nl2) = (format!("{sp}{sp}"), format!("{nl}{nl}"));
        merge(&sp2, sp);
        merge(&sp2, &sp2);
        merge(&nl2, nl);
        merge(nl, &sp2);
        merge(&nl2, &sp2);
        std::fs::write(
            dir.join("vocab.json"),
            serde_json::Value::Object(vocab).to_string(),
        )
        .expect("write vocab");
        std::fs::write(dir.join("merges.txt"), merges).expect("write merges");
        std::fs::copy(
            fixture.join("tokenizer_config.json"),
            dir.join("tokenizer_config.json"),
        )
        .expect("copy config");
        let tok = TextTokenizer::from_dir(&dir).expect("test tokenizer");
        let _ = std::fs::remove_dir_all(&dir);
        // The added merges do change tokenizations (else the test could not fail).
        let plain = TextTokenizer::from_dir(&fixture).expect("fixture tokenizer");
        for t in ["a\n  \nb", "x...\n"] {
            assert_ne!(tok.encode(t).unwrap(), plain.encode(t).unwrap(), "{t:?}");
        }
        tok
    }

    const PREFIX: &str = "<|im_start|>assistant\n";
    const SUFFIX: &str = "<|im_end|>\n<|im_start|>assistant\n";

    const TEXTS: &[&str] = &[
        "Hello world, it's a fine day. We'll see what they've done!",
        "The   quick brown fox\n\njumps over 12,345 lazy dogs... Really?!  ",
        "今天天气很好，我们去公园散步吧。你觉得怎么样？",
        "Mixed: 你好, world — “quoted” text; naïve café, Ångström.",
        "e\u{301}te\u{301} cafe\u{301} 한국어 \u{1100}\u{1161}\u{11A8} text",
        "Tabs\tand\r\nline breaks\n  indented <|im_end|> literal <think> and <|im_ start",
        "  leading spaces, trailing newline\n",
        "I'M SHOUTING'S 'RE 'll don't",
        "emoji 😀👍🏽 and symbols ©®™ ①②③ 3.14159",
        // Whitespace runs split by what follows them (`\s*[\r\n]+`, `\s+(?!\S)`).
        "Para one.\n  \nPara two. \n\n\n  End  x\n  \n  y\n \n\nz",
    ];

    /// Cuts `bytes` at `cuts` (sorted byte offsets) and feeds the pieces.
    fn feed(tok: &TextTokenizer, text: &str, cuts: &[usize]) -> (Vec<u32>, Vec<usize>) {
        let mut inc = IncrementalTokenizer::new(tok, PREFIX);
        let bytes = text.as_bytes();
        let mut at = 0;
        let mut committed = Vec::new();
        for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
            inc.push_bytes(&bytes[at..c]).expect("push");
            committed.push(inc.ids().len());
            at = c;
        }
        inc.finish(SUFFIX).expect("finish");
        (inc.ids().to_vec(), committed)
    }

    /// Committed ids equal the whole text's tokenization for random cut points (mid-word, mid
    /// UTF-8 character), one byte and one character at a time, and one fragment; and commits are
    /// never taken back (each prefix of committed ids is a prefix of the final ids, checked by
    /// construction: ids are only appended).
    #[test]
    fn fragments_tokenize_as_the_whole_text() {
        let tok = tokenizer();
        let mut rng = ChaCha8Rng::seed_from_u64(36);
        for text in TEXTS {
            let whole = tok.encode(&format!("{PREFIX}{text}{SUFFIX}")).unwrap();
            let n = text.len();
            let mut schedules: Vec<Vec<usize>> = vec![
                vec![],
                (1..n).collect(),
                text.char_indices()
                    .map(|(i, _)| i)
                    .filter(|&i| i > 0)
                    .collect(),
            ];
            for _ in 0..40 {
                let k = rng.random_range(1..=8.min(n));
                let mut cuts: Vec<usize> = (0..k).map(|_| rng.random_range(1..n)).collect();
                cuts.sort_unstable();
                cuts.dedup();
                schedules.push(cuts);
            }
            for cuts in &schedules {
                let (ids, _) = feed(tok, text, cuts);
                assert_eq!(ids, whole, "{text:?} cut at {cuts:?}");
            }
        }
    }

    /// Text is committed while it streams, one character at a time: everything but the last
    /// word (English) or the last clause (Chinese, one pre-token piece up to its punctuation) is
    /// committed before the end, so the talker can start on the first words.
    #[test]
    fn commits_before_the_end() {
        let tok = tokenizer();
        for (text, held) in [
            (
                "Hello world, it's a fine day. We'll see what they've done",
                " done",
            ),
            // The last character waits for the next (a combining mark could join it).
            (
                "Hello world, it's a fine day. We'll see what they've done!",
                " done!",
            ),
            // `[^\r\n\p{L}\p{N}]?\p{L}+`: the full stop starts the next clause's piece.
            (
                "今天天气很好，我们去公园散步吧。你觉得怎么样",
                "。你觉得怎么样",
            ),
            ("one two", " two"),
        ] {
            let cuts: Vec<usize> = text
                .char_indices()
                .map(|(i, _)| i)
                .filter(|&i| i > 0)
                .collect();
            let (ids, committed) = feed(tok, text, &cuts);
            let before_end = committed[committed.len() - 1];
            let head = &text[..text.len() - held.len()];
            let want = tok.encode(&format!("{PREFIX}{head}")).unwrap().len();
            assert_eq!(before_end, want, "{text:?}: committed before the end");
            assert!(ids.len() > want);
            // Commits grow with the text (never taken back).
            assert!(committed.windows(2).all(|w| w[0] <= w[1]), "{committed:?}");
        }
    }

    #[test]
    fn invalid_utf8_is_refused_with_its_offset() {
        let tok = tokenizer();
        let mut inc = IncrementalTokenizer::new(tok, PREFIX);
        inc.push("abc ").unwrap();
        let e = inc.push_bytes(b"d\xff").unwrap_err().to_string();
        assert!(e.contains("0xff at offset 5") && e.contains("UTF-8"), "{e}");
        let mut inc = IncrementalTokenizer::new(tok, PREFIX);
        inc.push_bytes("é".as_bytes().get(..1).unwrap()).unwrap();
        let e = inc.finish(SUFFIX).unwrap_err().to_string();
        assert!(e.contains("ends inside a UTF-8 character"), "{e}");
        let mut inc = IncrementalTokenizer::new(tok, PREFIX);
        inc.finish(SUFFIX).unwrap();
        assert!(inc.push("more").is_err());
    }
}
