//! The engine's error type: an opaque [`EngineError`] with an [`EngineErrorKind`].

use std::fmt;

/// What went wrong in the engine.
#[derive(Debug)]
#[non_exhaustive]
pub enum EngineErrorKind {
    /// The model file could not be read or parsed.
    Model(airs_gguf::GgufError),
    /// The tokenizer could not be built from the file's metadata.
    Tokenizer(airs_tokenizer::TokenizerError),
    /// A weight tensor has a type airs has no kernel for.
    UnsupportedTensorType {
        tensor: String,
        ty: airs_gguf::GgmlType,
    },
    /// A tensor the architecture needs is missing or misshapen.
    BadTensor { tensor: String, reason: String },
    /// A token id outside the vocabulary.
    TokenOutOfRange { token: u32, vocab_len: usize },
    /// The sequence would exceed the KV cache's capacity.
    ContextFull { needed: usize, capacity: usize },
    /// The KV block pool has no block left for the sequence.
    KvExhausted(airs_memory::PoolExhausted),
    /// The KV pool could not be made (the model pool's account refused it, or the mapping
    /// failed).
    KvPool(airs_memory::MemoryError),
    /// The model's weights could not be read (e.g. a lazy load failed).
    Load(airs_memory::MemoryError),
    /// The model pool cannot hold the model (too large for it, or held by models in use).
    ModelPool(airs_memory::RegistryError),
    /// An argument was invalid.
    InvalidArgument(String),
    /// An I/O error opening the model.
    Io(std::io::Error),
}

/// An engine error.
#[derive(Debug)]
pub struct EngineError {
    kind: EngineErrorKind,
}

impl EngineError {
    pub fn new(kind: EngineErrorKind) -> EngineError {
        EngineError { kind }
    }

    pub fn kind(&self) -> &EngineErrorKind {
        &self.kind
    }

    pub(crate) fn bad_tensor(tensor: &str, reason: impl Into<String>) -> EngineError {
        EngineError::new(EngineErrorKind::BadTensor {
            tensor: tensor.into(),
            reason: reason.into(),
        })
    }

    pub(crate) fn invalid(reason: impl Into<String>) -> EngineError {
        EngineError::new(EngineErrorKind::InvalidArgument(reason.into()))
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use EngineErrorKind::*;
        match &self.kind {
            Model(e) => write!(f, "model file: {e}"),
            Tokenizer(e) => write!(f, "tokenizer: {e}"),
            UnsupportedTensorType { tensor, ty } => {
                write!(
                    f,
                    "tensor {tensor:?} has type {ty}, which airs cannot compute with"
                )
            }
            BadTensor { tensor, reason } => write!(f, "tensor {tensor:?}: {reason}"),
            TokenOutOfRange { token, vocab_len } => {
                write!(
                    f,
                    "token id {token} is outside the vocabulary of {vocab_len}"
                )
            }
            ContextFull { needed, capacity } => write!(
                f,
                "the sequence needs {needed} positions but the KV cache holds {capacity}"
            ),
            KvExhausted(e) => write!(f, "KV cache: {e}"),
            KvPool(e) => write!(f, "KV pool: {e}"),
            Load(e) => match e.io_error() {
                Some(io) => write!(f, "loading weights: {e}: {io}"),
                None => write!(f, "loading weights: {e}"),
            },
            ModelPool(e) => write!(f, "{e}"),
            InvalidArgument(e) => write!(f, "{e}"),
            Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            EngineErrorKind::Model(e) => Some(e),
            EngineErrorKind::Tokenizer(e) => Some(e),
            EngineErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<airs_gguf::GgufError> for EngineError {
    fn from(e: airs_gguf::GgufError) -> EngineError {
        EngineError::new(EngineErrorKind::Model(e))
    }
}

impl From<std::io::Error> for EngineError {
    fn from(e: std::io::Error) -> EngineError {
        EngineError::new(EngineErrorKind::Io(e))
    }
}
