//! Quantization mixes: which ggml type each tensor gets, following llama.cpp's
//! `llama_tensor_get_type` (src/llama-quant.cpp) for the mixes it names.

use std::fmt;
use std::str::FromStr;

use airs_gguf::GgmlType;

use crate::SynthError;

/// What a tensor is in the model; decides its type under a mix and how its weights are drawn.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    TokenEmbedding,
    OutputNorm,
    Output,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    /// The q, k or v bias vector of qwen2.
    AttnBias,
    /// The per-head RMSNorm weight of q or of k (qwen3).
    AttnQkNorm,
    /// The fused q/k/v projection (phi3).
    AttnQkv,
    /// The fused gate/up projection (phi3's `ffn_up` of `2·n_ff` rows).
    FfnGateUp,
    /// RoPE frequency factors (`rope_freqs`, `rope_factors_short/long`): fixed values the
    /// plan computes, not random draws.
    RopeFactors,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
}

impl TensorRole {
    /// Whether the tensor is a 1-D vector (norm weights and biases), which every mix keeps F32.
    pub fn is_vector(self) -> bool {
        matches!(
            self,
            TensorRole::OutputNorm
                | TensorRole::AttnNorm
                | TensorRole::FfnNorm
                | TensorRole::AttnBias
                | TensorRole::AttnQkNorm
                | TensorRole::RopeFactors
        )
    }

    /// Whether the tensor is an RMSNorm weight (drawn around 1.0 instead of 0.0).
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            TensorRole::OutputNorm
                | TensorRole::AttnNorm
                | TensorRole::FfnNorm
                | TensorRole::AttnQkNorm
        )
    }
}

/// A quantization mix: the type of every tensor of a model.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum QuantMix {
    /// Everything F32 (`general.file_type` 0).
    F32,
    /// Matrices F16, vectors F32 (file type 1).
    F16,
    /// Matrices Q8_0, vectors F32 (file type 7); llama.cpp keeps `output.weight` Q8_0 too.
    Q8_0,
    /// llama.cpp's Q4_K_M (file type 15): matrices Q4_K, `output.weight` Q6_K, and Q6_K for
    /// `attn_v` and `ffn_down` in the layers [`use_more_bits`] picks; vectors F32.
    Q4KM,
    /// llama.cpp's Q5_K_M (file type 17): Q4_K_M's choices with Q5_K in place of Q4_K —
    /// matrices Q5_K, `output.weight` Q6_K, and Q6_K for `attn_v` and `ffn_down` in the
    /// layers [`use_more_bits`] picks; vectors F32.
    Q5KM,
    /// llama.cpp's Q4_1 (file type 3): matrices Q4_1, `output.weight` Q6_K; vectors F32.
    Q4_1,
    /// llama.cpp's Q5_1 (file type 9): matrices Q5_1, `output.weight` Q6_K; vectors F32.
    /// (Q5_1 is also what llama.cpp's Q5_K_M writes for rows not a multiple of 256.)
    Q5_1,
}

impl QuantMix {
    pub const ALL: [QuantMix; 7] = [
        QuantMix::F32,
        QuantMix::F16,
        QuantMix::Q8_0,
        QuantMix::Q4KM,
        QuantMix::Q5KM,
        QuantMix::Q4_1,
        QuantMix::Q5_1,
    ];

    /// The name used on the command line and in file names.
    pub fn name(self) -> &'static str {
        match self {
            QuantMix::F32 => "f32",
            QuantMix::F16 => "f16",
            QuantMix::Q8_0 => "q8_0",
            QuantMix::Q4KM => "q4_k_m",
            QuantMix::Q5KM => "q5_k_m",
            QuantMix::Q4_1 => "q4_1",
            QuantMix::Q5_1 => "q5_1",
        }
    }

    /// llama.cpp's `llama_ftype` value, written as `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            QuantMix::F32 => 0,
            QuantMix::F16 => 1,
            QuantMix::Q8_0 => 7,
            QuantMix::Q4KM => 15,
            QuantMix::Q5KM => 17,
            QuantMix::Q4_1 => 3,
            QuantMix::Q5_1 => 9,
        }
    }

    /// Whether the mix uses block-quantized types (then `general.quantization_version` is 2).
    pub fn is_quantized(self) -> bool {
        !matches!(self, QuantMix::F32 | QuantMix::F16)
    }

    /// The type of a tensor with `role` in layer `layer` of `layers` (the layer is ignored
    /// for tensors outside the blocks).
    pub fn tensor_type(self, role: TensorRole, layer: usize, layers: usize) -> GgmlType {
        if role.is_vector() {
            return GgmlType::F32;
        }
        match self {
            QuantMix::F32 => GgmlType::F32,
            QuantMix::F16 => GgmlType::F16,
            QuantMix::Q8_0 => GgmlType::Q8_0,
            // llama.cpp raises `output.weight` to Q6_K in every mix but Q8_0 (and the float
            // ones).
            QuantMix::Q4_1 | QuantMix::Q5_1 if role == TensorRole::Output => GgmlType::Q6K,
            QuantMix::Q4_1 => GgmlType::Q4_1,
            QuantMix::Q5_1 => GgmlType::Q5_1,
            // Q4_K_M and Q5_K_M differ only in the type of the remaining matrices. (llama.cpp
            // also raises phi3's fused `attn_qkv` one step, to Q5_K and Q6_K; not done here.)
            QuantMix::Q4KM | QuantMix::Q5KM => match role {
                TensorRole::Output => GgmlType::Q6K,
                TensorRole::AttnV | TensorRole::FfnDown if use_more_bits(layer, layers) => {
                    GgmlType::Q6K
                }
                _ if self == QuantMix::Q4KM => GgmlType::Q4K,
                _ => GgmlType::Q5K,
            },
        }
    }
}

/// llama.cpp's `use_more_bits(i_layer, n_layers)`: the first and last eighth of the layers
/// and every third layer in between, where Q4_K_M and Q5_K_M spend Q6_K on `attn_v` and
/// `ffn_down`.
pub fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

impl fmt::Display for QuantMix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for QuantMix {
    type Err = SynthError;

    fn from_str(name: &str) -> Result<QuantMix, SynthError> {
        QuantMix::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| SynthError::UnknownQuantMix {
                name: name.into(),
                known: QuantMix::ALL.map(QuantMix::name).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_22_layers() {
        // n/8 = 2, 7n/8 = 19: layers 0-1, 19-21, and 4, 7, 10, 13, 16 ((i - 2) % 3 == 2).
        let picked: Vec<usize> = (0..22).filter(|&i| use_more_bits(i, 22)).collect();
        assert_eq!(picked, [0, 1, 4, 7, 10, 13, 16, 19, 20, 21]);
        // n = 2: n/8 = 0, 7n/8 = 1, so only the last layer.
        assert_eq!((0..2).filter(|&i| use_more_bits(i, 2)).count(), 1);
        assert!(use_more_bits(1, 2));
    }

    #[test]
    fn names_round_trip() {
        for q in QuantMix::ALL {
            assert_eq!(q.name().parse::<QuantMix>().unwrap(), q);
        }
        assert!("q4_k_s".parse::<QuantMix>().is_err());
    }
}
