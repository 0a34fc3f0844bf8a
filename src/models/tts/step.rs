//! What stage 0 produces per row and step.

/// Why an utterance ended (model level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// The model produced its end-of-speech token (Qwen3-TTS: the codec EOS id on codebook 0;
    /// Fish S2 Pro: `<|im_end|>`, whose frame is dropped).
    Eos,
    /// `max_new_tokens` (or the model's position limit) was reached.
    Length,
}

/// What one row of a stage-0 step gives: a frame, or the end of the utterance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArStep {
    /// One codec frame: one code per codebook, each below its codebook's size.
    Frame(Vec<u32>),
    /// The utterance is over (asking again gives the same answer at no cost).
    Finished(FinishReason),
}
