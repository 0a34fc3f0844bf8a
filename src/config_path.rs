//! Key paths for configuration documents read with serde derive.
//!
//! Every configuration omnitts reads (the stage YAML, a checkpoint's `config.json`,
//! `generation_config.json` and `speech_tokenizer/config.json`) is a set of `#[derive(Deserialize)]`
//! structs. [`deserialize`] runs one through `serde_path_to_error` and `serde_ignored`, so that an
//! error names the key path of the value it is about (`stage_args[1].engine_args.codec_chunk_frames`,
//! `talker_config.head_dim`) and every key that no field takes is reported with its path.

use std::fmt::Display;

use serde::{Deserialize, Deserializer};

/// A value that could not be deserialized, with its place in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PathError {
    /// Dotted key path with `[i]` list indices (`stage_args[0].runtime.devices`); for a missing
    /// field, the path of that field. Empty for the document itself.
    pub path: String,
    /// What was wrong: the field's own check, serde's description, or `missing field`.
    pub msg: String,
}

/// Deserializes `T` from `de`, the part of a document found at `prefix` (`""` for the whole
/// document, else a key path such as `stage_args[1]`). Each key that no field of `T` takes is
/// passed to `unknown` as its full key path.
///
/// A field that is missing is reported at its own path with the message `missing field`.
pub(crate) fn deserialize<'de, T, D>(
    de: D,
    prefix: &str,
    mut unknown: impl FnMut(String),
) -> Result<T, PathError>
where
    T: Deserialize<'de>,
    D: Deserializer<'de>,
    D::Error: Display,
{
    let mut on_ignored = |p: serde_ignored::Path<'_>| unknown(join(prefix, &ignored_path(&p)));
    serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut on_ignored)).map_err(
        |e| {
            let at = match e.path().iter().next() {
                None => String::new(),
                Some(_) => e.path().to_string(),
            };
            let msg = e.inner().to_string();
            // serde's own wording for a required field that is absent (`de::Error::missing_field`).
            match msg
                .strip_prefix("missing field `")
                .and_then(|m| m.strip_suffix('`'))
            {
                Some(field) => PathError {
                    path: join(prefix, &join(&at, field)),
                    msg: "missing field".to_string(),
                },
                None => PathError {
                    path: join(prefix, &at),
                    msg,
                },
            }
        },
    )
}

/// `parent.child`, `parent[i]`, or whichever of the two is not empty.
pub(crate) fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else if child.is_empty() {
        parent.to_string()
    } else if child.starts_with('[') {
        format!("{parent}{child}")
    } else {
        format!("{parent}.{child}")
    }
}

/// The path of an ignored key in the notation of [`PathError::path`] (`serde_ignored` writes
/// list indices as keys: `stage_args.1.x`).
fn ignored_path(p: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match p {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", ignored_path(parent)),
        Path::Map { parent, key } => join(&ignored_path(parent), key),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    struct Inner {
        size: usize,
        #[serde(default)]
        bias: bool,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        layers: Vec<Inner>,
    }

    fn run(v: serde_json::Value, prefix: &str) -> (Result<Outer, PathError>, Vec<String>) {
        let mut unknown = Vec::new();
        let r = deserialize(v, prefix, |k| unknown.push(k));
        (r, unknown)
    }

    #[test]
    fn errors_name_the_key_path() {
        let (r, _) = run(json!({"layers": [{"size": 1}, {"size": -3}]}), "");
        let e = r.unwrap_err();
        assert_eq!(e.path, "layers[1].size");
        assert!(e.msg.contains("-3"), "{}", e.msg);
        let (r, _) = run(json!({"layers": [{"size": 1}, {"size": "x"}]}), "model");
        assert_eq!(r.unwrap_err().path, "model.layers[1].size");
        let (r, _) = run(json!(5), "model");
        assert_eq!(r.unwrap_err().path, "model");
    }

    #[test]
    fn missing_field_is_reported_at_its_own_path() {
        let (r, _) = run(json!({"layers": [{"bias": true}]}), "");
        assert_eq!(
            r.unwrap_err(),
            PathError {
                path: "layers[0].size".into(),
                msg: "missing field".into()
            }
        );
        let (r, _) = run(json!({}), "talker");
        assert_eq!(r.unwrap_err().path, "talker.layers");
    }

    #[test]
    fn unknown_keys_are_reported_with_their_path() {
        let (r, unknown) = run(
            json!({"layers": [{"size": 1}, {"size": 2, "knob": 1}], "extra": {"a": 1}}),
            "stage",
        );
        assert_eq!(
            r.unwrap(),
            Outer {
                layers: vec![
                    Inner {
                        size: 1,
                        bias: false
                    },
                    Inner {
                        size: 2,
                        bias: false
                    }
                ]
            }
        );
        // serde_json's objects iterate in key order.
        assert_eq!(unknown, vec!["stage.extra", "stage.layers[1].knob"]);
    }

    #[test]
    fn join_paths() {
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", ""), "a");
        assert_eq!(join("a", "b"), "a.b");
        assert_eq!(join("a", "[2].b"), "a[2].b");
    }
}
