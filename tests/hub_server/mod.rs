//! A loopback HTTP server that speaks enough of the Hugging Face hub protocol for `hf-hub`, and
//! the helpers of its tests (`tests/element_hub.rs`, its only user).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

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
