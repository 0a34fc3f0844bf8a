//! Progress messages around long operations (model loading): start, then complete or error,
//! under one code, as GStreamer applications show them (`gst-launch-1.0` prints them).

use gst::prelude::*;

fn post(element: &gst::Element, kind: gst::ProgressType, code: &str, text: &str) {
    let _ = element.post_message(
        gst::message::Progress::builder(kind, code, text)
            .src(element)
            .build(),
    );
}

/// The operation `code` (e.g. "load") has started; `text` says what it does.
pub(crate) fn post_start(element: &gst::Element, code: &str, text: &str) {
    post(element, gst::ProgressType::Start, code, text);
}

/// The operation `code` has completed; `text` says with what result.
pub(crate) fn post_complete(element: &gst::Element, code: &str, text: &str) {
    post(element, gst::ProgressType::Complete, code, text);
}

/// The operation `code` has failed (the error message itself is posted separately).
pub(crate) fn post_error(element: &gst::Element, code: &str, text: &str) {
    post(element, gst::ProgressType::Error, code, text);
}
