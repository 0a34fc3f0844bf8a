//! Server-sent events (the `text/event-stream` body of a `stream_format: "sse"` request), parsed
//! incrementally as the bytes arrive, after the WHATWG HTML "event stream interpretation": lines
//! end in LF, CRLF or CR; `event:` names the event, `data:` lines are joined with LF, a line
//! starting with `:` is a comment, a blank line dispatches the event. `id:` and `retry:` are
//! ignored (one request, no reconnection).

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, empty when the event had none.
    pub event: String,
    /// The `data:` lines joined with `\n`.
    pub data: String,
}

/// Longest line accepted, in bytes: an SSE line of vLLM-Omni carries one audio delta in base64
/// (a Code2Wav chunk of 25 frames is 128 KB of base64); anything far beyond is not this protocol.
pub const MAX_LINE_BYTES: usize = 16 << 20;

/// Incremental parser: [`SseParser::push`] bytes as they arrive, get the events they complete.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    /// The previous byte was a CR (a following LF belongs to the same line end).
    after_cr: bool,
    event: String,
    data: String,
    has_data: bool,
}

/// The event stream is not SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line longer than [`MAX_LINE_BYTES`].
    #[error("an event-stream line is longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    /// A line that is not UTF-8.
    #[error("an event-stream line is not UTF-8")]
    NotUtf8,
}

impl SseParser {
    /// Parses `bytes`, appending the events they complete to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        for &b in bytes {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    self.end_line(out)?;
                }
                _ => {
                    self.after_cr = false;
                    if self.line.len() >= MAX_LINE_BYTES {
                        return Err(SseError::LineTooLong);
                    }
                    self.line.push(b);
                }
            }
        }
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            }
            self.event.clear();
            self.has_data = false;
            return Ok(());
        }
        let line = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        match field {
            "event" => self.event = value.to_string(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(text: &str, piece: usize) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for chunk in text.as_bytes().chunks(piece) {
            p.push(chunk, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn events_are_the_same_whatever_the_read_boundaries() {
        let text = "event: speech.audio.delta\ndata: {\"a\":1}\n\n: comment\r\n\
                    data: one\r\ndata:two\r\n\r\nevent: speech.audio.done\rdata: {}\r\r";
        let want = vec![
            SseEvent {
                event: "speech.audio.delta".into(),
                data: "{\"a\":1}".into(),
            },
            SseEvent {
                event: String::new(),
                data: "one\ntwo".into(),
            },
            SseEvent {
                event: "speech.audio.done".into(),
                data: "{}".into(),
            },
        ];
        for piece in [1, 2, 3, 7, 1000] {
            assert_eq!(parse_in_pieces(text, piece), want, "pieces of {piece}");
        }
    }

    #[test]
    fn an_event_without_data_or_blank_line_is_not_dispatched() {
        assert!(parse_in_pieces("event: x\n\n", 4).is_empty());
        assert!(parse_in_pieces("data: pending\n", 4).is_empty());
    }

    #[test]
    fn binary_is_refused() {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        assert_eq!(
            p.push(b"data: \xff\xfe\n", &mut out),
            Err(SseError::NotUtf8)
        );
    }
}
