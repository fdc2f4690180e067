//! Builders shared by the malformed-file tests and the fuzz-seed generator: small valid GGUF
//! files written with `airs_gguf::writer`, and the byte offsets of their fields so a test can
//! patch exactly one of them.
#![allow(dead_code)] // each test binary uses a different subset

use airs_gguf::GgmlType;
use airs_gguf::ValueType;
use airs_gguf::writer::{MetaValue, TensorSpec, encode_header, write_gguf};

pub fn kv(key: &str, value: MetaValue) -> (String, MetaValue) {
    (key.to_owned(), value)
}

pub fn tensor(name: &str, dims: &[u64], ty: GgmlType) -> TensorSpec {
    TensorSpec {
        name: name.to_owned(),
        dims: dims.to_vec(),
        ty,
    }
}

/// The deterministic bytes `build` fills tensor `i` with.
pub fn fill_byte(i: usize, j: usize) -> u8 {
    (i * 101 + j * 7 + 1) as u8
}

/// A whole file: header, then each tensor's bytes (`fill_byte`) at its aligned offset.
pub fn build(metadata: &[(String, MetaValue)], tensors: &[TensorSpec], alignment: u64) -> Vec<u8> {
    let mut out = Vec::new();
    write_gguf(&mut out, metadata, tensors, alignment, |i, buf| {
        let n = tensors[i].bytes()? as usize;
        buf.extend((0..n).map(|j| fill_byte(i, j)));
        Ok(())
    })
    .expect("writer accepts the test file");
    out
}

/// Where one metadata entry's fields are.
#[derive(Clone, Copy, Debug)]
pub struct KvAt {
    pub key_len: usize,
    pub key: usize,
    pub ty: usize,
    pub value: usize,
    pub end: usize,
}

/// Where one tensor-info record's fields are.
#[derive(Clone, Debug)]
pub struct TensorAt {
    pub name_len: usize,
    pub name: usize,
    pub n_dims: usize,
    /// Offset of each dimension.
    pub dims: Vec<usize>,
    pub ty: usize,
    pub offset: usize,
    pub end: usize,
}

/// A valid file and the offsets of its fields.
#[derive(Clone, Debug)]
pub struct Layout {
    pub bytes: Vec<u8>,
    pub kv: Vec<KvAt>,
    pub tensors: Vec<TensorAt>,
    /// End of the tensor-info table (before padding).
    pub table_end: usize,
    pub data_offset: usize,
}

pub const VERSION_AT: usize = 4;
pub const TENSOR_COUNT_AT: usize = 8;
pub const KV_COUNT_AT: usize = 16;
pub const HEADER_LEN: usize = 24;

