//! The two-stage engine: stage 0 (AR) and stage 1 (Code2Wav) tasks joined by the async-chunk buffer.
