//! The named model shapes: architecture, hyperparameters and the vocabulary file each uses.

use std::fmt;
use std::str::FromStr;

use crate::SynthError;

/// A model shape that `airs-synth` can generate.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// A 2-layer llama with a 256-wide residual stream and the llama-spm vocabulary: tiny
    /// enough for tests, with every row a whole number of k-quant super-blocks.
    Tiny,
    /// A 2-layer qwen2 (q/k/v biases, NeoX RoPE) with the 151936-token qwen2 vocabulary.
    Qwen2Tiny,
    /// The shape of TinyLlama-1.1B (22 layers, n_embd 2048, GQA 32/4, n_ff 5632, 32000 tokens).
    TinyLlama1_1B,
}

/// Hyperparameters of a shape, in llama.cpp's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyperparameters {
    /// `general.architecture`: `"llama"` or `"qwen2"`.
    pub arch: &'static str,
    pub layers: usize,
    /// `n_embd`.
    pub embedding_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// `n_ff`.
    pub ff_len: usize,
    /// Tokens in the vocabulary (rows of `token_embd.weight` and `output.weight`).
    pub vocab_len: usize,
    pub context_len: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Whether q/k/v projections carry bias vectors (qwen2).
    pub qkv_bias: bool,
    /// File name, in the vocabulary directory, of the GGUF vocabulary whose `tokenizer.*`
    /// metadata the model carries.
    pub vocab_file: &'static str,
}

impl Hyperparameters {
    pub fn head_dim(&self) -> usize {
        self.embedding_len / self.heads
    }

    /// Width of the K and V projections: `kv_heads × head_dim`.
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim()
    }
}

/// The llama SentencePiece test vocabulary of llama.cpp (32000 tokens).
const LLAMA_SPM_VOCAB: &str = "ggml-vocab-llama-spm.gguf";
/// llama.cpp's qwen2 BPE test vocabulary (151936 tokens, 151387 merges, pre-tokenizer qwen2).
const QWEN2_VOCAB: &str = "ggml-vocab-qwen2.gguf";

impl Shape {
    pub const ALL: [Shape; 3] = [Shape::Tiny, Shape::Qwen2Tiny, Shape::TinyLlama1_1B];

    /// The name used on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Tiny => "tiny",
            Shape::Qwen2Tiny => "qwen2-tiny",
            Shape::TinyLlama1_1B => "tinyllama-1.1b",
        }
    }

    pub fn hparams(self) -> Hyperparameters {
        match self {
            Shape::Tiny => Hyperparameters {
                arch: "llama",
                layers: 2,
                embedding_len: 256,
                heads: 4,
                kv_heads: 2,
                ff_len: 512,
                vocab_len: 32000,
                context_len: 2048,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                qkv_bias: false,
                vocab_file: LLAMA_SPM_VOCAB,
            },
            Shape::Qwen2Tiny => Hyperparameters {
                arch: "qwen2",
                layers: 2,
                embedding_len: 256,
                heads: 4,
                kv_heads: 2,
                ff_len: 512,
                vocab_len: 151_936,
                context_len: 32_768,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                qkv_bias: true,
                vocab_file: QWEN2_VOCAB,
            },
            Shape::TinyLlama1_1B => Hyperparameters {
                arch: "llama",
                layers: 22,
                embedding_len: 2048,
                heads: 32,
                kv_heads: 4,
                ff_len: 5632,
                vocab_len: 32000,
                context_len: 2048,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                qkv_bias: false,
                vocab_file: LLAMA_SPM_VOCAB,
            },
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Shape {
    type Err = SynthError;

    fn from_str(name: &str) -> Result<Shape, SynthError> {
        Shape::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| SynthError::UnknownShape {
                name: name.into(),
                known: Shape::ALL.map(Shape::name).join(", "),
            })
    }
}
