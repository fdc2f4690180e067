//! Typed hyperparameters of the decoder-only architectures airs runs (`llama`, `qwen2`,
//! `qwen3`, `gemma3`, `phi3`), read from `{arch}.*` metadata with llama.cpp's defaults and checked for
//! consistency with the tensor shapes, so the forward pass can trust them. What an architecture
//! changes in the shared decoder is said here as data (norms, activation, attention scale,
//! sliding window, RoPE factors, fused matrices), so the forward pass has one body. Cost: a handful of hash lookups.

use crate::error::{GgufError, GgufErrorKind};
use crate::reader::Gguf;

/// The supported architectures.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Phi3,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
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

/// The gated feed-forward activation: `down(act(gate(x)) · up(x))`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// SiLU (SwiGLU: llama, qwen2).
    Silu,
    /// GELU, tanh approximation (GeGLU: gemma3).
    GeluTanh,
}

/// Sliding-window attention on some or all layers (gemma3: five local layers, then one
/// global; phi3: every layer).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// Positions a local layer attends: position `p` sees `p + 1 − window ..= p`
    /// (llama.cpp masks `p − p_kv ≥ window`).
    pub window: usize,
    /// `Some(n)`: every `n`-th layer (layer `l` with `(l + 1) % n == 0`) is global, the others
    /// local; `None`: every layer is local.
    pub global_every: Option<usize>,
    /// RoPE base of the local layers, where it differs from [`ModelConfig::rope_base`].
    pub local_rope_base: Option<f32>,
}

impl SlidingWindow {
    fn is_local(&self, layer: usize) -> bool {
        self.global_every
            .is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }
}

/// Per-dimension RoPE frequency factors stored as a tensor: the angle of rotated pair `i` is
/// divided by `factors[i]` (ggml's `freq_factors`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RopeFactors {
    /// `rope_freqs.weight`: Llama 3.1+'s frequency scaling, precomputed by the converter.
    Llama3,
    /// `rope_factors_short.weight`: Phi-3's LongRoPE factors within the original context
    /// (airs serves no more than that context, so the long factors are never needed).
    LongRopeShort,
}

impl RopeFactors {
    /// The tensor holding the factors.
    pub fn tensor_name(self) -> &'static str {
        match self {
            RopeFactors::Llama3 => "rope_freqs.weight",
            RopeFactors::LongRopeShort => "rope_factors_short.weight",
        }
    }
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
    /// Embeddings are multiplied by this before the first layer (gemma3: `√n_embd`).
    pub embedding_scale: Option<f32>,
    /// Per-head RMSNorm of q and k before RoPE (`attn_q_norm`, `attn_k_norm`: qwen3, gemma3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and feed-forward outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`: gemma3).
    pub post_norms: bool,
    pub ffn_activation: FfnActivation,
    /// The factor of the attention scores `q·k` (`1/√head_dim` but where a model says else).
    pub attention_scale: f32,
    pub sliding_window: Option<SlidingWindow>,
    /// Frequency factors of RoPE, when the file carries them.
    pub rope_factors: Option<RopeFactors>,
    /// Multiplies RoPE's cos and sin (`rope.scaling.attn_factor`: Phi-3 LongRoPE's
    /// magnitude correction; 1 elsewhere).
    pub rope_attn_factor: f32,
    /// The q, k and v projections are one fused `attn_qkv` matrix (phi3), read in place as
    /// three row ranges.
    pub fused_qkv: bool,
    /// Gate and up are one fused `ffn_up` matrix of `2·n_ff` rows, gate first (phi3).
    pub fused_gate_up: bool,
}

impl ModelConfig {
    /// Read and validate the hyperparameters of a `llama` or `qwen2` file.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<ModelConfig, GgufError> {
        let arch_name = gguf.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma3" => Architecture::Gemma3,
            "phi3" => Architecture::Phi3,
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
        let mut context_len = opt_count("context_length")?.unwrap_or(2048);
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
        if let Some(v) = opt_count("attention.value_length")?
            && v != head_dim
        {
            return Err(bad(
                &key("attention.value_length"),
                format!("{v} differs from the key length {head_dim}"),
            ));
        }
        let rope_style = match arch {
            Architecture::Llama => RopeStyle::Interleaved,
            Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Gemma3
            | Architecture::Phi3 => RopeStyle::Neox,
        };
        let gemma = arch == Architecture::Gemma3;
        let phi3 = arch == Architecture::Phi3;
        // llama.cpp: gemma3's query scale is 1/√head_dim but for the 27B (62 layers), whose
        // is 1/√(n_embd / n_head).
        let attention_scale = if gemma && layers == 62 {
            1.0 / ((embedding_len / heads) as f32).sqrt()
        } else {
            1.0 / (head_dim as f32).sqrt()
        };
        let sliding_window = if gemma {
            let window = count("attention.sliding_window")?;
            Some(SlidingWindow {
                window,
                global_every: Some(6),
                local_rope_base: Some(10_000.0),
            })
        } else if phi3 {
            // llama.cpp's defaults for files from before the key existed.
            let default = match (layers, context_len, kv_heads) {
                (32 | 40, 4096, _) => Some(2047),
                (32, 131_072, 32) => Some(262_144),
                (40, 131_072, _) => Some(131_072),
                _ => None,
            };
            let window = opt_count("attention.sliding_window")?
                .or(default)
                .ok_or_else(|| {
                    bad(
                        &key("attention.sliding_window"),
                        "phi3 needs a sliding window".into(),
                    )
                })?;
            Some(SlidingWindow {
                window,
                global_every: None,
                local_rope_base: None,
            })
        } else {
            None
        };
        let rope_factors = [RopeFactors::Llama3, RopeFactors::LongRopeShort]
            .into_iter()
            .find(|f| gguf.tensor(f.tensor_name()).is_some());
        if rope_factors == Some(RopeFactors::LongRopeShort)
            && gguf.tensor("rope_factors_long.weight").is_some()
            && let Some(original) = opt_count("rope.scaling.original_context_length")?
        {
            context_len = context_len.min(original);
        }
        let rope_attn_factor = opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
        if !(rope_attn_factor.is_finite() && rope_attn_factor > 0.0) {
            return Err(bad(
                &key("rope.scaling.attn_factor"),
                format!("{rope_attn_factor} is not positive"),
            ));
        }
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
            embedding_scale: gemma.then(|| (embedding_len as f32).sqrt()),
            qk_norm: gemma || arch == Architecture::Qwen3,
            post_norms: gemma,
            ffn_activation: if gemma {
                FfnActivation::GeluTanh
            } else {
                FfnActivation::Silu
            },
            attention_scale,
            sliding_window,
            rope_factors,
            rope_attn_factor,
            fused_qkv: gguf.tensor("blk.0.attn_qkv.weight").is_some(),
            fused_gate_up: gguf.tensor("blk.0.ffn_gate.weight").is_none(),
        })
    }

    /// The window of layer `layer` if it attends locally, `None` if it sees every position.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|w| w.is_local(layer))
            .map(|w| w.window)
    }

    /// The RoPE base of layer `layer`.
    pub fn layer_rope_base(&self, layer: usize) -> f32 {
        match self.sliding_window {
            Some(w) if w.is_local(layer) => w.local_rope_base.unwrap_or(self.rope_base),
            _ => self.rope_base,
        }
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
