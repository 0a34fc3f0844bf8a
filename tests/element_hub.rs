//! `model` as a Hugging Face repo id: download into the hub cache from a loopback hub, reuse
//! of the cache without network, and the errors when it can be neither found nor fetched.

mod element_util;

use element_util::{HubServer, TempDir, dead_endpoint, read_tree};
use gstomnitts::omnittssrc::hub::{self, HubError, HubOptions, ModelSource};
use std::sync::atomic::Ordering;

const REPO: &str = "omnitts-test/tiny-hub";

/// A small "repo": what a checkpoint looks like, plus files the resolver must skip.
fn make_repo(root: &std::path::Path) {
    std::fs::create_dir_all(root.join("speech_tokenizer")).unwrap();
    std::fs::write(
        root.join("config.json"),
        br#"{"tts_model_type": "custom_voice"}"#,
    )
    .unwrap();
    std::fs::write(
        root.join("generation_config.json"),
        br#"{"do_sample": true}"#,
    )
    .unwrap();
    let weights: Vec<u8> = (0..70_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("model.safetensors"), &weights).unwrap();
    std::fs::write(root.join("speech_tokenizer/config.json"), b"{}").unwrap();
    std::fs::write(
        root.join("speech_tokenizer/model.safetensors"),
        &weights[..1234],
    )
    .unwrap();
    std::fs::write(root.join("README.md"), b"# not needed").unwrap();
    std::fs::write(root.join(".gitattributes"), b"*.safetensors filter=lfs").unwrap();
}

fn opts(endpoint: &str, cache: &std::path::Path, offline: bool) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_string(),
        cache_dir: cache.to_path_buf(),
        offline,
        token: None,
    }
}

#[test]
fn repo_id_is_downloaded_then_served_from_cache() {
    let repo_dir = TempDir::new("hub-repo");
    make_repo(repo_dir.path());
    let cache = TempDir::new("hub-cache");
    let server = HubServer::start(REPO, repo_dir.path());

    let got = hub::resolve_model(REPO, &opts(&server.endpoint, cache.path(), false))
        .expect("download from the loopback hub");
    assert_eq!(got.source, ModelSource::Downloaded { files: 5 });
    assert!(
        got.dir.starts_with(cache.path()),
        "{} not in the cache",
        got.dir.display()
    );
    assert!(
        got.dir.ends_with(format!(
            "models--omnitts-test--tiny-hub/snapshots/{}",
            element_util::FAKE_COMMIT
        )),
        "unexpected snapshot dir {}",
        got.dir.display()
    );
    let mut want = read_tree(repo_dir.path());
    want.remove("README.md");
    want.remove(".gitattributes");
    assert_eq!(
        read_tree(&got.dir),
        want,
        "downloaded files differ from the served ones"
    );
    let requests = server.requests.load(Ordering::SeqCst);
    assert!(
        requests >= 1 + 5,
        "expected info + 5 files, saw {requests} requests"
    );

    // Server gone: the cache alone must answer, with no request.
    drop(server);
    let again = hub::resolve_model(REPO, &opts(&dead_endpoint(), cache.path(), false))
        .expect("cached snapshot");
    assert_eq!(again.source, ModelSource::Cache);
    assert_eq!(again.dir, got.dir);
    let offline = hub::resolve_model(REPO, &opts(&dead_endpoint(), cache.path(), true))
        .expect("cached snapshot, offline");
    assert_eq!(offline.dir, got.dir);
}

#[test]
fn offline_and_not_cached_names_repo_and_cache() {
    let cache = TempDir::new("hub-empty");
    let err = hub::resolve_model(REPO, &opts(&dead_endpoint(), cache.path(), true)).unwrap_err();
    assert!(matches!(err, HubError::NotCached { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(REPO), "{msg}");
    let folder = cache.path().join("models--omnitts-test--tiny-hub");
    assert!(msg.contains(&folder.display().to_string()), "{msg}");
    assert!(msg.contains("HF_HUB_OFFLINE"), "{msg}");
}

#[test]
fn unreachable_hub_and_not_cached_names_repo_cache_and_endpoint() {
    let cache = TempDir::new("hub-unreach");
    let endpoint = dead_endpoint();
    let err = hub::resolve_model(REPO, &opts(&endpoint, cache.path(), false)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, HubError::NotCached { .. }), "{msg}");
    assert!(msg.contains(REPO) && msg.contains(&endpoint), "{msg}");
    assert!(msg.contains(&cache.path().display().to_string()), "{msg}");
}

#[test]
fn repo_without_the_file_is_an_error_not_a_panic() {
    let repo_dir = TempDir::new("hub-norepo");
    std::fs::write(repo_dir.path().join("config.json"), b"{}").unwrap();
    let cache = TempDir::new("hub-cache2");
    let server = HubServer::start("someone/else", repo_dir.path());
    let err = hub::resolve_model(REPO, &opts(&server.endpoint, cache.path(), false)).unwrap_err();
    assert!(err.to_string().contains(REPO), "{err}");
}

#[test]
fn local_directories_and_bad_values() {
    let dir = TempDir::new("hub-local");
    std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
    let o = opts(&dead_endpoint(), dir.path(), true);
    let got = hub::resolve_model(&dir.path().display().to_string(), &o).unwrap();
    assert_eq!(
        (got.source, got.dir.as_path()),
        (ModelSource::LocalDir, dir.path())
    );

    let empty = TempDir::new("hub-noconfig");
    let err = hub::resolve_model(&empty.path().display().to_string(), &o).unwrap_err();
    assert!(matches!(err, HubError::NotACheckpoint { .. }), "{err:?}");

    let err = hub::resolve_model("/no/such/checkpoint", &o).unwrap_err();
    assert!(matches!(err, HubError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("/no/such/checkpoint"));
    assert!(matches!(
        hub::resolve_model("  ", &o).unwrap_err(),
        HubError::Empty
    ));
}
