//! airs-gguf: a zero-copy, hardened reader (and writer) for GGUF model files.
pub mod dtype;
pub use dtype::{GgmlType, QK_K};
