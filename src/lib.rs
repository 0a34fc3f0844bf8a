//! omnitts: Qwen3-TTS and Fish Audio S2 Pro text-to-speech for GStreamer.
//!
//! The flow, top to bottom: the elements ([`omnittssrc`], [`omnittssynth`]) drive the two-stage
//! [`engine`], whose stage 0 (the AR model) and stage 1 (the codec decoder) run a model family
//! through the seam in [`models::tts`] ([`models::registry`] picks the family by the
//! checkpoint's `model_type`: [`models::qwen3_tts`] or [`models::fish_speech`]), built from the
//! layers in [`nn`].
//!
//! The crate is the GStreamer plugin `omnitts` (`libgstomnitts.so`). Applications that link it
//! statically call [`plugin_register_static`] once after `gst::init()`.

mod config_path;
pub mod element_common;
pub mod engine;
pub mod models;
pub mod nn;
pub mod omnittssrc;
pub mod omnittssynth;
pub mod remote;

use gst::glib;

fn plugin_init(plugin: &gst::Plugin) -> Result<(), glib::BoolError> {
    if let Some(file) = plugin.filename() {
        element_common::bundled_voice::set_plugin_file(file);
    }
    omnittssrc::register(plugin)?;
    omnittssynth::register(plugin)
}

gst::plugin_define!(
    omnitts,
    env!("CARGO_PKG_DESCRIPTION"),
    plugin_init,
    concat!(env!("CARGO_PKG_VERSION"), "-", env!("COMMIT_ID")),
    // GStreamer knows "MIT/X11"; the crate is MIT OR Apache-2.0.
    "MIT/X11",
    env!("CARGO_PKG_NAME"),
    env!("CARGO_PKG_NAME"),
    env!("CARGO_PKG_REPOSITORY"),
    env!("BUILD_REL_DATE")
);
