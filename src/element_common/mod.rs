//! What the omnitts elements share, so that every element speaks with the same properties, the
//! same rules and the same messages.
//!
//! ```text
//! properties ─► SynthesisSettings ─► load (engine, ModelInfo, VoiceCloner) ─► build_request ─► EngineRequest
//!                                                                               (voice_clone: the reference)
//!            └ server set: ServerSettings ─► server_load (probe) ─► server_request ─► SpeechRequest
//!                                                                  (ref_audio: the reference as a data URL)
//! Engine audio ─► audio (caps, sample timeline, buffers) ─► messages (per utterance) / progress (loading)
//! ```
//!
//! - [`settings`]: the values of the synthesis properties (model, stage config, devices, voice,
//!   sampling, chunk sizes) and their defaults;
//! - [`properties`]: those properties' param specs, set and get, and the read-only ones that
//!   describe the loaded checkpoint;
//! - [`load`]: from the settings to a loaded [`Engine`](crate::engine::Engine) and what it tells
//!   about its checkpoint ([`request::ModelInfo`]);
//! - [`request`]: settings + text → [`EngineRequest`](crate::engine::EngineRequest);
//! - [`voice_clone`], [`ref_audio`]: Base checkpoints' reference voice;
//! - [`voice_warnings`]: voice settings the checkpoint ignores, warned once;
//! - [`hub`]: the `model` property resolved to a checkpoint directory; [`bundled_voice`]: where
//!   the default `model`, the bundled voice, is found;
//! - [`audio`]: the output caps, the sample ↔ time mapping and the output buffers;
//! - [`messages`], [`progress`]: the bus messages per utterance and around model loading;
//! - [`input_error`]: how a rejected property value is reported;
//! - [`sentences`], [`split_policy`]: the `split-sentences` property: where a text splits into
//!   sentences, and when;
//! - [`clauses`]: text streamed with `append-text` in clause mode, cut into clauses as it arrives;
//!   [`clause_speech`]: those clauses spoken one request each, back to back as one utterance;
//! - [`text_checks`]: markup the elements do not interpret (SSML) removed, and text in a script
//!   the checkpoint's languages do not cover, each with a warning;
//! - [`server`], [`server_load`], [`server_request`]: the same through a speech server
//!   ([`crate::remote`]) instead of a local engine: its properties, the probe at start, settings +
//!   text → speech request;
//! - [`utf8_join`]: text that arrives as bytes in pieces, characters cut between them joined;
//! - [`backend`]: what the worker synthesises with, the engine or the server, behind one
//!   request / handle / cancel.

pub mod audio;
pub(crate) mod backend;
pub(crate) mod bundled_voice;
pub(crate) mod clause_speech;
pub(crate) mod clauses;
pub mod hub;
pub(crate) mod input_error;
pub(crate) mod load;
pub mod messages;
pub(crate) mod progress;
pub(crate) mod properties;
pub mod ref_audio;
pub(crate) mod request;
pub(crate) mod sentences;
pub(crate) mod server;
pub(crate) mod server_load;
pub(crate) mod server_request;
pub(crate) mod settings;
pub(crate) mod split_policy;
pub(crate) mod text_checks;
pub(crate) mod turns;
pub(crate) mod utf8_join;
pub(crate) mod voice_clone;
pub(crate) mod voice_warnings;
