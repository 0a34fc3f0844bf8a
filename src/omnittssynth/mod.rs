//! `omnittssynth`: speaking timed text on the pipeline's timeline. Each `text/x-raw` buffer is a
//! cue spoken from its PTS, its duration the cue's slot, into one continuous sample-exact stream.
//!
//! The element's parts that need no pipeline:
//! - [`cue_text`]: a buffer's bytes → the text a cue speaks (UTF-8 checked, pango markup stripped);
//! - [`timeline`]: where each cue's speech goes in the output, silence between cues, the overflow
//!   policy when speech is longer than its slot, mixing, and live lateness;
//! - [`overflow`]: the `overflow` policies and what they did with a cue.

pub mod cue_text;
pub mod overflow;
pub mod timeline;
