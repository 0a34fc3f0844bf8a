//! The Qwen2 byte-level BPE text tokenizer (reference: `Qwen2TokenizerFast` loaded by
//! `processing_qwen3_tts.py`; docs/qwen3-tts.md §2).
//!
//! The published checkpoints ship `vocab.json` + `merges.txt` + `tokenizer_config.json` and no
//! `tokenizer.json`. [`TextTokenizer::from_vocab_merges`] builds the same pipeline the
//! transformers slow→fast conversion builds: NFC normalizer, a `Split` on the Qwen2 regex
//! (Isolated), `ByteLevel(add_prefix_space=false, use_regex=false)` pre-tokenizer and decoder, BPE
//! without unk/dropout, and every entry of `added_tokens_decoder` as an added token (special or
//! not, as declared). If a `tokenizer.json` exists it is preferred, as transformers does.

use std::path::Path;

use serde_json::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::ModelError;
use super::config::read_json;

/// The Qwen2 pre-tokenizer regex (not the Mistral one that transformers 4.57.3 may patch in for
/// local directories; see docs/qwen3-tts.md §2).
pub const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Text tokenizer of a checkpoint.
pub struct TextTokenizer {
    pub(super) inner: Tokenizer,
}

fn tok_err(file: &Path, e: impl std::fmt::Display) -> ModelError {
    ModelError::Tokenizer(format!("{}: {e}", file.display()))
}

impl TextTokenizer {
    /// Loads from a checkpoint directory: `tokenizer.json` if present, otherwise
    /// `vocab.json` + `merges.txt` (+ `tokenizer_config.json`).
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        let tj = dir.join("tokenizer.json");
        if tj.is_file() {
            let inner = Tokenizer::from_file(&tj).map_err(|e| tok_err(&tj, e))?;
            return Ok(Self { inner });
        }
        Self::from_vocab_merges(dir)
    }

    /// Builds the tokenizer from `vocab.json`, `merges.txt` and (if present)
    /// `tokenizer_config.json` in `dir`, ignoring any `tokenizer.json`.
    pub fn from_vocab_merges(dir: &Path) -> Result<Self, ModelError> {
        let vocab = dir.join("vocab.json");
        let merges = dir.join("merges.txt");
        for f in [&vocab, &merges] {
            if !f.is_file() {
                return Err(ModelError::Io {
                    path: f.clone(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "tokenizer file not found (and no tokenizer.json)",
                    ),
                });
            }
        }
        let path_str = |p: &Path| -> Result<String, ModelError> {
            p.to_str()
                .map(str::to_string)
                .ok_or_else(|| tok_err(p, "path is not valid UTF-8"))
        };
        let bpe = BPE::from_file(&path_str(&vocab)?, &path_str(&merges)?)
            .build()
            .map_err(|e| tok_err(&vocab, e))?;
        let mut tk = Tokenizer::new(bpe);
        let split = Split::new(
            SplitPattern::Regex(QWEN2_PATTERN.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| tok_err(&vocab, e))?;
        tk.with_normalizer(Some(NFC));
        tk.with_pre_tokenizer(Some(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])));
        tk.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

        let cfg = dir.join("tokenizer_config.json");
        if cfg.is_file() {
            let v = read_json(&cfg)?;
            if let Some(added) = v.get("added_tokens_decoder") {
                let map = added.as_object().ok_or_else(|| ModelError::Config {
                    file: cfg.clone(),
                    field: "added_tokens_decoder".into(),
                    msg: "expected an object".into(),
                })?;
                // Insert in id order so that ids line up with the declared ones.
                let mut entries: Vec<(u64, &Value)> = Vec::with_capacity(map.len());
                for (k, v) in map {
                    let id: u64 = k.parse().map_err(|_| ModelError::Config {
                        file: cfg.clone(),
                        field: format!("added_tokens_decoder.{k}"),
                        msg: "key is not a token id".into(),
                    })?;
                    entries.push((id, v));
                }
                entries.sort_by_key(|(id, _)| *id);
                for (id, v) in entries {
                    let field = format!("added_tokens_decoder.{id}");
                    let content = v.get("content").and_then(Value::as_str).ok_or_else(|| {
                        ModelError::Config {
                            file: cfg.clone(),
                            field: format!("{field}.content"),
                            msg: "missing or not a string".into(),
                        }
                    })?;
                    let flag = |name: &str, default: bool| {
                        v.get(name).and_then(Value::as_bool).unwrap_or(default)
                    };
                    let special = flag("special", false);
                    let token = AddedToken::from(content, special)
                        .lstrip(flag("lstrip", false))
                        .rstrip(flag("rstrip", false))
                        .single_word(flag("single_word", false))
                        .normalized(flag("normalized", !special));
                    if special {
                        tk.add_special_tokens(&[token]);
                    } else {
                        tk.add_tokens(&[token]);
                    }
                    let got = tk.token_to_id(content);
                    if got != Some(id as u32) {
                        return Err(ModelError::Config {
                            file: cfg.clone(),
                            field: field.clone(),
                            msg: format!(
                                "added token {content:?} declared with id {id} but the vocabulary gives {got:?}"
                            ),
                        });
                    }
                }
            }
        }
        Ok(Self { inner: tk })
    }

    /// Token ids of `text` (no special tokens are added; special-token strings inside the text
    /// are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| ModelError::Tokenizer(format!("encoding {text:?}: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids back to text (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| ModelError::Tokenizer(format!("decoding {ids:?}: {e}")))
    }

    /// The tokenizer serialised in the `tokenizer.json` format.
    pub fn to_json(&self) -> Result<String, ModelError> {
        self.inner
            .to_string(false)
            .map_err(|e| ModelError::Tokenizer(format!("serialising: {e}")))
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}
