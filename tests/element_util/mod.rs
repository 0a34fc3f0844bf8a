//! Helpers shared by the element test files: GStreamer/plugin init, temp folders, and a
//! loopback HTTP server that speaks enough of the Hugging Face hub protocol for `hf-hub`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

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

/// Every file under `root`, keyed by its '/'-separated relative path.
pub fn read_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            // Follow symlinks (the hub cache's snapshot files are links to blobs).
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let rel = p
                    .strip_prefix(root)
                    .expect("under root")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.insert(rel, std::fs::read(&p).expect("read file"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn fnv1a(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// A loopback HTTP/1.1 server serving the files of one folder as hub repo `repo_id` at
/// revision `main`:
/// - `GET /api/models/<repo>/revision/main` → `{"sha": ..., "siblings": [{"rfilename": ...}]}`
/// - `GET /<repo>/resolve/main/<file>` with `Range: bytes=a-[b]` → 206 with `ETag`,
///   `X-Repo-Commit`, `Content-Range` (what `hf-hub` 0.4 reads).
///
/// One connection per request (`Connection: close`). Stops when dropped.
pub struct HubServer {
    pub endpoint: String,
    pub requests: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    port: u16,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub const FAKE_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

impl HubServer {
    pub fn start(repo_id: &str, root: &Path) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().expect("local addr").port();
        let files = read_tree(root);
        let repo = repo_id.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let (stop2, requests2) = (stop.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                requests2.fetch_add(1, Ordering::SeqCst);
                let _ = serve_one(conn, &repo, &files);
            }
        });
        HubServer {
            endpoint: format!("http://127.0.0.1:{port}"),
            requests,
            stop,
            port,
            thread: Some(thread),
        }
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(
    conn: TcpStream,
    repo: &str,
    files: &BTreeMap<String, Vec<u8>>,
) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut range: Option<String> = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.trim().eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_string());
        }
    }
    let mut out = conn;
    let respond = |out: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]| {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        out.write_all(head.as_bytes())?;
        if method != "HEAD" {
            out.write_all(body)?;
        }
        out.flush()
    };
    let api = format!("/api/models/{repo}/revision/main");
    let resolve = format!("/{repo}/resolve/main/");
    if path == api {
        let siblings: Vec<String> = files
            .keys()
            .map(|k| format!("{{\"rfilename\":\"{k}\"}}"))
            .collect();
        let body = format!(
            "{{\"sha\":\"{FAKE_COMMIT}\",\"siblings\":[{}]}}",
            siblings.join(",")
        );
        return respond(
            &mut out,
            "200 OK",
            &[("Content-Type".into(), "application/json".into())],
            body.as_bytes(),
        );
    }
    if let Some(name) = path.strip_prefix(&resolve)
        && let Some(data) = files.get(name)
    {
        let size = data.len();
        let (a, b) = match range.as_deref().and_then(|r| r.strip_prefix("bytes=")) {
            Some(r) => {
                let (a, b) = r.split_once('-').unwrap_or((r, ""));
                let a: usize = a.parse().unwrap_or(0);
                let b: usize = if b.is_empty() {
                    size.saturating_sub(1)
                } else {
                    b.parse().unwrap_or(size.saturating_sub(1))
                };
                (a.min(size), b.min(size.saturating_sub(1)))
            }
            None => (0, size.saturating_sub(1)),
        };
        let body = if size == 0 || a > b {
            &data[0..0]
        } else {
            &data[a..=b]
        };
        let etag = format!("\"{:016x}{:016x}\"", fnv1a(name.as_bytes()), fnv1a(data));
        return respond(
            &mut out,
            "206 Partial Content",
            &[
                ("ETag".into(), etag),
                ("X-Repo-Commit".into(), FAKE_COMMIT.into()),
                ("Content-Range".into(), format!("bytes {a}-{b}/{size}")),
            ],
            body,
        );
    }
    respond(&mut out, "404 Not Found", &[], b"not found")
}

/// An endpoint nothing listens on (a port bound, then released).
pub fn dead_endpoint() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

/// The small random-weight CustomVoice checkpoint shipped in the repo.
pub fn tiny_model() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny-customvoice")
        .display()
        .to_string()
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
