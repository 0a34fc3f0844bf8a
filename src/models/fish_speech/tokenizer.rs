//! The text tokenizer (`tokenizer.json`, a byte-level BPE with Qwen3's special tokens and Fish's:
//! `<|im_start|>`, `<|im_end|>`, `<|voice|>`, `<|speaker:i|>`, and the 4096 contiguous
//! `<|semantic:i|>` tokens whose ids carry codebook 0 in the prompt and in the slow AR's output).

use std::collections::HashSet;
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use tokenizers::Tokenizer;

use super::error::{FishError, Result};

/// `<|im_start|>`.
pub const IM_START: &str = "<|im_start|>";
/// `<|im_end|>`: ends a turn; the slow AR's stop token.
pub const IM_END: &str = "<|im_end|>";
/// `<|voice|>`: the assistant turn's modality (speech).
pub const VOICE: &str = "<|voice|>";

/// The tokenizer with the ids the model needs.
#[derive(Clone)]
pub struct FishTokenizer {
    tok: Tokenizer,
    /// Id of `<|semantic:0|>`.
    pub semantic_begin: u32,
    /// Id of `<|semantic:N-1|>` (inclusive).
    pub semantic_end: u32,
    pub im_end: u32,
    /// The spellings of every added (special) token, for refusing them in user text.
    specials: HashSet<String>,
}

impl std::fmt::Debug for FishTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FishTokenizer")
            .field("semantic_begin", &self.semantic_begin)
            .field("semantic_end", &self.semantic_end)
            .field("im_end", &self.im_end)
            .finish()
    }
}

impl FishTokenizer {
    /// Reads `dir/tokenizer.json`. The semantic tokens must be contiguous ids (the prompt maps
    /// code `c` to `semantic_begin + c`, as the reference does).
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let tok = Tokenizer::from_file(&path)
            .map_err(|e| FishError::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::from_tokenizer(tok)
    }

    /// Wraps a loaded tokenizer.
    pub fn from_tokenizer(tok: Tokenizer) -> Result<Self> {
        let id = |t: &str| {
            tok.token_to_id(t)
                .ok_or_else(|| FishError::Tokenizer(format!("no token {t}")))
        };
        let mut semantic = Vec::new();
        for i in 0.. {
            match tok.token_to_id(&format!("<|semantic:{i}|>")) {
                Some(id) => semantic.push(id),
                None => break,
            }
        }
        let (Some(&first), Some(&last)) = (semantic.first(), semantic.last()) else {
            return Err(FishError::Tokenizer("no <|semantic:i|> tokens".into()));
        };
        if semantic
            .iter()
            .enumerate()
            .any(|(i, &t)| t != first + i as u32)
        {
            return Err(FishError::Tokenizer(
                "the <|semantic:i|> tokens are not contiguous ids".into(),
            ));
        }
        let specials = tok
            .get_added_tokens_decoder()
            .values()
            .filter(|t| t.special)
            .map(|t| t.content.clone())
            .collect();
        Ok(Self {
            semantic_begin: first,
            semantic_end: last,
            im_end: id(IM_END)?,
            specials,
            tok,
        })
    }

    /// Number of semantic tokens (4096).
    pub fn num_semantic(&self) -> usize {
        (self.semantic_end - self.semantic_begin + 1) as usize
    }

    /// Whether `id` is a semantic token.
    pub fn is_semantic(&self, id: u32) -> bool {
        (self.semantic_begin..=self.semantic_end).contains(&id)
    }

    /// Ids of `text`, special tokens in it matched as tokens, none added (the reference encodes
    /// each prompt piece this way).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .tok
            .encode(text, false)
            .map_err(|e| FishError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Errors when `text` holds a special token other than a `<|speaker:N|>` tag: user text must
    /// not be able to close a turn, switch modality or inject semantic tokens.
    pub fn check_user_text(&self, field: &'static str, text: &str) -> Result<()> {
        let mut rest = text;
        while let Some(start) = rest.find("<|") {
            let after = &rest[start..];
            if let Some(end) = after.find("|>") {
                let tag = &after[..end + 2];
                if self.specials.contains(tag) && !is_speaker_tag(tag) {
                    return Err(FishError::InvalidRequest {
                        field,
                        msg: format!("the control token {tag} is not allowed in text"),
                    });
                }
            }
            rest = &after[2..];
        }
        Ok(())
    }
}

/// How every speaker tag begins ([`SPEAKER_TAG`]).
pub const SPEAKER_TAG_START: &str = "<|speaker:";

/// `<|speaker:N|>`: the reference's pattern `<\|speaker:\d+\|>`, whose `\d` (a Python `str`
/// pattern) is any Unicode decimal digit, so `<|speaker:３|>` (fullwidth) is a tag as well.
pub static SPEAKER_TAG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"<\|speaker:\d+\|>").expect("a fixed, valid pattern (unit-tested)")
});

/// Whether `s` is one whole speaker tag ([`SPEAKER_TAG`]).
pub fn is_speaker_tag(s: &str) -> bool {
    SPEAKER_TAG
        .find(s)
        .is_some_and(|m| m.start() == 0 && m.end() == s.len())
}
