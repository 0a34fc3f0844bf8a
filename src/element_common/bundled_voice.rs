//! Where the elements find the bundled voice (`omnitts-en`), the default `model`.
//!
//! Search order (the first directory that holds a `config.json` wins):
//! 1. `$OMNITTS_VOICE_DIR`, when set and not empty: the voice's directory itself, for packagers
//!    who install it elsewhere. It is taken as it is, with no further search, so that a wrong
//!    value fails the state change naming it instead of falling back to another copy.
//! 2. The XDG data directories: `$XDG_DATA_HOME` (default `~/.local/share`), then each of
//!    `$XDG_DATA_DIRS` (default `/usr/local/share:/usr/share`), each `+ /omnitts/voices/omnitts-en`
//!    (where `scripts/install.sh --user` and `--prefix /usr/local` or `/usr` put it).
//! 3. The installation prefix of the plugin file itself: `<prefix>/share/omnitts/voices/omnitts-en`
//!    for a plugin in `<prefix>/lib/gstreamer-1.0/` (or `<prefix>/lib/<triplet>/gstreamer-1.0/`),
//!    so that `scripts/install.sh --prefix /opt/x` works with only `GST_PLUGIN_PATH` set.
//! 4. The source tree the plugin was built from (`models/omnitts-en`), for a plugin run from its
//!    build directory and for the crate's tests.
//!
//! When none holds the voice, the default is the source tree's path, and a failed start names
//! the places searched ([`not_found_hint`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The bundled voice's directory name, in `models/` of the source tree and in
/// `<data dir>/omnitts/voices/`.
pub const VOICE_NAME: &str = "omnitts-en";

/// The environment variable that names the bundled voice's directory (search step 1).
pub const VOICE_DIR_ENV: &str = "OMNITTS_VOICE_DIR";

/// The voice's place under a data directory (`<data dir>/omnitts/voices/omnitts-en`).
const DATA_SUBDIR: &str = "omnitts/voices";

/// The plugin file this code was loaded from, when it was loaded from one (set at registration;
/// unset when the plugin is registered statically, as in the crate's tests).
static PLUGIN_FILE: OnceLock<PathBuf> = OnceLock::new();

/// Records the plugin file `omnittssrc` was registered from (search step 3).
pub(crate) fn set_plugin_file(file: PathBuf) {
    let _ = PLUGIN_FILE.set(file);
}

/// The inputs of the search, read from the environment by [`VoiceSearch::from_env`].
#[derive(Debug, Clone, Default)]
pub(crate) struct VoiceSearch {
    /// `$OMNITTS_VOICE_DIR`.
    pub voice_dir: Option<OsString>,
    /// `$XDG_DATA_HOME`.
    pub xdg_data_home: Option<OsString>,
    /// `$HOME`, for the default `~/.local/share`.
    pub home: Option<OsString>,
    /// `$XDG_DATA_DIRS`.
    pub xdg_data_dirs: Option<OsString>,
    /// The loaded plugin file, if any.
    pub plugin_file: Option<PathBuf>,
    /// `models/omnitts-en` of the source tree.
    pub build_tree: PathBuf,
}

/// An environment value that counts as set: present and not empty.
fn set(v: &Option<OsString>) -> Option<&OsString> {
    v.as_ref().filter(|v| !v.is_empty())
}

impl VoiceSearch {
    /// The search as this process's environment and plugin file define it.
    pub fn from_env() -> Self {
        VoiceSearch {
            voice_dir: std::env::var_os(VOICE_DIR_ENV),
            xdg_data_home: std::env::var_os("XDG_DATA_HOME"),
            home: std::env::var_os("HOME"),
            xdg_data_dirs: std::env::var_os("XDG_DATA_DIRS"),
            plugin_file: PLUGIN_FILE.get().cloned(),
            build_tree: Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("models")
                .join(VOICE_NAME),
        }
    }

