//! The check of one YAML value of the stage configuration: its conversion, or the message
//! "expected {what}, got {value}" (`expected a positive integer, got -3`). A field names its
//! check with `#[serde(deserialize_with = "checked::<Positive, _>")]`, or `some::<…, _>` for an
//! optional value.

use std::fmt::Write as _;

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use serde_yaml_ng::Value;

use super::{DTypeSpec, DecoderStreamingMode, DeviceSpec, EngineError};
use crate::config_path::join;
use crate::models::tts::MAX_NEW_TOKENS_RANGE;
use crate::nn::QuantizationSpec;

/// Compact rendering of a YAML value for messages.
pub(super) fn show(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => {
            let s = serde_yaml_ng::to_string(v).unwrap_or_else(|_| "<value>".to_string());
            let one_line = s.trim().replace('\n', " ");
            let kind = match v {
                Value::Sequence(_) => "a list",
                Value::Mapping(_) => "a mapping",
                _ => "a tagged value",
            };
            let mut out = String::new();
            let _ = write!(out, "{kind} ({one_line})");
            out
        }
    }
}

/// "expected {what}, got {value}".
pub(super) fn expected(what: &str, got: &Value) -> String {
    format!("expected {what}, got {}", show(got))
}

/// The check of one YAML value: its conversion, or the error message.
pub(super) trait Check {
    type Out;
    fn check(v: &Value) -> Result<Self::Out, String>;
}

/// `deserialize_with` for a value checked by `C`.
pub(super) fn checked<'de, C: Check, D: Deserializer<'de>>(d: D) -> Result<C::Out, D::Error> {
    C::check(&Value::deserialize(d)?).map_err(D::Error::custom)
}

/// `deserialize_with` for an optional value checked by `C` (with `#[serde(default)]`).
pub(super) fn some<'de, C: Check, D: Deserializer<'de>>(d: D) -> Result<Option<C::Out>, D::Error> {
    checked::<C, D>(d).map(Some)
}

pub(super) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn float(v: &Value, what: &str, ok: impl Fn(f64) -> bool) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().filter(|x| x.is_finite() && ok(*x)),
        _ => None,
    }
    .ok_or_else(|| expected(what, v))
}

pub(super) fn string(v: &Value) -> Result<&str, String> {
    v.as_str().ok_or_else(|| expected("a string", v))
}

/// `want` exactly.
pub(super) fn exact(v: &Value, want: &str) -> Result<(), String> {
    if string(v)? == want {
        Ok(())
    } else {
        Err(expected(&format!("{want:?}"), v))
    }
}

pub(super) struct AnyValue;
impl Check for AnyValue {
    type Out = Value;
    fn check(v: &Value) -> Result<Value, String> {
        Ok(v.clone())
    }
}

pub(super) struct Bool;
impl Check for Bool {
    type Out = bool;
    fn check(v: &Value) -> Result<bool, String> {
        v.as_bool().ok_or_else(|| expected("true or false", v))
    }
}

/// An integer ≥ 1.
pub(super) struct Positive;
impl Check for Positive {
    type Out = usize;
    fn check(v: &Value) -> Result<usize, String> {
        int(v)
            .filter(|n| *n >= 1)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| expected("a positive integer", v))
    }
}

/// A frame cap (`max_tokens`), as the elements' `max-new-tokens` takes it
/// ([`MAX_NEW_TOKENS_RANGE`]).
pub(super) struct MaxTokens;
impl Check for MaxTokens {
    type Out = usize;
    fn check(v: &Value) -> Result<usize, String> {
        let range = MAX_NEW_TOKENS_RANGE;
        int(v)
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| range.contains(n))
            .map(|n| n as usize)
            .ok_or_else(|| {
                expected(
                    &format!(
                        "an integer from {} to {} (at most N - 1 codec frames, as max-new-tokens)",
                        range.start(),
                        range.end()
                    ),
                    v,
                )
            })
    }
}

/// An integer ≥ 0.
pub(super) struct NonNegative;
impl Check for NonNegative {
    type Out = usize;
    fn check(v: &Value) -> Result<usize, String> {
        int(v)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| expected("a non-negative integer", v))
    }
}

