//! A failed start posts one error, the clear one: both elements, in a pipeline, with a model path
//! that does not exist. (GstBaseSrc posts a generic "state change failed and some element failed
//! to post a proper error message" of its own when a subclass's start() fails, so omnittssrc
//! loads before BaseSrc starts.)

mod element_util;
mod reference_util;

use element_util::{drain, errors, init};
use gst::prelude::*;

/// Takes `pipeline` to PAUSED, which must fail, and returns the error messages on its bus.
fn failed_start_errors(pipeline: &gst::Pipeline) -> Vec<String> {
    let bus = pipeline.bus().expect("bus");
    let res = pipeline.set_state(gst::State::Paused);
    let msgs = drain(&bus);
    pipeline.set_state(gst::State::Null).expect("to NULL");
    assert!(res.is_err(), "the start succeeded");
    errors(&msgs)
}

fn assert_one_clear_error(errs: &[String], value: &str) {
    assert_eq!(errs.len(), 1, "exactly one error message: {errs:#?}");
    let message = errs[0].split(" | ").next().unwrap_or_default();
    assert!(
        message.contains("model") && message.contains(value),
        "the error names the property and its value: {errs:?}"
    );
    assert!(!errs[0].contains("state change failed"), "{errs:?}");
}

#[test]
fn omnittssrc_bad_model_posts_exactly_one_error() {
    init();
    let value = "/nonexistent/omnitts-load-error";
    let pipeline = gst::parse::launch(&format!("omnittssrc model={value} text=Hello. ! fakesink"))
        .unwrap()
        .downcast::<gst::Pipeline>()
        .unwrap();
    assert_one_clear_error(&failed_start_errors(&pipeline), value);
}

#[test]
fn omnittssynth_bad_model_posts_exactly_one_error() {
    init();
    let value = "/nonexistent/omnitts-load-error";
    let pipeline = gst::parse::launch(&format!(
        "appsrc caps=text/x-raw,format=utf8 format=time ! omnittssynth model={value} ! fakesink"
    ))
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    assert_one_clear_error(&failed_start_errors(&pipeline), value);
}

#[test]
fn omnittssrc_a_failed_start_can_be_retried() {
    // The load moved out of BaseSrc's start(): a failed start leaves nothing behind, and the
    // element starts once the value is fixed.
    init();
    let pipeline = gst::parse::launch(
        "omnittssrc name=src model=/nonexistent/omnitts-load-error text=Hello. max-new-tokens=3 \
         do-sample=false ! fakesink",
    )
    .unwrap()
    .downcast::<gst::Pipeline>()
    .unwrap();
    assert_eq!(failed_start_errors(&pipeline).len(), 1);
    let src = pipeline.by_name("src").unwrap();
    src.set_property("model", reference_util::fixture_model("tiny-customvoice"));
    let dones = element_util::play_to_eos(pipeline.upcast_ref());
    assert_eq!(dones.len(), 1);
}