    /// The data directories of the XDG Base Directory specification, in order: the user's
    /// (`$XDG_DATA_HOME`, else `$HOME/.local/share`), then the system's (`$XDG_DATA_DIRS`, else
    /// `/usr/local/share`, `/usr/share`). Relative entries are ignored, as the specification says.
    fn data_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        match set(&self.xdg_data_home) {
            Some(d) => dirs.push(PathBuf::from(d)),
            None => {
                if let Some(home) = set(&self.home) {
                    dirs.push(Path::new(home).join(".local/share"));
                }
            }
        }
        match set(&self.xdg_data_dirs) {
            Some(list) => dirs.extend(std::env::split_paths(list)),
            None => dirs.extend(["/usr/local/share", "/usr/share"].map(PathBuf::from)),
        }
        dirs.retain(|d| d.is_absolute());
        dirs
    }

    /// `<prefix>/share/omnitts/voices/omnitts-en` for the prefixes a plugin file's directory
    /// can be under: its parent (`<prefix>/lib/gstreamer-1.0`) and grandparent
    /// (`<prefix>/lib/<triplet>/gstreamer-1.0`).
    fn plugin_prefix_dirs(&self) -> Vec<PathBuf> {
        let Some(plugin_dir) = self.plugin_file.as_deref().and_then(Path::parent) else {
            return Vec::new();
        };
        plugin_dir
            .ancestors()
            .skip(2)
            .take(2)
            .map(|prefix| prefix.join("share").join(DATA_SUBDIR).join(VOICE_NAME))
            .collect()
    }

    /// Every directory searched, in order (steps 2–4; step 1 replaces the search).
    pub fn candidates(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .data_dirs()
            .into_iter()
            .map(|d| d.join(DATA_SUBDIR).join(VOICE_NAME))
            .collect();
        out.extend(self.plugin_prefix_dirs());
        out.push(self.build_tree.clone());
        let mut seen = std::collections::HashSet::new();
        out.retain(|d| seen.insert(d.clone()));
        out
    }

    /// The bundled voice's directory: `$OMNITTS_VOICE_DIR` when set, else the first candidate
    /// that holds a `config.json`, else the source tree's (which then does not exist).
    pub fn find(&self) -> PathBuf {
        if let Some(d) = set(&self.voice_dir) {
            return PathBuf::from(d);
        }
        self.candidates()
            .into_iter()
            .find(|d| d.join("config.json").is_file())
            .unwrap_or_else(|| self.build_tree.clone())
    }

    /// [`not_found_hint`] for this search.
    fn not_found_hint(&self, model: &str) -> Option<String> {
        if Path::new(model) != self.find() || Path::new(model).join("config.json").is_file() {
            return None;
        }
        if set(&self.voice_dir).is_some() {
            return Some(format!(
                "the bundled voice is taken from {VOICE_DIR_ENV}, which names no checkpoint"
            ));
        }
        let places: Vec<String> = self
            .candidates()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        Some(format!(
            "the bundled voice {VOICE_NAME} was not found ({VOICE_DIR_ENV} is unset; searched \
             {}); install it with scripts/install.sh or set model",
            places.join(", ")
        ))
    }
}

/// The default `model`: the bundled voice's directory as found now ([`VoiceSearch::find`]).
pub fn default_model() -> String {
    VoiceSearch::from_env()
        .find()
        .to_string_lossy()
        .into_owned()
}

