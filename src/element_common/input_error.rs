//! A rejected property value, reported as "property 'value': why".

/// Longest value, in characters, quoted in an error message (longer ones are cut with "…").
const QUOTED_VALUE_CHARS: usize = 80;

/// A rejected input, reported as "property 'value': why"; the value is escaped (control and
/// invisible characters as `\u{…}`, so no terminal escape reaches a log) and cut to
/// [`QUOTED_VALUE_CHARS`] characters.
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

impl std::fmt::Display for InputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} '{}': {}",
            self.property,
            quoted(&self.value),
            self.why
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