pub(super) struct Seed;
impl Check for Seed {
    type Out = u64;
    fn check(v: &Value) -> Result<u64, String> {
        NonNegative::check(v).map(|n| n as u64)
    }
}

/// A finite number > 0.
pub(super) struct PositiveNumber;
impl Check for PositiveNumber {
    type Out = f64;
    fn check(v: &Value) -> Result<f64, String> {
        float(v, "a number > 0", |x| x > 0.0)
    }
}

pub(super) struct Temperature;
impl Check for Temperature {
    type Out = f64;
    fn check(v: &Value) -> Result<f64, String> {
        float(v, "a number ≥ 0 (0 = greedy)", |x| x >= 0.0)
    }
}

pub(super) struct TopP;
impl Check for TopP {
    type Out = f64;
    fn check(v: &Value) -> Result<f64, String> {
        float(v, "a number in (0, 1]", |x| x > 0.0 && x <= 1.0)
    }
}

/// A non-negative integer, or -1 (vLLM's "disabled") which maps to 0.
pub(super) struct TopK;
impl Check for TopK {
    type Out = usize;
    fn check(v: &Value) -> Result<usize, String> {
        match int(v) {
            Some(-1) => Ok(0),
            n => n
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| expected("a non-negative integer or -1 (disabled)", v)),
        }
    }
}

/// `runtime.devices`: a device this build can run.
pub(super) struct Devices;
impl Check for Devices {
    type Out = DeviceSpec;
    fn check(v: &Value) -> Result<DeviceSpec, String> {
        let what = "\"cpu\", \"cuda:N\", a GPU index or \"auto\"";
        let s = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) if n.is_u64() => n.to_string(),
            _ => return Err(expected(what, v)),
        };
        let spec: DeviceSpec = s.parse().map_err(|_| expected(what, v))?;
        spec.check_supported().map_err(|e| match e {
            EngineError::Device { msg, .. } => format!("{}: {msg}", show(v)),
            other => other.to_string(),
        })?;
        Ok(spec)
    }
}

/// Stage 0's `engine_args.dtype`.
pub(super) struct ArDType;
impl Check for ArDType {
    type Out = DTypeSpec;
    fn check(v: &Value) -> Result<DTypeSpec, String> {
        DTypeSpec::parse(string(v)?)
            .ok_or_else(|| expected("auto, float32, bfloat16 or float16", v))
    }
}

/// Stage 0's `engine_args.quantization`.
pub(super) struct ArQuantization;
impl Check for ArQuantization {
    type Out = QuantizationSpec;
    fn check(v: &Value) -> Result<QuantizationSpec, String> {
        if v.is_null() {
            // vLLM's spelling of "not quantized".
            return Ok(QuantizationSpec::DENSE);
        }
        QuantizationSpec::parse(string(v)?).ok_or_else(|| expected("auto, none, q8_0 or q4_k", v))
    }
}

pub(super) struct StreamingMode;
impl Check for StreamingMode {
    type Out = DecoderStreamingMode;
    fn check(v: &Value) -> Result<DecoderStreamingMode, String> {
        DecoderStreamingMode::parse(string(v)?)
            .ok_or_else(|| expected("\"exact\" or \"windowed\"", v))
    }
}

/// YAML allows any value as a mapping key; a configuration key is a string (a number would
/// otherwise name a field by its position). Returns the path of the offending mapping.
pub(super) fn check_keys(v: &Value, path: &str) -> Result<(), (String, String)> {
    match v {
        Value::Mapping(m) => m.iter().try_for_each(|(k, val)| match k {
            Value::String(s) => check_keys(val, &join(path, s)),
            other => Err((
                path.to_string(),
                format!("keys must be strings, got {}", show(other)),
            )),
        }),
        Value::Sequence(s) => s
            .iter()
            .enumerate()
            .try_for_each(|(i, val)| check_keys(val, &format!("{path}[{i}]"))),
        Value::Tagged(t) => check_keys(&t.value, path),
        _ => Ok(()),
    }
}
