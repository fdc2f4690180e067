//! Error type of airs-memory: one opaque [`MemoryError`] carrying an [`ErrorKind`].
//!
//! Design: the crate degrades instead of failing wherever the design allows (no userfaultfd, no
//! mlock, no huge pages become [`crate::Notice`]s), so errors are reserved for what the caller must
//! act on: a file that cannot be opened or read, a layout that does not match the file, a mapping
//! that cannot be made. Errors are `Clone` (the I/O source sits behind an `Arc`) because the lazy
//! loader keeps a sticky error that every caller of `LoaderHandle::error` receives a copy of.
//! Cost: one allocation per error, none on the success path.

use std::fmt;
use std::sync::Arc;

/// What went wrong, coarsely; match on this, not on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The model file could not be opened or its size read.
    Open,
    /// Reading the model file failed (I/O error).
    Read,
    /// The model file ended early: it was truncated or replaced after it was opened.
    Truncated,
    /// The layout does not describe the file (wrong length, span out of bounds).
    Layout,
    /// An option is out of range (e.g. `chunk_bytes` below 64 KiB).
    Config,
    /// A mapping (mmap, mprotect) could not be created or changed.
    Map,
    /// A userfaultfd operation failed after registration.
    Userfaultfd,
    /// The loader was stopped before the region became resident (region dropped).
    Stopped,
    /// The model pool's account refused the memory ([`crate::PoolFull`], in the message).
    PoolFull,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Open => "cannot open model file",
            ErrorKind::Read => "cannot read model file",
            ErrorKind::Truncated => "model file truncated",
            ErrorKind::Layout => "bad region layout",
            ErrorKind::Config => "bad load options",
            ErrorKind::Map => "memory mapping failed",
            ErrorKind::Userfaultfd => "userfaultfd failed",
            ErrorKind::Stopped => "loader stopped",
            ErrorKind::PoolFull => "model pool full",
        })
    }
}

/// Error of every fallible airs-memory operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind}: {detail}")]
pub struct MemoryError {
    kind: ErrorKind,
    detail: String,
    #[source]
    source: Option<Arc<std::io::Error>>,
}

impl MemoryError {
    /// An error of `kind` with a human-readable `detail` (what was being done, on what).
    pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: None,
        }
    }

    /// An error of `kind` caused by an I/O error.
    pub fn with_io(kind: ErrorKind, detail: impl Into<String>, source: std::io::Error) -> Self {
        Self {
            kind,
            detail: detail.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// An error of `kind` caused by a raw errno (from rustix).
    pub(crate) fn with_errno(
        kind: ErrorKind,
        detail: impl Into<String>,
        errno: rustix::io::Errno,
    ) -> Self {
        Self::with_io(kind, detail, std::io::Error::from(errno))
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The underlying OS error, when there is one.
    pub fn io_error(&self) -> Option<&std::io::Error> {
        self.source.as_deref()
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = MemoryError> = std::result::Result<T, E>;
