//! Layers shared by the models: attention with KV cache, RoPE, RMSNorm, causal (transposed)
//! convolutions with streaming state, SnakeBeta.

pub mod conv;
pub mod snake_beta;