/// For a `model` that is not a checkpoint: when it is the default one that the search could not
/// find, the places searched (to add to the error); otherwise `None`.
pub fn not_found_hint(model: &str) -> Option<String> {
    VoiceSearch::from_env().not_found_hint(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voice_at(root: &Path) -> PathBuf {
        let d = root.join(DATA_SUBDIR).join(VOICE_NAME);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), "{}").unwrap();
        d
    }

    /// A fresh, empty directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("omnitts-voice-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn search(tmp: &Path) -> VoiceSearch {
        VoiceSearch {
            voice_dir: None,
            xdg_data_home: None,
            home: Some(tmp.join("home").into()),
            xdg_data_dirs: Some(
                std::env::join_paths([tmp.join("sys1"), tmp.join("sys2")]).unwrap(),
            ),
            plugin_file: Some(tmp.join("opt/lib/gstreamer-1.0/libgstomnitts.so")),
            build_tree: tmp.join("src/models").join(VOICE_NAME),
        }
    }

    #[test]
    fn search_order_is_env_then_xdg_then_plugin_prefix_then_build_tree() {
        let tmp = scratch("order");
        let t = tmp.as_path();
        let s = search(t);
        assert_eq!(
            s.candidates(),
            [
                t.join("home/.local/share/omnitts/voices/omnitts-en"),
                t.join("sys1/omnitts/voices/omnitts-en"),
                t.join("sys2/omnitts/voices/omnitts-en"),
                t.join("opt/share/omnitts/voices/omnitts-en"),
                t.join("share/omnitts/voices/omnitts-en"),
                t.join("src/models/omnitts-en"),
            ]
        );
        // Nothing installed: the build tree's path (absent here).
        assert_eq!(s.find(), s.build_tree);
        let build = voice_at(&t.join("unused"));
        let s = VoiceSearch {
            build_tree: build.clone(),
            ..s
        };
        assert_eq!(s.find(), build);
        // Each installed copy hides the ones after it.
        let prefix = voice_at(&t.join("opt/share"));
        assert_eq!(s.find(), prefix);
        let sys2 = voice_at(&t.join("sys2"));
        assert_eq!(s.find(), sys2);
        let user = voice_at(&t.join("home/.local/share"));
        assert_eq!(s.find(), user);
        // XDG_DATA_HOME replaces ~/.local/share.
        let data_home = voice_at(&t.join("data-home"));
        let s = VoiceSearch {
            xdg_data_home: Some(t.join("data-home").into()),
            ..s
        };
        assert_eq!(s.find(), data_home);
        // The environment variable wins, and is taken as it is.
        let s = VoiceSearch {
            voice_dir: Some(t.join("packaged").into()),
            ..s
        };
        assert_eq!(s.find(), t.join("packaged"));
        std::fs::remove_dir_all(t).unwrap();
    }

    #[test]
    fn a_missing_default_names_the_places_searched() {
        let tmp = scratch("missing");
        let s = search(&tmp);
        let default = s.find();
        let hint = s.not_found_hint(&default.to_string_lossy()).unwrap();
        assert!(hint.contains("OMNITTS_VOICE_DIR is unset"), "{hint}");
        for place in s.candidates() {
            assert!(
                hint.contains(&*place.to_string_lossy()),
                "{place:?} not in {hint}"
            );
        }
        assert_eq!(s.not_found_hint("/some/other/model"), None);
        let s = VoiceSearch {
            voice_dir: Some(tmp.join("nowhere").into()),
            ..s
        };
        let hint = s
            .not_found_hint(&tmp.join("nowhere").to_string_lossy())
            .unwrap();
        assert!(hint.contains("taken from OMNITTS_VOICE_DIR"), "{hint}");
        // Found: nothing to add.
        let found = voice_at(&tmp.join("home/.local/share"));
        let s = VoiceSearch {
            voice_dir: None,
            ..s
        };
        assert_eq!(s.not_found_hint(&found.to_string_lossy()), None);
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn xdg_defaults_and_relative_entries() {
        let s = VoiceSearch {
            home: Some("/home/u".into()),
            xdg_data_home: Some("".into()),
            xdg_data_dirs: None,
            build_tree: "/src/models/omnitts-en".into(),
            ..Default::default()
        };
        assert_eq!(
            s.candidates(),
            [
                "/home/u/.local/share/omnitts/voices/omnitts-en",
                "/usr/local/share/omnitts/voices/omnitts-en",
                "/usr/share/omnitts/voices/omnitts-en",
                "/src/models/omnitts-en",
            ]
            .map(PathBuf::from)
        );
        let s = VoiceSearch {
            xdg_data_home: Some("relative/data".into()),
            xdg_data_dirs: Some("rel:/abs".into()),
            ..s
        };
        assert_eq!(
            s.candidates(),
            ["/abs/omnitts/voices/omnitts-en", "/src/models/omnitts-en"].map(PathBuf::from)
        );
    }

    #[test]
    fn multiarch_plugin_dirs_find_the_prefix() {
        let s = VoiceSearch {
            plugin_file: Some("/opt/x/lib/x86_64-linux-gnu/gstreamer-1.0/libgstomnitts.so".into()),
            xdg_data_dirs: Some("/nowhere".into()),
            build_tree: "/src/models/omnitts-en".into(),
            ..Default::default()
        };
        assert!(
            s.candidates()
                .contains(&PathBuf::from("/opt/x/share/omnitts/voices/omnitts-en")),
            "{:?}",
            s.candidates()
        );
    }
}
