//! The tokenizer's error type: an opaque [`TokenizerError`] carrying a [`TokenizerErrorKind`].
//! Every way GGUF tokenizer metadata can be malformed maps to a kind here; building a
//! tokenizer never panics on bad metadata.

use thiserror::Error;

/// What was wrong with a file's tokenizer metadata.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum TokenizerErrorKind {
    /// A required metadata key is absent.
    #[error("missing metadata key {0}")]
    MissingKey(&'static str),
    /// A metadata key holds a value of the wrong type.
    #[error("metadata key {key} should be {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` names a tokenizer airs does not implement.
    #[error(
        "unsupported tokenizer model {0:?} (supported: \"llama\" SentencePiece, \"gpt2\" byte-level BPE)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer airs does not implement.
    #[error("unknown pre-tokenizer {0:?} (supported: {supported})", supported = crate::PreTokenizerKind::SUPPORTED_NAMES)]
    UnknownPreTokenizer(String),
    /// The vocabulary has no tokens.
    #[error("the vocabulary is empty")]
    EmptyVocabulary,
    /// More entries than airs accepts (a guard against absurd allocations).
    #[error("{what} has {count} entries, more than the limit of {limit}")]
    TooMany {
        what: &'static str,
        count: usize,
        limit: usize,
    },
    /// A per-token array whose length differs from the token list's.
    #[error("{key} has {len} entries but the vocabulary has {vocab_len} tokens")]
    LengthMismatch {
        key: &'static str,
        len: usize,
        vocab_len: usize,
    },
    /// A token whose text is empty or not UTF-8.
    #[error("token {id} has empty or non-UTF-8 text")]
    InvalidTokenText { id: u32 },
    /// Two tokens with the same text.
    #[error("token text {text:?} appears twice, as ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    /// A special-token id key (BOS, EOS, ...) naming a token outside the vocabulary.
    #[error("{key} = {id} is outside the vocabulary of {vocab_len} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: i64,
        vocab_len: usize,
    },
    /// `tokenizer.ggml.add_bos_token` is true but there is no BOS token.
    #[error("tokenizer.ggml.add_bos_token is true but the vocabulary has no BOS token")]
    MissingBos,
    /// A merge rule that is not two space-separated non-empty parts.
    #[error("merge rule {rank} ({text:?}) is not of the form \"LEFT RIGHT\"")]
    MalformedMerge { rank: usize, text: String },
    /// A merge rule naming a part that is not a token.
    #[error("merge rule {rank} ({text:?}) names {part:?}, which is not in the vocabulary")]
    MergeUnknownToken {
        rank: usize,
        text: String,
        part: String,
    },
    /// A pre-tokenizer pattern failed to compile (a bug in airs, not in the file).
    #[error("pre-tokenizer pattern failed to compile: {0}")]
    BadPattern(String),
}

/// An error building a tokenizer from GGUF metadata.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("{kind}")]
pub struct TokenizerError {
    kind: TokenizerErrorKind,
}

impl TokenizerError {
    pub fn new(kind: TokenizerErrorKind) -> TokenizerError {
        TokenizerError { kind }
    }

    /// What went wrong.
    pub fn kind(&self) -> &TokenizerErrorKind {
        &self.kind
    }
}

impl From<TokenizerErrorKind> for TokenizerError {
    fn from(kind: TokenizerErrorKind) -> TokenizerError {
        TokenizerError::new(kind)
    }
}
