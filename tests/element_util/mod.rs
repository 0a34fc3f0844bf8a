//! Helpers shared by the element test files: GStreamer/plugin init, temp folders, property
//! values, bus messages, state changes that must fail, pipelines played to EOS.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Once;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use gst::glib;
use gst::prelude::*;

/// `gst::init()` and static registration of the plugin, once per test binary.
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        gst::init().expect("gst::init");
        gstomnitts::plugin_register_static().expect("register omnitts");
    });
}

/// A fresh, empty folder under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "omnitts-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n * SECOND / 24000`, rounded down (the element's timestamp rule).
pub fn pts_of(n: u64) -> gst::ClockTime {
    gst::ClockTime::from_nseconds((n as u128 * 1_000_000_000u128 / 24_000u128) as u64)
}

/// Drains `bus` (non-blocking).
pub fn drain(bus: &gst::Bus) -> Vec<gst::Message> {
    let mut out = Vec::new();
    while let Some(m) = bus.pop() {
        out.push(m);
    }
    out
}

/// Element messages named `name`, as structures.
pub fn element_messages(msgs: &[gst::Message], name: &str) -> Vec<gst::Structure> {
    msgs.iter()
        .filter_map(|m| match m.view() {
            gst::MessageView::Element(e) => e
                .structure()
                .filter(|s| s.name() == name)
                .map(|s| s.to_owned()),
            _ => None,
        })
        .collect()
}

/// Checks that `msgs` hold one `omnitts/text-stream-mode` message, for mode `mode` with a reason
/// that contains `why`.
pub fn assert_stream_mode(msgs: &[gst::Message], mode: &str, why: &str) {
    let modes = element_messages(msgs, gstomnitts::element_common::messages::TEXT_STREAM_MODE);
    assert_eq!(modes.len(), 1, "{modes:?}");
    assert_eq!(modes[0].get::<String>("mode").unwrap(), mode, "{modes:?}");
    let reason = modes[0].get::<String>("reason").unwrap();
    assert!(reason.contains(why), "{reason}");
}

/// Error messages as "text | debug" strings.
pub fn errors(msgs: &[gst::Message]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m.view() {
            gst::MessageView::Error(e) => Some(text_and_debug(&e.error(), e.debug())),
            _ => None,
        })
        .collect()
}

/// Warning messages as "text | debug" strings (as [`errors`]).
pub fn warnings(msgs: &[gst::Message]) -> Vec<String> {
    msgs.iter()
        .filter_map(|m| match m.view() {
            gst::MessageView::Warning(w) => Some(text_and_debug(&w.error(), w.debug())),
            _ => None,
        })
        .collect()
}

/// The one "EOS: …" warning (what an EOS event drops) among `msgs`; panics, naming `what` and
/// every warning, unless there is exactly one.
#[allow(dead_code)]
pub fn one_eos_warning(msgs: &[gst::Message], what: &str) -> String {
    let all = warnings(msgs);
    let eos: Vec<&String> = all.iter().filter(|w| w.starts_with("EOS:")).collect();
    assert_eq!(eos.len(), 1, "{what}: EOS warnings among {all:?}");
    eos[0].clone()
}

fn text_and_debug(error: &gst::glib::Error, debug: Option<gst::glib::GString>) -> String {
    format!(
        "{error} | {}",
        debug.map(|d| d.to_string()).unwrap_or_default()
    )
}

/// Plays the harness's element with its streaming thread held at the first buffer (so that text
/// pushed meanwhile is certain to arrive before EOS); returns once it is held. Remove the probe
/// (`pad.remove_probe(probe)`) to let it go on. Panics after 60 s without a first buffer.
pub fn play_holding_first_buffer(h: &mut gst_check::Harness) -> (gst::Pad, gst::PadProbeId) {
    use gst::prelude::{ElementExt, PadExtManual};
    let pad = h.element().unwrap().static_pad("src").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = pad
        .add_probe(
            gst::PadProbeType::BLOCK | gst::PadProbeType::BUFFER,
            move |_, _| {
                let _ = tx.send(());
                gst::PadProbeReturn::Ok
            },
        )
        .unwrap();
    h.play();
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("first buffer");
    (pad, probe)
}

/// Plays `pipeline` to EOS (panics on an error message or after 60 s without a message), sets it
/// back to NULL and returns the element's `omnitts/utterance-done` structures.
pub fn play_to_eos(pipeline: &gst::Element) -> Vec<gst::Structure> {
    use gst::prelude::ElementExt;
    let bus = pipeline.bus().expect("pipeline bus");
    pipeline
        .set_state(gst::State::Playing)
        .expect("pipeline to PLAYING");
    let mut dones = Vec::new();
    loop {
        let msg = bus
            .timed_pop(gst::ClockTime::from_seconds(60))
            .expect("pipeline stalled");
        match msg.view() {
            gst::MessageView::Eos(_) => break,
            gst::MessageView::Error(e) => panic!("{} {:?}", e.error(), e.debug()),
            gst::MessageView::Element(e) => {
                if let Some(s) = e
                    .structure()
                    .filter(|s| s.name() == gstomnitts::element_common::messages::DONE)
                {
                    dones.push(s.to_owned());
                }
            }
            _ => {}
        }
    }
    pipeline
        .set_state(gst::State::Null)
        .expect("pipeline to NULL");
    dones
}

