//! airs-gguf: a zero-copy, hardened reader (and a streaming writer) for GGUF model files.
//!
//! [`Gguf::parse`] validates a whole file image and hands out borrowed views of its metadata
//! and tensor data; [`LayerMap`] groups tensors by transformer block for the loaders;
//! [`ModelConfig`] is the typed hyperparameter set of `llama` and `qwen2` files; [`writer`]
//! writes valid files (used for synthetic models and malformed-file tests).

pub mod dtype;
mod error;
pub mod hparams;
pub mod layers;
pub mod reader;
pub mod writer;

pub use dtype::{GgmlType, QK_K};
pub use error::{GgufError, GgufErrorKind};
pub use hparams::{
    Architecture, FfnActivation, ModelConfig, RopeFactors, RopeStyle, SlidingWindow,
};
pub use layers::{LayerInfo, LayerMap};
pub use reader::{Array, Gguf, MAX_ARRAY_DEPTH, TensorInfo, Value, ValueType};
