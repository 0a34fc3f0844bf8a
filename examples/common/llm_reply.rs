//! The simulated LLM reply of the text-streaming benchmarks (`bench_text_stream`, through the
//! element; `bench_streams --text-rates`, through the engine), cut into tokens as a byte-level BPE
//! would cut it: each word with its leading space, words of more than 5 letters in two tokens
//! (74 tokens for the 60 words).

/// The reply: 60 words of plain sentences (no digits: the bundled voice reads none).
pub const REPLY: &str = "It was a fine morning, and the rain \
    had stopped at last. The river was high after the storm, so the path along the water was \
    closed. She walked through the park instead and watched the children play near the old \
    fountain. In the evening the sky cleared and the stars came out over the quiet little town at night.";

/// The reply's tokens: each word with its leading space, long words in two.
pub fn tokens() -> Vec<String> {
    let mut out = Vec::new();
    for (i, w) in REPLY.split_whitespace().enumerate() {
        let w = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let chars: Vec<char> = w.chars().collect();
        if chars.len() > 6 {
            let cut = chars.len() / 2;
            out.push(chars[..cut].iter().collect());
            out.push(chars[cut..].iter().collect());
        } else {
            out.push(w);
        }
    }
    out
}