/// A property value (Send, so that property lists can go to other threads). Enum properties take
/// their nick as a string (see [`set`]).
pub fn v<T: ToSendValue>(x: T) -> glib::SendValue {
    x.to_send_value()
}

/// Sets property `name` of `e` to `value`; a string for an enum property is its nick.
pub fn set(e: &gst::Element, name: &str, value: &glib::Value) {
    let pspec = e
        .find_property(name)
        .unwrap_or_else(|| panic!("no property {name}"));
    if pspec.value_type().is_a(glib::Type::ENUM) {
        e.set_property_from_str(name, value.get::<&str>().unwrap());
    } else {
        e.set_property_from_value(name, value);
    }
}

/// A harness around an `omnittssrc` on the tiny CustomVoice fixture, greedy, with a bus of its
/// own, and `props` set in order (with [`set`]). Returns the harness and the bus.
pub fn harness(props: &[(&str, glib::SendValue)]) -> (gst_check::Harness, gst::Bus) {
    init();
    let h = gst_check::Harness::new("omnittssrc");
    let e = h.element().expect("element");
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    e.set_property(
        "model",
        crate::reference_util::fixture_model("tiny-customvoice"),
    );
    e.set_property("do-sample", false);
    for (k, val) in props {
        set(&e, k, val);
    }
    (h, bus)
}

/// An `omnittssynth` on `model`, greedy, at most `max_tokens` codec frames an utterance, `props`
/// (as gst-launch spells them) set in order after those, with a bus of its own.
pub fn synth_element(
    model: &str,
    max_tokens: u32,
    props: &[(&str, &str)],
) -> (gst::Element, gst::Bus) {
    init();
    let e = gst::ElementFactory::make("omnittssynth")
        .property("model", model)
        .property("do-sample", false)
        .property("max-new-tokens", max_tokens)
        .build()
        .expect("omnittssynth");
    for (k, val) in props {
        e.set_property_from_str(k, val);
    }
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    (e, bus)
}

/// [`synth_element`] in a Harness with a non-live upstream of UTF-8 text.
pub fn synth_harness(
    model: &str,
    max_tokens: u32,
    props: &[(&str, &str)],
) -> (gst_check::Harness, gst::Bus) {
    let (e, bus) = synth_element(model, max_tokens, props);
    let mut h = gst_check::Harness::with_element(&e, Some("sink"), Some("src"));
    h.set_live(false);
    h.set_src_caps_str("text/x-raw,format=utf8");
    (h, bus)
}

/// Starts an `omnittssrc` on `model` with `props` (set in order, after `model`) to PAUSED; expects
/// the state change to fail and returns the error messages posted.
pub fn start_error(model: &str, props: &[(&str, glib::SendValue)]) -> Vec<String> {
    init();
    let e = gst::ElementFactory::make("omnittssrc").build().unwrap();
    e.set_property("model", model);
    for (k, val) in props {
        set(&e, k, val);
    }
    start_must_fail(&e, &format!("{props:?}"))
}

/// Takes `e` (properties already set) to PAUSED; asserts that the state change fails and that an
/// error is posted, and returns the error messages (`what` names the case in failures).
pub fn start_must_fail(e: &gst::Element, what: &str) -> Vec<String> {
    use gst::prelude::ElementExt;
    let bus = gst::Bus::new();
    e.set_bus(Some(&bus));
    let res = e.set_state(gst::State::Paused);
    let _ = e.set_state(gst::State::Null);
    assert!(res.is_err(), "state change succeeded with {what}");
    let errs = errors(&drain(&bus));
    assert!(!errs.is_empty(), "no error message for {what}");
    errs
}

/// Asserts that the message of some error (the part of an [`errors`] string before " | ", the
/// line applications show) contains every word of `words`.
pub fn assert_names(errs: &[String], words: &[&str]) {
    assert!(
        errs.iter().any(|e| {
            let message = e.split(" | ").next().unwrap_or(e);
            words.iter().all(|w| message.contains(w))
        }),
        "no error message naming {words:?}: {errs:?}"
    );
}

/// Waits up to `timeout` for an element message named `name` on `bus`, keeping every message
/// popped meanwhile in `seen`.
pub fn wait_element_message(
    bus: &gst::Bus,
    name: &str,
    timeout: Duration,
    seen: &mut Vec<gst::Message>,
) -> Option<gst::Structure> {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < timeout {
        let left = timeout.saturating_sub(t0.elapsed());
        let wait = left.min(Duration::from_millis(50));
        if let Some(m) = bus.timed_pop(gst::ClockTime::from_nseconds(wait.as_nanos() as u64)) {
            let hit = match m.view() {
                gst::MessageView::Element(e) => e
                    .structure()
                    .filter(|s| s.name() == name)
                    .map(|s| s.to_owned()),
                _ => None,
            };
            seen.push(m);
            if hit.is_some() {
                return hit;
            }
        }
    }
    None
}

/// Threads of this process (/proc/self/status).
pub fn thread_count() -> usize {
    proc_status_field("Threads:")
}

/// Resident set size of this process, in KiB.
pub fn rss_kib() -> usize {
    proc_status_field("VmRSS:")
}

fn proc_status_field(key: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/self/status"))
}

/// Serialises timing-sensitive tests within one test binary.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|p| p.into_inner())
}

/// The `model` property's default of element `e`: the bundled voice's directory as found.
pub fn model_default(e: &gst::Element) -> String {
    e.find_property("model")
        .expect("a model property")
        .default_value()
        .get::<String>()
        .expect("a string default")
}
