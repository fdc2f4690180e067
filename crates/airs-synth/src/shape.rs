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
    /// A 2-layer qwen3 (no biases, per-head q/k RMSNorm, NeoX RoPE) with the qwen2
    /// vocabulary and [sharp](Hyperparameters::sharp) weights, for reference distributions.
    Qwen3Tiny,
    /// A 2-layer Llama 3 (the 128256-token llama-bpe vocabulary, grouped-query attention
    /// with 8 KV heads, `rope_freqs` of Llama 3.1's frequency scaling) with sharp weights.
    Llama3Tiny,
    /// A 2-layer Phi-3 (fused `attn_qkv` and gate/up `ffn_up`, partial rotary, LongRoPE
    /// factors, a sliding window on every layer, the 32064-token phi-3 vocabulary) with sharp
    /// weights.
    Phi3Tiny,
    /// The shape of TinyLlama-1.1B (22 layers, n_embd 2048, GQA 32/4, n_ff 5632, 32000 tokens).
    TinyLlama1_1B,
}

/// RoPE frequency factors a shape's file carries.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `rope_freqs.weight` as llama.cpp's converter computes it for Llama 3.1+ (factor 8,
    /// low/high frequency factors 1 and 4, original context 8192).
    Llama3,
    /// Phi-3 LongRoPE: `rope_factors_short/long.weight`, `rope.scaling.attn_factor` and
    /// `rope.scaling.original_context_length`.
    LongRope {
        attn_factor: f32,
        original_context: usize,
    },
}

/// Hyperparameters of a shape, in llama.cpp's terms.
#[derive(Clone, Debug, PartialEq)]
pub struct Hyperparameters {
    /// `general.architecture`: `"llama"`, `"qwen2"` or `"qwen3"`.
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
    /// Whether q and k get a per-head RMSNorm (`attn_q_norm`, `attn_k_norm`: qwen3).
    pub qk_norm: bool,
    /// Weights drawn so that next-token distributions are far from uniform (embeddings of
    /// std 1, q/k of std 0.1, output of std 0.5; see [`crate::weights::distribution`]): what
    /// a KL-divergence comparison against another implementation needs to mean anything.
    pub sharp: bool,
    /// Dimensions of each head that RoPE rotates (`head_dim` unless partial).
    pub rope_dims: usize,
    /// The q/k/v and gate/up matrices are fused (phi3's `attn_qkv`, `ffn_up` of `2·n_ff`).
    pub fused: bool,
    /// `{arch}.attention.sliding_window`, when the shape has one.
    pub sliding_window: Option<usize>,
    /// RoPE frequency factors the file carries as tensors.
    pub rope_scaling: Option<RopeScaling>,
    /// File name, in the vocabulary directory, of the GGUF vocabulary whose `tokenizer.*`
    /// metadata the model carries.
    pub vocab_file: &'static str,
}

impl Hyperparameters {
    pub fn head_dim(&self) -> usize {
        self.embedding_len / self.heads
    }

    /// Dimensions RoPE rotates (`rope_dims`, 0 meaning the whole head).
    pub fn rotated_dims(&self) -> usize {
        if self.rope_dims == 0 {
            self.head_dim()
        } else {
            self.rope_dims
        }
    }

    /// Width of the K and V projections: `kv_heads × head_dim`.
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim()
    }
}

/// The llama SentencePiece test vocabulary of llama.cpp (32000 tokens).
const LLAMA_SPM_VOCAB: &str = "ggml-vocab-llama-spm.gguf";
/// llama.cpp's Llama 3 BPE test vocabulary (128256 tokens, pre-tokenizer llama-bpe).
const LLAMA_BPE_VOCAB: &str = "ggml-vocab-llama-bpe.gguf";
/// llama.cpp's Phi-3 SentencePiece test vocabulary (32064 tokens).
const PHI3_VOCAB: &str = "ggml-vocab-phi-3.gguf";
/// llama.cpp's qwen2 BPE test vocabulary (151936 tokens, 151387 merges, pre-tokenizer qwen2).
const QWEN2_VOCAB: &str = "ggml-vocab-qwen2.gguf";

impl Shape {
    pub const ALL: [Shape; 6] = [
        Shape::Tiny,
        Shape::Qwen2Tiny,
        Shape::Qwen3Tiny,
        Shape::Llama3Tiny,
        Shape::Phi3Tiny,
        Shape::TinyLlama1_1B,
    ];

    /// The name used on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            Shape::Tiny => "tiny",
            Shape::Qwen2Tiny => "qwen2-tiny",
            Shape::Qwen3Tiny => "qwen3-tiny",
            Shape::Llama3Tiny => "llama3-tiny",
            Shape::Phi3Tiny => "phi3-tiny",
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
                qk_norm: false,
                sharp: false,
                rope_dims: 0,
                fused: false,
                sliding_window: None,
                rope_scaling: None,
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
                qk_norm: false,
                sharp: false,
                rope_dims: 0,
                fused: false,
                sliding_window: None,
                rope_scaling: None,
                vocab_file: QWEN2_VOCAB,
            },
            Shape::Qwen3Tiny => Hyperparameters {
                arch: "qwen3",
                layers: 2,
                embedding_len: 256,
                heads: 4,
                kv_heads: 2,
                ff_len: 512,
                vocab_len: 151_936,
                context_len: 32_768,
                rope_base: 1_000_000.0,
                rms_eps: 1e-6,
                qkv_bias: false,
                qk_norm: true,
                sharp: true,
                rope_dims: 0,
                fused: false,
                sliding_window: None,
                rope_scaling: None,
                vocab_file: QWEN2_VOCAB,
            },
            Shape::Llama3Tiny => Hyperparameters {
                arch: "llama",
                layers: 2,
                embedding_len: 512,
                heads: 16,
                kv_heads: 8,
                ff_len: 1024,
                vocab_len: 128_256,
                context_len: 131_072,
                rope_base: 500_000.0,
                rms_eps: 1e-5,
                qkv_bias: false,
                qk_norm: false,
                sharp: true,
                rope_dims: 0,
                fused: false,
                sliding_window: None,
                rope_scaling: Some(RopeScaling::Llama3),
                vocab_file: LLAMA_BPE_VOCAB,
            },
            Shape::Phi3Tiny => Hyperparameters {
                arch: "phi3",
                layers: 2,
                embedding_len: 256,
                heads: 4,
                kv_heads: 4,
                ff_len: 512,
                vocab_len: 32_064,
                context_len: 131_072,
                rope_base: 10_000.0,
                rms_eps: 1e-5,
                qkv_bias: false,
                qk_norm: false,
                sharp: true,
                rope_dims: 48,
                fused: true,
                sliding_window: Some(160),
                rope_scaling: Some(RopeScaling::LongRope {
                    attn_factor: 1.190_239,
                    original_context: 4096,
                }),
                vocab_file: PHI3_VOCAB,
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
                qk_norm: false,
                sharp: false,
                rope_dims: 0,
                fused: false,
                sliding_window: None,
                rope_scaling: None,
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
