//! A command-line rate (requests or tokens a second): a finite number above 0, for clap's
//! `value_parser`.

/// Parses `s` as a rate; errors name the value and say what a rate must be.
pub fn positive_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s.parse().map_err(|e| format!("{s}: {e}"))?;
    if r.is_finite() && r > 0.0 {
        Ok(r)
    } else {
        Err(format!("{s}: a rate must be a number above 0"))
    }
}
