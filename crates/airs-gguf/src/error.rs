//! The reader's error type: one opaque [`GgufError`] carrying a [`GgufErrorKind`] and the file
//! offset where reading went wrong.

use std::fmt;

/// What was wrong with a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GgufErrorKind {
    /// The file ended inside `what`.
    Truncated { what: &'static str },
    /// The first four bytes are not `GGUF`.
    BadMagic([u8; 4]),
    /// A version other than 2 or 3 (1 used 32-bit counts and is not read).
    UnsupportedVersion(u32),
    /// The version field reads as a byte-swapped 2 or 3: a big-endian file.
    BigEndian,
    /// A count that cannot possibly fit in the rest of the file.
    CountTooLarge { what: &'static str, count: u64 },
    /// A string length that runs past the end of the file.
    StringTooLong { len: u64 },
    /// A key or tensor name that is not UTF-8.
    InvalidUtf8 { what: &'static str },
    /// A metadata value type id outside the spec.
    UnknownValueType(u32),
    /// Arrays nested deeper than [`crate::MAX_ARRAY_DEPTH`].
    NestingTooDeep,
    /// Two metadata entries with the same key.
    DuplicateKey(String),
    /// `general.alignment` is zero, not a power of two, or too large. (One that is not a u32
    /// at all is a [`GgufErrorKind::WrongType`], as in ggml.)
    BadAlignment(u64),
    /// A tensor with more than four dimensions.
    TooManyDims { tensor: String, dims: u32 },
    /// A tensor whose element count overflows u64, has a zero dimension, or is not a whole
    /// number of blocks of its type.
    BadShape { tensor: String },
    /// A tensor type id that ggml never assigned.
    UnknownTensorType { tensor: String, id: u32 },
    /// Two tensors with the same name.
    DuplicateTensor(String),
    /// A tensor whose data offset is not a multiple of the file's alignment.
    MisalignedTensor { tensor: String, offset: u64 },
    /// A tensor whose data runs outside the data section.
    TensorOutOfBounds {
        tensor: String,
        end: u64,
        file_len: u64,
    },
    /// Two tensors whose data ranges overlap.
    OverlappingTensors { first: String, second: String },
    /// A required metadata key is absent.
    MissingKey(String),
    /// A metadata key holds a value of the wrong type.
    WrongType { key: String, expected: &'static str },
    /// A hyperparameter that is present but impossible (zero heads, head count not dividing
    /// the embedding, ...).
    BadHyperparameter { key: String, reason: String },
    /// An architecture airs has no forward pass for.
    UnsupportedArchitecture(String),
    /// A tensor that the architecture requires is missing or has the wrong shape.
    BadTensor { tensor: String, reason: String },
}

/// An error reading a GGUF file: what went wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError {
    kind: GgufErrorKind,
    offset: Option<u64>,
}

impl GgufError {
    pub(crate) fn at(kind: GgufErrorKind, offset: u64) -> GgufError {
        GgufError {
            kind,
            offset: Some(offset),
        }
    }

    pub(crate) fn new(kind: GgufErrorKind) -> GgufError {
        GgufError { kind, offset: None }
    }

    /// What went wrong.
    pub fn kind(&self) -> &GgufErrorKind {
        &self.kind
    }

    /// The byte offset in the file where the problem was found, when there is one.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }
}

impl fmt::Display for GgufErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufErrorKind::*;
        match self {
            Truncated { what } => write!(f, "file is truncated inside {what}"),
            BadMagic(m) => write!(
                f,
                "not a GGUF file (magic {:?})",
                String::from_utf8_lossy(m)
            ),
            UnsupportedVersion(v) => write!(f, "unsupported GGUF version {v} (2 and 3 are read)"),
            BigEndian => write!(f, "big-endian GGUF files are not supported"),
            CountTooLarge { what, count } => {
                write!(f, "{what} count {count} cannot fit in the file")
            }
            StringTooLong { len } => {
                write!(f, "string of {len} bytes runs past the end of the file")
            }
            InvalidUtf8 { what } => write!(f, "{what} is not valid UTF-8"),
            UnknownValueType(t) => write!(f, "unknown metadata value type {t}"),
            NestingTooDeep => write!(f, "metadata arrays nested too deeply"),
            DuplicateKey(k) => write!(f, "metadata key {k:?} appears twice"),
            BadAlignment(a) => write!(f, "general.alignment {a} is not a usable power of two"),
            TooManyDims { tensor, dims } => {
                write!(f, "tensor {tensor:?} has {dims} dimensions (at most 4)")
            }
            BadShape { tensor } => write!(
                f,
                "tensor {tensor:?} has an impossible shape (zero, overflowing, or not whole blocks)"
            ),
            UnknownTensorType { tensor, id } => {
                write!(f, "tensor {tensor:?} has unknown ggml type id {id}")
            }
            DuplicateTensor(t) => write!(f, "tensor {t:?} appears twice"),
            MisalignedTensor { tensor, offset } => {
                write!(f, "tensor {tensor:?} data offset {offset} is not aligned")
            }
            TensorOutOfBounds {
                tensor,
                end,
                file_len,
            } => write!(
                f,
                "tensor {tensor:?} data ends at byte {end}, past the end of the {file_len}-byte file"
            ),
            OverlappingTensors { first, second } => {
                write!(f, "tensors {first:?} and {second:?} overlap")
            }
            MissingKey(k) => write!(f, "metadata key {k:?} is missing"),
            WrongType { key, expected } => write!(f, "metadata key {key:?} is not {expected}"),
            BadHyperparameter { key, reason } => write!(f, "{key}: {reason}"),
            UnsupportedArchitecture(a) => {
                write!(
                    f,
                    "architecture {a:?} is not supported (llama and qwen2 are)"
                )
            }
            BadTensor { tensor, reason } => write!(f, "tensor {tensor:?}: {reason}"),
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(o) => write!(f, "{} (at byte {o})", self.kind),
            None => write!(f, "{}", self.kind),
        }
    }
}

impl std::error::Error for GgufError {}
