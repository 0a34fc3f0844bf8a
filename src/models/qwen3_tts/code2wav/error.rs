//! The model error type (unified at merge).
pub use super::super::ModelError;
