//! The library's error type.

use std::io;
use std::path::PathBuf;

use airs_gguf::GgufError;
use airs_kernels::KernelError;

/// Why a synthetic model could not be planned or written. Underlying I/O, GGUF and kernel
/// errors are exposed as [`std::error::Error::source`], not repeated in the message: print
/// the chain (`{:#}` with anyhow) to see them.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown model shape {name:?} (known: {known})")]
    UnknownShape { name: String, known: String },

    #[error("unknown quantization mix {name:?} (known: {known})")]
    UnknownQuantMix { name: String, known: String },

    #[error("the thread count must be at least 1")]
    NoThreads,

    #[error("reading vocabulary file {path}")]
    VocabRead { path: PathBuf, source: io::Error },

    #[error("vocabulary file {path} is not a valid GGUF file")]
    VocabParse { path: PathBuf, source: GgufError },

    #[error("vocabulary file {path} has no tokenizer.ggml.tokens array")]
    VocabMissingTokens { path: PathBuf },

    #[error("vocabulary key {key}: {reason}")]
    VocabValue { key: String, reason: String },

    #[error("shape {shape} needs a {expected}-token vocabulary, the vocabulary has {actual}")]
    VocabSize {
        shape: &'static str,
        expected: usize,
        actual: usize,
    },

    #[error("quantizing {tensor}")]
    Quantize { tensor: String, source: KernelError },

    #[error("writing {path}")]
    Write { path: PathBuf, source: io::Error },

    #[error("writing the model")]
    Io(#[from] io::Error),
}
