//! Typed hyperparameters of the decoder-only architectures airs runs (`llama`, `qwen2`), read
//! from `{arch}.*` metadata with llama.cpp's defaults and checked for consistency with the
//! tensor shapes, so the forward pass can trust them. Cost: a handful of hash lookups.

use crate::error::{GgufError, GgufErrorKind};
use crate::reader::Gguf;

/// The supported architectures.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama.cpp's `LLAMA_ROPE_TYPE_NORM`, used by llama).
    Interleaved,
    /// Halves `(x[i], x[i + d/2])` (GPT-NeoX style, used by qwen2).
    Neox,
}

/// Everything the forward pass needs to know about a model's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub layers: usize,
    /// Model width (`n_embd`).
    pub embedding_len: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Hidden width of the feed-forward block (`n_ff`).
    pub ff_len: usize,
    pub vocab_len: usize,
    /// Training context length.
    pub context_len: usize,
    pub rope_base: f32,
    /// Number of dimensions of each head that RoPE rotates.
    pub rope_dims: usize,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
    /// Whether the output projection reuses `token_embd.weight`.
    pub tied_output: bool,
    /// Whether q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
}

impl ModelConfig {
    /// Read and validate the hyperparameters of a `llama` or `qwen2` file.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelConfig, GgufError> {
        let arch_name = gguf.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            other => {
                return Err(GgufError::new(GgufErrorKind::UnsupportedArchitecture(
                    other.into(),
                )));
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let count = |k: &str| -> Result<usize, GgufError> {
            let v = gguf.get_u64(&key(k))?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0 && v < 1 << 24)
                .ok_or_else(|| bad(&key(k), format!("{v} is out of range")))
        };
        let opt_count = |k: &str| -> Result<Option<usize>, GgufError> {
            match gguf.get(&key(k)) {
                None => Ok(None),
                Some(_) => count(k).map(Some),
            }
        };
        let opt_f32 = |k: &str| gguf.opt(&key(k), "a float", |v| v.as_f64().map(|f| f as f32));

        let layers = count("block_count")?;
        let embedding_len = count("embedding_length")?;
        let heads = count("attention.head_count")?;
        let kv_heads = opt_count("attention.head_count_kv")?.unwrap_or(heads);
        let ff_len = count("feed_forward_length")?;
        let context_len = opt_count("context_length")?.unwrap_or(2048);
        if embedding_len % heads != 0 {
            return Err(bad(
                &key("attention.head_count"),
                format!("{heads} heads do not divide the embedding length {embedding_len}"),
            ));
        }
        if heads % kv_heads != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{kv_heads} KV heads do not divide {heads} heads"),
            ));
        }
        let head_dim = opt_count("attention.key_length")?.unwrap_or(embedding_len / heads);
        if head_dim % 2 != 0 {
            return Err(bad(
                &key("attention.key_length"),
                format!("head dim {head_dim} is odd"),
            ));
        }
        let rope_dims = opt_count("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dims > head_dim || rope_dims % 2 != 0 {
            return Err(bad(
                &key("rope.dimension_count"),
                format!("{rope_dims} is odd or exceeds the head dim {head_dim}"),
            ));
        }
        let rope_base = opt_f32("rope.freq_base")?.unwrap_or(10_000.0);
        let rms_eps = opt_f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);
        if !(rope_base.is_finite() && rope_base > 0.0) {
            return Err(bad(
                &key("rope.freq_base"),
                format!("{rope_base} is not positive"),
            ));
        }
        if !(rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(bad(
                &key("attention.layer_norm_rms_epsilon"),
                format!("{rms_eps} is not a usable epsilon"),
            ));
        }

        let embd = gguf.tensor("token_embd.weight").ok_or_else(|| {
            GgufError::new(GgufErrorKind::BadTensor {
                tensor: "token_embd.weight".into(),
                reason: "missing".into(),
            })
        })?;
        if embd.dims.len() != 2 || embd.dims[0] != embedding_len as u64 {
            return Err(GgufError::new(GgufErrorKind::BadTensor {
                tensor: "token_embd.weight".into(),
                reason: format!(
                    "shape {:?} does not start with n_embd {embedding_len}",
                    embd.dims
                ),
            }));
        }
        let vocab_len = embd.dims[1] as usize;
        let tied_output = gguf.tensor("output.weight").is_none();
        let qkv_bias = gguf.tensor("blk.0.attn_q.bias").is_some();
        let rope_style = match arch {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2 => RopeStyle::Neox,
        };
        Ok(ModelConfig {
            arch,
            layers,
            embedding_len,
            heads,
            kv_heads,
            head_dim,
            ff_len,
            vocab_len,
            context_len,
            rope_base,
            rope_dims,
            rope_style,
            rms_eps,
            tied_output,
            qkv_bias,
        })
    }

    /// Width of the K (or V) projection: `kv_heads × head_dim`.
    pub fn kv_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Width of the Q projection: `heads × head_dim`.
    pub fn q_len(&self) -> usize {
        self.heads * self.head_dim
    }
}

fn bad(key: &str, reason: String) -> GgufError {
    GgufError::new(GgufErrorKind::BadHyperparameter {
        key: key.into(),
        reason,
    })
}
