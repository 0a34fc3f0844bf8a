//! How a model's linear weights are stored, summed per form (dense, q8_0, …).

use super::Quantization;

/// Linear layers of one stored form (a stage-0 model's `weight_forms`: how many layers are
/// dense, how many quantized, and their bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightForm {
    pub form: Quantization,
    /// Layers stored in this form.
    pub layers: usize,
    /// Their weights' bytes.
    pub bytes: usize,
}

impl WeightForm {
    /// `forms` as one line: `16 layers none (138.4 MB), 233 layers q8_0 (558.2 MB)`.
    pub fn summary(forms: &[WeightForm]) -> String {
        let parts: Vec<String> = forms.iter().map(ToString::to_string).collect();
        parts.join(", ")
    }
}

impl std::fmt::Display for WeightForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} layers {} ({:.1} MB)",
            self.layers,
            self.form,
            self.bytes as f64 / 1e6
        )
    }
}
