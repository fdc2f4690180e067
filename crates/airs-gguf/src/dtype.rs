//! ggml tensor data types: the encodings a GGUF tensor's bytes may use.
//!
//! Each type stores values in fixed blocks of `block_len` elements taking `block_bytes` bytes
//! (F32 is a "block" of one element). The numeric ids and block geometry follow ggml's
//! `ggml_type` table (ggml.h / ggml.c `type_traits`); they are on-disk facts, so they are
//! spelled out here and checked by tests, not derived. Lookups are O(1) `match`es.

use std::fmt;

/// Number of elements in one k-quant super-block.
pub const QK_K: usize = 256;

/// A ggml data type as stored in a GGUF tensor-info record.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 31] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::IQ2XXS,
        GgmlType::IQ2XS,
        GgmlType::IQ3XXS,
        GgmlType::IQ1S,
        GgmlType::IQ4NL,
        GgmlType::IQ3S,
        GgmlType::IQ2S,
        GgmlType::IQ4XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
    ];

    /// The type with ggml id `id`, or `None` for ids ggml never assigned or has retired
    /// (4 and 5 were Q4_2/Q4_3; 31-33 were the removed Q4_0_4_4 family).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            16 => IQ2XXS,
            17 => IQ2XS,
            18 => IQ3XXS,
            19 => IQ1S,
            20 => IQ4NL,
            21 => IQ3S,
            22 => IQ2S,
            23 => IQ4XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            _ => return None,
        })
    }

    /// The ggml id written in GGUF files.
    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2K => 10,
            Q3K => 11,
            Q4K => 12,
            Q5K => 13,
            Q6K => 14,
            Q8K => 15,
            IQ2XXS => 16,
            IQ2XS => 17,
            IQ3XXS => 18,
            IQ1S => 19,
            IQ4NL => 20,
            IQ3S => 21,
            IQ2S => 22,
            IQ4XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
        }
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4NL => 32,
            Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS | IQ2XS | IQ3XXS | IQ1S | IQ3S | IQ2S
            | IQ4XS | IQ1M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2K => 84,
            Q3K => 110,
            Q4K => 144,
            Q5K => 176,
            Q6K => 210,
            Q8K => 292,
            IQ2XXS => 66,
            IQ2XS => 74,
            IQ3XXS => 98,
            IQ1S => 50,
            IQ4NL => 18,
            IQ3S => 110,
            IQ2S => 82,
            IQ4XS => 136,
            IQ1M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
        }
    }

    /// Bytes taken by `elements` values, or `None` if `elements` is not a whole number of
    /// blocks or the product overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block_len = self.block_len() as u64;
        if !elements.is_multiple_of(block_len) {
            return None;
        }
        (elements / block_len).checked_mul(self.block_bytes() as u64)
    }

    /// ggml's name for the type (`"q4_K"`, `"f16"`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2K => "q2_K",
            Q3K => "q3_K",
            Q4K => "q4_K",
            Q5K => "q5_K",
            Q6K => "q6_K",
            Q8K => "q8_K",
            IQ2XXS => "iq2_xxs",
            IQ2XS => "iq2_xs",
            IQ3XXS => "iq3_xxs",
            IQ1S => "iq1_s",
            IQ4NL => "iq4_nl",
            IQ3S => "iq3_s",
            IQ2S => "iq2_s",
            IQ4XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_retired_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        for retired in [4, 5, 31, 32, 33, 36, u32::MAX] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    #[test]
    fn block_geometry_matches_ggml() {
        // bits per weight of the common types, as ggml documents them
        let bpw = |t: GgmlType| t.block_bytes() as f64 * 8.0 / t.block_len() as f64;
        assert_eq!(bpw(GgmlType::Q4_0), 4.5);
        assert_eq!(bpw(GgmlType::Q8_0), 8.5);
        assert_eq!(bpw(GgmlType::Q4K), 4.5);
        assert_eq!(bpw(GgmlType::Q5K), 5.5);
        assert_eq!(bpw(GgmlType::Q6K), 6.5625);
        assert_eq!(GgmlType::Q4K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4K.bytes_for(100), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
