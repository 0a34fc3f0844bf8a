//! A rejected property value, reported as "property 'value': why".

/// Longest value, in characters, quoted in an error message (longer ones are cut with "…").
const QUOTED_VALUE_CHARS: usize = 80;

/// Longest reason, in characters, in an error message: a reason may quote the value again or
/// a file's contents (a parse error), which must not make a message of megabytes.
const WHY_CHARS: usize = 600;

/// A rejected input, reported as "property 'value': why"; the value is escaped (control and
/// invisible characters as `\u{…}`, so no terminal escape reaches a log) and cut to
/// [`QUOTED_VALUE_CHARS`] characters; the reason has its other control characters escaped and
/// is cut to [`WHY_CHARS`].
#[derive(Debug)]
pub(crate) struct InputError {
    pub property: &'static str,
    pub value: String,
    pub why: String,
}

/// `value` as messages quote it: escaped, cut to [`QUOTED_VALUE_CHARS`] characters with "…".
pub(crate) fn quoted(value: &str) -> String {
    let mut shown: String = value.chars().take(QUOTED_VALUE_CHARS).collect();
    if value.chars().nth(QUOTED_VALUE_CHARS).is_some() {
        shown.push('…');
    }
    shown.escape_debug().to_string()
}

/// `why` as messages show it: control characters but line breaks and tabs escaped, cut to
/// [`WHY_CHARS`] characters.
fn shown_reason(why: &str) -> String {
    let mut shown = String::new();
    for c in why.chars().take(WHY_CHARS) {
        if c.is_control() && c != '\n' && c != '\t' {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    if why.chars().nth(WHY_CHARS).is_some() {
        shown.push('…');
    }
    shown
}

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} '{}': {}",
            self.property,
            quoted(&self.value),
            shown_reason(&self.why)
        )
    }
}

impl InputError {
    /// The error as a GStreamer `RESOURCE/SETTINGS` error (a failed state change, or posted).
    pub fn to_error_msg(&self) -> gst::ErrorMessage {
        gst::error_msg!(gst::ResourceError::Settings, ("{}", self))
    }
}

/// An [`InputError`] for `property` set to `value`.
pub(crate) fn input_error(
    property: &'static str,
    value: &str,
    why: impl Into<String>,
) -> InputError {
    InputError {
        property,
        value: value.to_string(),
        why: why.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_value_and_a_long_reason_are_cut() {
        let value = "x".repeat(100_000);
        let why = format!("device \"{value}\": expected \"cpu\"\nline two");
        let shown = input_error("ar-device", &value, why).to_string();
        assert!(
            shown.chars().count() < 800,
            "{} characters",
            shown.chars().count()
        );
        assert!(shown.starts_with(&format!("ar-device '{}…': device", "x".repeat(80))));
        assert!(shown.ends_with('…'));
        // A short reason is kept whole, a terminal escape in it escaped.
        let shown = input_error("stage-config", "a.yaml", "bad \u{1b}[31mkey\nline 2").to_string();
        assert_eq!(shown, "stage-config 'a.yaml': bad \\u{1b}[31mkey\nline 2");
    }
}
