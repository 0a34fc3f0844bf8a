//! omnitts: Qwen3-TTS text-to-speech for GStreamer.
//!
//! The flow, top to bottom: the `omnittssrc` element ([`omnittssrc`]) drives the two-stage
//! [`engine`], whose stage 0 (talker + code predictor) and stage 1 (Code2Wav) run the
//! [`models::qwen3_tts`] model, built from the layers in [`nn`].

pub mod engine;
pub mod models;
pub mod nn;