/// Build a file and locate its fields. The encoded length of a metadata entry is measured by
/// encoding it alone with alignment 1, so no layout knowledge is duplicated here.
pub fn layout(metadata: &[(String, MetaValue)], tensors: &[TensorSpec], alignment: u64) -> Layout {
    let bytes = build(metadata, tensors, alignment);
    let mut pos = HEADER_LEN;
    let mut kv = Vec::new();
    for entry in metadata {
        let (alone, _) = encode_header(std::slice::from_ref(entry), &[], 1).unwrap();
        let len = alone.len() - HEADER_LEN;
        let at = KvAt {
            key_len: pos,
            key: pos + 8,
            ty: pos + 8 + entry.0.len(),
            value: pos + 12 + entry.0.len(),
            end: pos + len,
        };
        kv.push(at);
        pos += len;
    }
    let mut infos = Vec::new();
    for t in tensors {
        let n_dims = pos + 8 + t.name.len();
        let dims: Vec<usize> = (0..t.dims.len()).map(|d| n_dims + 4 + 8 * d).collect();
        let ty = n_dims + 4 + 8 * t.dims.len();
        infos.push(TensorAt {
            name_len: pos,
            name: pos + 8,
            n_dims,
            dims,
            ty,
            offset: ty + 4,
            end: ty + 12,
        });
        pos = ty + 12;
    }
    let (header, _) = encode_header(metadata, tensors, alignment).unwrap();
    Layout {
        bytes,
        kv,
        tensors: infos,
        table_end: pos,
        data_offset: header.len(),
    }
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// The small valid file most malformed tests patch: three metadata entries (a string, a u32,
/// a string array) and three tensors (F32 matrix, Q8_0 row, F32 vector), alignment 32.
pub fn small_metadata() -> Vec<(String, MetaValue)> {
    vec![
        kv("general.architecture", MetaValue::String("llama".into())),
        kv("general.quantization_version", MetaValue::U32(2)),
        kv(
            "tokenizer.ggml.tokens",
            MetaValue::strings(["a", "bc", "def"]),
        ),
    ]
}

pub fn small_tensors() -> Vec<TensorSpec> {
    vec![
        tensor("token_embd.weight", &[8, 2], GgmlType::F32),
        tensor("blk.0.attn_q.weight", &[32, 1], GgmlType::Q8_0),
        tensor("blk.0.attn_norm.weight", &[4], GgmlType::F32),
    ]
}

pub fn small() -> Layout {
    layout(&small_metadata(), &small_tensors(), 32)
}

/// Every metadata value type, arrays of each (including empty ones), and arrays of arrays.
pub fn all_types_metadata() -> Vec<(String, MetaValue)> {
    use MetaValue as M;
    vec![
        kv("t.u8", M::U8(u8::MAX)),
        kv("t.i8", M::I8(i8::MIN)),
        kv("t.u16", M::U16(u16::MAX)),
        kv("t.i16", M::I16(i16::MIN)),
        kv("t.u32", M::U32(u32::MAX)),
        kv("t.i32", M::I32(i32::MIN)),
        kv("t.f32", M::F32(-1.5e-3)),
        kv("t.bool_true", M::Bool(true)),
        kv("t.bool_false", M::Bool(false)),
        kv("t.string", M::String("héllo wörld ✓".into())),
        kv("t.empty_string", M::String(String::new())),
        kv("t.u64", M::U64(u64::MAX)),
        kv("t.i64", M::I64(i64::MIN)),
        kv("t.f64", M::F64(std::f64::consts::PI)),
        kv("a.u8", M::Array(ValueType::U8, vec![M::U8(0), M::U8(255)])),
        kv("a.i8", M::Array(ValueType::I8, vec![M::I8(-1), M::I8(127)])),
        kv(
            "a.u16",
            M::Array(ValueType::U16, vec![M::U16(1), M::U16(65535)]),
        ),
        kv("a.i16", M::Array(ValueType::I16, vec![M::I16(-300)])),
        kv("a.u32", M::Array(ValueType::U32, vec![M::U32(7); 3])),
        kv(
            "a.i32",
            M::Array(ValueType::I32, vec![M::I32(-7), M::I32(0)]),
        ),
        kv(
            "a.f32",
            M::Array(ValueType::F32, vec![M::F32(0.5), M::F32(-2.0)]),
        ),
        kv(
            "a.bool",
            M::Array(ValueType::Bool, vec![M::Bool(true), M::Bool(false)]),
        ),
        kv("a.string", MetaValue::strings(["x", "", "yz"])),
        kv("a.u64", M::Array(ValueType::U64, vec![M::U64(u64::MAX)])),
        kv(
            "a.i64",
            M::Array(ValueType::I64, vec![M::I64(i64::MIN), M::I64(1)]),
        ),
        kv("a.f64", M::Array(ValueType::F64, vec![M::F64(1e300)])),
        kv("a.empty_u8", M::Array(ValueType::U8, vec![])),
        kv("a.empty_string", M::Array(ValueType::String, vec![])),
        kv("a.empty_array", M::Array(ValueType::Array, vec![])),
        kv(
            "a.array_of_string_arrays",
            M::Array(
                ValueType::Array,
                vec![
                    MetaValue::strings(["p", "q"]),
                    MetaValue::strings(Vec::<String>::new()),
                    MetaValue::strings(["r"]),
                ],
            ),
        ),
        kv(
            "a.array_of_mixed_arrays",
            M::Array(
                ValueType::Array,
                vec![
                    M::Array(ValueType::F32, vec![M::F32(1.0)]),
                    M::Array(ValueType::I64, vec![M::I64(-2), M::I64(3)]),
                    M::Array(
                        ValueType::Array,
                        vec![M::Array(ValueType::Bool, vec![M::Bool(true)])],
                    ),
                ],
            ),
        ),
    ]
}

/// An array nested `levels` deep: `levels` = 1 is `[u8]`, 2 is `[[u8]]`, ...
pub fn nested_array(levels: u32) -> MetaValue {
    let mut v = MetaValue::Array(ValueType::U8, vec![MetaValue::U8(42)]);
    for _ in 1..levels {
        v = MetaValue::Array(ValueType::Array, vec![v]);
    }
    v
}

/// A complete tiny `llama` model that `ModelConfig::from_gguf` accepts: 2 layers, n_embd 8,
/// 2 heads, 1 KV head, n_ff 16, a vocabulary of 8 tokens.
pub fn tiny_llama() -> (Vec<(String, MetaValue)>, Vec<TensorSpec>) {
    let metadata = vec![
        kv("general.architecture", MetaValue::String("llama".into())),
        kv("general.name", MetaValue::String("tiny".into())),
        kv("llama.block_count", MetaValue::U32(2)),
        kv("llama.context_length", MetaValue::U32(64)),
        kv("llama.embedding_length", MetaValue::U32(8)),
        kv("llama.feed_forward_length", MetaValue::U32(16)),
        kv("llama.attention.head_count", MetaValue::U32(2)),
        kv("llama.attention.head_count_kv", MetaValue::U32(1)),
        kv("llama.rope.dimension_count", MetaValue::U32(4)),
        kv("llama.rope.freq_base", MetaValue::F32(10_000.0)),
        kv(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        ),
        kv("tokenizer.ggml.model", MetaValue::String("llama".into())),
        kv(
            "tokenizer.ggml.tokens",
            MetaValue::strings(["<unk>", "<s>", "</s>", "a", "b", "ab", "▁a", "▁b"]),
        ),
        kv(
            "tokenizer.ggml.scores",
            MetaValue::Array(
                ValueType::F32,
                (0..8).map(|i| MetaValue::F32(-(i as f32))).collect(),
            ),
        ),
        kv(
            "tokenizer.ggml.token_type",
            MetaValue::Array(
                ValueType::I32,
                [2, 3, 3, 1, 1, 1, 1, 1].map(MetaValue::I32).to_vec(),
            ),
        ),
        kv("tokenizer.ggml.bos_token_id", MetaValue::U32(1)),
        kv("tokenizer.ggml.eos_token_id", MetaValue::U32(2)),
    ];
    let mut tensors = vec![
        tensor("token_embd.weight", &[8, 8], GgmlType::F32),
        tensor("output_norm.weight", &[8], GgmlType::F32),
        tensor("output.weight", &[8, 8], GgmlType::F32),
    ];
    for l in 0..2 {
        let t = |n: &str, dims: &[u64]| tensor(&format!("blk.{l}.{n}.weight"), dims, GgmlType::F32);
        tensors.extend([
            t("attn_norm", &[8]),
            t("attn_q", &[8, 8]),
            t("attn_k", &[8, 4]),
            t("attn_v", &[8, 4]),
            t("attn_output", &[8, 8]),
            t("ffn_norm", &[8]),
            t("ffn_gate", &[8, 16]),
            t("ffn_up", &[8, 16]),
            t("ffn_down", &[16, 8]),
        ]);
    }
    (metadata, tensors)
}

/// Replace (or append) a metadata entry.
pub fn set(metadata: &mut Vec<(String, MetaValue)>, key: &str, value: MetaValue) {
    match metadata.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value,
        None => metadata.push(kv(key, value)),
    }
}

/// Remove a metadata entry.
pub fn unset(metadata: &mut Vec<(String, MetaValue)>, key: &str) {
    metadata.retain(|(k, _)| k != key);
}
