//! The sizes of a Qwen3 decoder stack, shared by the layers that build one from a checkpoint
//! ([`super::Attention`], [`super::DecoderLayer`]).

/// The sizes of one Qwen3 decoder stack, taken from a checkpoint's config.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Explicit per-head width (not necessarily hidden/heads).
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub attention_bias: bool,
    /// Causal sliding window in positions (a query sees itself and `w-1` earlier keys), or none.
    pub sliding_window: Option<usize>,
}
