//! Layers shared by the models: attention with KV cache, RoPE, RMSNorm, causal (transposed)
//! convolutions with streaming state, SnakeBeta.
//!
//! Every layer takes its device and dtype from the weights it is built from; computations that the
//! reference runs in f32 (RMSNorm statistics, RoPE tables, attention softmax) upcast internally.

pub mod attention;
pub mod config;
pub mod conv;
#[cfg(feature = "cuda")]
pub mod cuda_graph;
#[cfg(feature = "cuda")]
pub mod cuda_kernels;
pub mod embedding;
#[cfg(feature = "cuda")]
mod fused_decode;
pub mod linear;
pub mod mlp;
pub mod readback;
pub mod rms_norm;
pub mod rope;
#[cfg(feature = "cuda")]
pub mod rows_decode;
pub mod snake_beta;
pub mod switches;
#[cfg(test)]
mod test_util;
pub mod transformer;
pub mod weight_form;
pub mod weights;

pub use attention::{Attention, KvCache};
pub use config::TransformerConfig;
pub use embedding::{Embedding, MappedRows};
pub use linear::{Linear, Quantization, QuantizationSpec};
pub use mlp::Mlp;
pub use rms_norm::RmsNorm;
pub use rope::RotaryEmbedding;
pub use transformer::{DecoderLayer, LayerCaches};
pub use weight_form::WeightForm;
pub use weights::{WeightError, Weights};
