//! airs-tokenizer: text ↔ token ids for GGUF models, built from the file's
//! `tokenizer.ggml.*` metadata, plus chat-template rendering ([`chat`]).
//!
//! Two tokenizers cover the models airs runs, both reimplemented from llama.cpp's
//! src/llama-vocab.cpp (whose behaviour defines what "correct" means for a GGUF file; the
//! test vectors in testdata/tokenizer are llama.cpp's):
//!
//! - **SentencePiece BPE** (`tokenizer.ggml.model = llama`: Llama 2, TinyLlama, Mistral
//!   v0.1, Phi-3, stories*). As in llama.cpp's `llm_tokenizer_spm`: spaces become `▁`, a
//!   space is prefixed, and symbols (UTF-8 characters) are merged greedily by the score of
//!   the token their concatenation forms; characters not in the vocabulary fall back to
//!   `<0xXX>` byte tokens. (A Unigram/Viterbi reading of the scores does *not* reproduce
//!   llama.cpp: the scores here act as merge ranks.)
//! - **Byte-level BPE** (`gpt2`: GPT-2, Llama 3, Qwen2/2.5). As in GPT-2 and llama.cpp's
//!   `llm_tokenizer_bpe`: a regex pre-tokenizer chosen by `tokenizer.ggml.pre`
//!   ([`PreTokenizerKind`]) cuts text into words, each word's bytes are mapped to GPT-2's
//!   printable byte characters, and the ranked `tokenizer.ggml.merges` are applied.
//!
//! Special tokens (control, user-defined) are split out of the text first when asked
//! ([`EncodeOptions`]); decoding ([`Tokenizer::decode`], [`StreamDecoder`]) never splits a
//! UTF-8 character. Costs: loading copies each token's text once into an arena with an id
//! hash index (Qwen2's 152k tokens and 151k merges load in tens of milliseconds); encoding
//! is O(n log n) in the length of each word; decoding is linear.
//!
//! ```no_run
//! # fn demo(gguf: &airs_gguf::Gguf<'_>) -> Result<(), Box<dyn std::error::Error>> {
//! use airs_tokenizer::{EncodeOptions, StreamDecoder, Tokenizer};
//! let tokenizer = Tokenizer::from_gguf(gguf)?;
//! let ids = tokenizer.encode("Hello world", EncodeOptions::prompt(&tokenizer));
//! let mut stream = StreamDecoder::new();
//! for &id in &ids {
//!     print!("{}", stream.push(&tokenizer, id));
//! }
//! print!("{}", stream.finish());
//! # Ok(()) }
//! ```

mod bpe;
mod bytelevel;
pub mod chat;
mod decode;
mod error;
mod load;
mod pretokenize;
pub mod pyjson;
mod special;
mod spm;
mod tokenizer;
mod vocab;

use std::fmt;

pub use decode::StreamDecoder;
pub use error::{TokenizerError, TokenizerErrorKind};
pub use load::{MAX_MERGES, MAX_VOCAB_LEN};
pub use pretokenize::PreTokenizerKind;
pub use tokenizer::{EncodeOptions, ModelKind, Tokenizer, clean_up_tokenization_spaces};

/// A token id: an index into the model's vocabulary (and its embedding rows).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId(pub u32);

impl TokenId {
    /// The id as an index into per-token tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl From<u32> for TokenId {
    fn from(id: u32) -> TokenId {
        TokenId(id)
    }
}

impl From<TokenId> for u32 {
    fn from(id: TokenId) -> u32 {
        id.0
    }
}

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
