//! Text that arrives while its utterance runs ([`super::Engine::submit_open`]): the caller's
//! [`TextSender`] appends fragments to a [`TextFeed`] that stage 0 drains each step into the
//! request's incremental tokenizer.

use std::sync::{Arc, Mutex};

use super::EngineError;
use super::chunk_buffer::Signal;
use super::stages::lock;

#[derive(Default)]
struct FeedState {
    /// Bytes appended since stage 0 last took them.
    bytes: Vec<u8>,
    ended: bool,
    /// Stage 0 let go of the request (its end of speech, a limit, an error, a cancel): what is
    /// appended now is never read.
    closed: bool,
    /// Bytes appended in all (for messages).
    total: usize,
}

/// The text of an open request, between its sender and stage 0.
pub(crate) struct TextFeed {
    state: Mutex<FeedState>,
    /// Stage 0's signal: woken on every append and at the end.
    signal: Arc<Signal>,
}

impl TextFeed {
    pub(crate) fn new(signal: Arc<Signal>) -> Arc<Self> {
        Arc::new(TextFeed {
            state: Mutex::new(FeedState::default()),
            signal,
        })
    }

    /// The bytes appended since the last call, and whether the text has ended.
    pub(crate) fn take(&self) -> (Vec<u8>, bool) {
        let mut g = lock(&self.state);
        (std::mem::take(&mut g.bytes), g.ended)
    }

    /// Stage 0 has let go of the request: later appends are refused (they would never be read).
    pub(crate) fn close(&self) {
        lock(&self.state).closed = true;
    }
}

/// The writing end of an open request's text ([`super::Engine::submit_open`]): append fragments
/// while the utterance runs, then [`TextSender::end`]. Dropping it ends the text too.
pub struct TextSender {
    feed: Arc<TextFeed>,
}

impl TextSender {
    pub(crate) fn new(feed: Arc<TextFeed>) -> Self {
        TextSender { feed }
    }

    /// Appends a fragment (any cut: mid-word, even mid UTF-8 character, as an LLM's byte-level
    /// tokens give them). Errors: [`EngineError::InvalidRequest`] (field `text`) after
    /// [`Self::end`], and once the request has finished (the model's end of speech,
    /// `max_new_tokens`, an error or a cancel: the fragment would never be spoken). Text that is
    /// not UTF-8 is found when stage 0 tokenizes it: the request then finishes with an error that
    /// names the byte and its offset.
    pub fn append_bytes(&self, fragment: &[u8]) -> Result<(), EngineError> {
        {
            let mut g = lock(&self.feed.state);
            let refused = if g.ended {
                Some("text appended after the end of the utterance's text")
            } else if g.closed {
                Some(
                    "the utterance's speech has ended (its end of speech, max_new_tokens, an \
                      error or a cancel): text appended now is not spoken",
                )
            } else {
                None
            };
            if let Some(msg) = refused {
                return Err(EngineError::InvalidRequest {
                    field: "text".into(),
                    value: String::from_utf8_lossy(fragment).chars().take(40).collect(),
                    msg: msg.into(),
                });
            }
            g.bytes.extend_from_slice(fragment);
            g.total += fragment.len();
        }
        self.feed.signal.notify();
        Ok(())
    }

    /// [`Self::append_bytes`] of a string.
    pub fn append(&self, fragment: &str) -> Result<(), EngineError> {
        self.append_bytes(fragment.as_bytes())
    }

    /// Ends the text (idempotent): the utterance speaks what it has and finishes. Returns
    /// whether this call ended it.
    pub fn end(&self) -> bool {
        let was = {
            let mut g = lock(&self.feed.state);
            std::mem::replace(&mut g.ended, true)
        };
        self.feed.signal.notify();
        !was
    }

    /// Whether the text has ended.
    pub fn is_ended(&self) -> bool {
        lock(&self.feed.state).ended
    }

    /// Bytes appended so far.
    pub fn appended(&self) -> usize {
        lock(&self.feed.state).total
    }
}

impl Drop for TextSender {
    fn drop(&mut self) {
        self.end();
    }
}
