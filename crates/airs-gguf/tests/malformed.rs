//! Malformed GGUF files: each must be refused with its own typed error, never a panic or a
//! huge allocation. Files are built with `airs_gguf::writer` and then, where the writer
//! cannot produce the defect, one field is patched at an offset located by
//! `common::layout`. Also the positive counterparts (round trips, v2, other alignments) and
//! the hyperparameter checks of `ModelConfig::from_gguf`.
mod common;

use std::time::{Duration, Instant};

use airs_gguf::writer::{MetaValue, TensorSpec};
use airs_gguf::{
    Architecture, GgmlType, Gguf, GgufError, GgufErrorKind as K, LayerMap, MAX_ARRAY_DEPTH,
    ModelConfig, RopeStyle, Value, ValueType,
};
use common::*;

/// Parse `bytes`, which must be refused, and check the error's kind against a pattern.
macro_rules! assert_err {
    ($bytes:expr, $pat:pat $(if $guard:expr)?) => {{
        let bytes: &[u8] = &$bytes;
        let err: GgufError = Gguf::parse(bytes).expect_err("malformed file was accepted");
        assert!(
            matches!(err.kind(), $pat $(if $guard)?),
            "wrong error: {err:?} ({err})"
        );
        if let Some(offset) = err.offset() {
            assert!(offset <= bytes.len() as u64, "error offset past the end: {err:?}");
        }
        err
    }};
}

/// `ModelConfig::from_gguf` on a file that parses, which must be refused.
macro_rules! assert_config_err {
    ($bytes:expr, $pat:pat $(if $guard:expr)?) => {{
        let bytes: Vec<u8> = $bytes;
        let g = Gguf::parse(&bytes).expect("the file itself is valid");
        let err = ModelConfig::from_gguf(&g).expect_err("bad hyperparameters were accepted");
        assert!(
            matches!(err.kind(), $pat $(if $guard)?),
            "wrong error: {err:?} ({err})"
        );
    }};
}

fn quick(f: impl FnOnce()) {
    let start = Instant::now();
    f();
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
}

fn repo_file(rel: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A file whose first entry is long enough that a cut anywhere after it passes the
/// count-versus-bytes-left check, so cuts inside later entries show their own errors.
fn padded_metadata() -> Layout {
    layout(
        &[
            kv("pad", MetaValue::String("x".repeat(100))),
            kv("general.name", MetaValue::String("tiny".into())),
            kv("some.u32", MetaValue::U32(7)),
            kv("some.strings", MetaValue::strings(["ab", "cd"])),
        ],
        &[],
        32,
    )
}

fn llama_bytes(edit: impl FnOnce(&mut Vec<(String, MetaValue)>, &mut Vec<TensorSpec>)) -> Vec<u8> {
    let (mut metadata, mut tensors) = tiny_llama();
    edit(&mut metadata, &mut tensors);
    build(&metadata, &tensors, 32)
}

// ---------------------------------------------------------------------------------------
// Truncation

fn assert_every_prefix_is_refused(name: &str, bytes: &[u8], upto: usize) {
    for len in 0..upto.min(bytes.len()) {
        match Gguf::parse(&bytes[..len]) {
            Ok(_) => panic!("{name}: prefix of {len} bytes was accepted"),
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        K::Truncated { .. }
                            | K::CountTooLarge { .. }
                            | K::StringTooLong { .. }
                            | K::TensorOutOfBounds { .. }
                    ),
                    "{name}: prefix of {len} bytes: {e:?}"
                );
                assert!(e.offset().is_none_or(|o| o <= len as u64), "{name}: {e:?}");
            }
        }
    }
}

#[test]
fn every_truncation_of_small_files_is_a_typed_error() {
    let (llama_kv, llama_t) = tiny_llama();
    let mut all = all_types_metadata();
    all.push(kv("general.alignment", MetaValue::U32(64)));
    all.push(kv("a.nested", nested_array(MAX_ARRAY_DEPTH)));
    let files = [
        ("small", small().bytes),
        ("tiny_llama", build(&llama_kv, &llama_t, 32)),
        (
            "all_types",
            build(&all, &[tensor("x", &[3], GgmlType::F32)], 64),
        ),
        ("padded_metadata", padded_metadata().bytes),
    ];
    for (name, bytes) in files {
        let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The writer puts no padding after the last tensor, so every shorter prefix lacks
        // data. (A file without tensors is complete at the end of its table.)
        let upto = if g.tensors().is_empty() {
            padded_metadata().table_end
        } else {
            bytes.len()
        };
        assert_every_prefix_is_refused(name, &bytes, upto);
    }
}

#[test]
fn every_truncation_of_the_stories260k_header_is_a_typed_error() {
    let bytes = repo_file("models/stories260K.gguf");
    let data_offset = Gguf::parse(&bytes).unwrap().data_offset() as usize;
    assert_every_prefix_is_refused("stories260K", &bytes, data_offset + 4096);
    // and a few cuts deep inside the tensor data
    for len in [bytes.len() / 2, bytes.len() - 1] {
        assert_err!(bytes[..len], K::TensorOutOfBounds { .. });
    }
}

#[test]
fn truncated_inside_the_fixed_header_is_a_typed_error() {
    let bytes = small().bytes;
    assert_err!(bytes[..0], K::Truncated { what: "magic" });
    assert_err!(bytes[..3], K::Truncated { what: "magic" });
    assert_err!(bytes[..6], K::Truncated { what: "version" });
    assert_err!(
        bytes[..12],
        K::Truncated {
            what: "tensor count"
        }
    );
    assert_err!(
        bytes[..20],
        K::Truncated {
            what: "metadata count"
        }
    );
}

#[test]
fn truncated_right_after_the_header_is_count_too_large() {
    // Three metadata entries cannot fit in zero bytes.
    let bytes = small().bytes;
    assert_err!(
        bytes[..HEADER_LEN],
        K::CountTooLarge {
            what: "metadata",
            count: 3
        }
    );
}

#[test]
fn truncated_inside_metadata_is_a_typed_error() {
    let l = padded_metadata();
    let b = &l.bytes;
    let (name, int, strings) = (l.kv[1], l.kv[2], l.kv[3]);
    assert_err!(
        b[..name.key_len + 5],
        K::Truncated {
            what: "string length"
        }
    );
    assert_err!(b[..name.key + 3], K::StringTooLong { len: 12 });
    assert_err!(
        b[..name.ty + 1],
        K::Truncated {
            what: "metadata value type"
        }
    );
    assert_err!(b[..name.value + 9], K::StringTooLong { len: 4 });
    assert_err!(b[..int.value + 3], K::Truncated { what: "u32" });
    assert_err!(
        b[..strings.value + 2],
        K::Truncated {
            what: "array element type"
        }
    );
    assert_err!(
        b[..strings.value + 6],
        K::Truncated {
            what: "array length"
        }
    );
    // two strings need at least 16 bytes
    assert_err!(
        b[..strings.value + 12 + 15],
        K::CountTooLarge {
            what: "array element",
            count: 2
        }
    );
    assert_err!(b[..strings.end - 1], K::StringTooLong { len: 2 });
}

#[test]
fn truncated_inside_tensor_table_is_a_typed_error() {
    let l = small();
    let b = &l.bytes;
    let t = &l.tensors[1];
    assert_err!(
        b[..t.name_len + 7],
        K::Truncated {
            what: "string length"
        }
    );
    assert_err!(b[..t.name + 4], K::StringTooLong { .. });
    assert_err!(
        b[..t.n_dims + 2],
        K::Truncated {
            what: "tensor dimension count"
        }
    );
    assert_err!(
        b[..t.dims[1] + 3],
        K::Truncated {
            what: "tensor dimension"
        }
    );
    assert_err!(
        b[..t.ty + 1],
        K::Truncated {
            what: "tensor type"
        }
    );
    assert_err!(
        b[..t.offset + 7],
        K::Truncated {
            what: "tensor offset"
        }
    );
}

#[test]
fn truncated_inside_tensor_data_is_tensor_out_of_bounds() {
    let l = small();
    let full = l.bytes.len();
    let err = assert_err!(l.bytes[..full - 1], K::TensorOutOfBounds { tensor, end, file_len }
        if tensor == "blk.0.attn_norm.weight" && *end == full as u64 && *file_len == full as u64 - 1);
    assert!(err.to_string().contains("blk.0.attn_norm.weight"));
    // cut in the padding between the tensor table and the data
    assert_err!(l.bytes[..l.table_end + 1], K::TensorOutOfBounds { tensor, .. }
        if tensor == "token_embd.weight");
}

// ---------------------------------------------------------------------------------------
// Header

#[test]
fn bad_magic_is_a_typed_error() {
    for magic in [*b"GGUX", *b"GGML", *b"ggjt", [0; 4], *b"FUGG"] {
        let mut b = small().bytes;
        b[..4].copy_from_slice(&magic);
        let err = assert_err!(b, K::BadMagic(m) if *m == magic);
        assert_eq!(err.offset(), Some(0));
    }
}

#[test]
fn versions_other_than_2_and_3_are_unsupported() {
    for version in [0, 1, 4, 0x100, u32::MAX] {
        let mut b = small().bytes;
        put_u32(&mut b, VERSION_AT, version);
        let err = assert_err!(b, K::UnsupportedVersion(v) if *v == version);
        assert_eq!(err.offset(), Some(VERSION_AT as u64));
    }
}

#[test]
fn byte_swapped_version_is_reported_as_big_endian() {
    for version in [2u32, 3] {
        let mut b = small().bytes;
        put_u32(&mut b, VERSION_AT, version.swap_bytes());
        assert_err!(b, K::BigEndian);
    }
}

#[test]
fn huge_metadata_count_is_count_too_large_without_allocating() {
    let l = small();
    let fits = (l.bytes.len() - HEADER_LEN) as u64 / 13;
    for n in [u64::MAX, 1 << 40, 1 << 32, fits + 1] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, KV_COUNT_AT, n);
        quick(|| {
            let err = assert_err!(b, K::CountTooLarge { what: "metadata", count } if *count == n);
            assert_eq!(err.offset(), Some(HEADER_LEN as u64));
        });
    }
}

#[test]
fn huge_tensor_count_is_count_too_large_without_allocating() {
    let l = small();
    let fits = (l.bytes.len() - HEADER_LEN) as u64 / 24;
    for n in [u64::MAX, 1 << 40, 1 << 32, fits + 1] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, TENSOR_COUNT_AT, n);
        quick(|| {
            assert_err!(b, K::CountTooLarge { what: "tensor", count } if *count == n);
        });
    }
}

#[test]
fn huge_array_length_is_count_too_large() {
    // a string array (elements of at least 8 bytes)
    let l = small();
    for n in [u64::MAX, 1 << 40] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, l.kv[2].value + 4, n);
        quick(|| {
            assert_err!(b, K::CountTooLarge { what: "array element", count } if *count == n);
        });
    }
    // a u64 array one element longer than the rest of the file can hold
    let l = layout(
        &[kv(
            "a",
            MetaValue::Array(ValueType::U64, vec![MetaValue::U64(1); 4]),
        )],
        &[],
        32,
    );
    let at = l.kv[0].value + 4;
    let fits = (l.bytes.len() - (at + 8)) as u64 / 8;
    let mut b = l.bytes.clone();
    put_u64(&mut b, at, fits + 1);
    assert_err!(b, K::CountTooLarge { what: "array element", count } if *count == fits + 1);
    // ... while exactly as many as fit is a valid (if odd) array
    put_u64(&mut b, at, fits);
    let g = Gguf::parse(&b).unwrap();
    assert_eq!(g.get_array("a").unwrap().len() as u64, fits);
}

#[test]
fn huge_string_length_is_string_too_long() {
    let l = small();
    let key = l.kv[0].key_len;
    let value = l.kv[0].value;
    let element = l.kv[2].value + 12;
    let name = l.tensors[0].name_len;
    for at in [key, value, element, name] {
        for len in [u64::MAX, 1 << 40, (l.bytes.len() - at - 8) as u64 + 1] {
            let mut b = l.bytes.clone();
            put_u64(&mut b, at, len);
            quick(|| {
                let err = assert_err!(b, K::StringTooLong { len: n } if *n == len);
                assert_eq!(err.offset(), Some(at as u64));
            });
        }
    }
}

#[test]
fn invalid_utf8_metadata_key_is_a_typed_error() {
    let l = small();
    let mut b = l.bytes.clone();
    b[l.kv[1].key + 3] = 0xFF;
    let err = assert_err!(
        b,
        K::InvalidUtf8 {
            what: "metadata key"
        }
    );
    assert_eq!(err.offset(), Some(l.kv[1].key_len as u64));
}

#[test]
fn invalid_utf8_tensor_name_is_a_typed_error() {
    let l = small();
    let mut b = l.bytes.clone();
    // a lone continuation byte, then a truncated multi-byte sequence
    for (i, byte) in [(0, 0x80), (5, 0xE2)] {
        b[l.tensors[2].name + i] = byte;
        assert_err!(
            b,
            K::InvalidUtf8 {
                what: "tensor name"
            }
        );
    }
}

#[test]
fn non_utf8_string_values_are_kept_as_raw_bytes() {
    // Values (vocabularies) may hold arbitrary bytes; only keys and names must be UTF-8.
    let l = small();
    let mut b = l.bytes.clone();
    b[l.kv[0].value + 8] = 0xFF; // "llama" -> "\xFFlama"
    b[l.kv[2].value + 12 + 8] = 0xC0; // "a" -> "\xC0"
    let g = Gguf::parse(&b).unwrap();
    let arch = g.get("general.architecture").unwrap();
    assert_eq!(arch, Value::String(b"\xFFlama"));
    assert_eq!(arch.as_str(), None);
    assert!(matches!(
        g.get_str("general.architecture").unwrap_err().kind(),
        K::WrongType {
            key,
            expected: "a UTF-8 string"
        } if key == "general.architecture"
    ));
    let tokens: Vec<&[u8]> = g
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .strings()
        .unwrap()
        .collect();
    assert_eq!(tokens, [&b"\xC0"[..], b"bc", b"def"]);
    // ModelConfig reports the architecture as mistyped, not as a panic
    assert!(matches!(
        ModelConfig::from_gguf(&g).unwrap_err().kind(),
        K::WrongType { .. }
    ));
}

#[test]
fn unknown_metadata_value_type_is_a_typed_error() {
    let l = small();
    for id in [13, 100, u32::MAX] {
        let mut b = l.bytes.clone();
        put_u32(&mut b, l.kv[1].ty, id);
        let err = assert_err!(b, K::UnknownValueType(t) if *t == id);
        assert_eq!(err.offset(), Some(l.kv[1].ty as u64));
    }
}

#[test]
fn unknown_array_element_type_is_a_typed_error() {
    let l = small();
    let mut b = l.bytes.clone();
    put_u32(&mut b, l.kv[2].value, 13);
    let err = assert_err!(b, K::UnknownValueType(13));
    assert_eq!(err.offset(), Some(l.kv[2].value as u64));
    // inside a nested array
    let l = layout(&[kv("n", nested_array(3))], &[], 32);
    let inner = l.kv[0].value + 12 + 12; // outer header, middle header, then the innermost
    assert_eq!(b"\x00\x00\x00\x00"[..], l.bytes[inner..inner + 4]); // U8
    let mut b = l.bytes.clone();
    put_u32(&mut b, inner, 77);
    assert_err!(b, K::UnknownValueType(77));
}

#[test]
fn arrays_nested_deeper_than_the_limit_are_rejected() {
    for levels in [MAX_ARRAY_DEPTH + 1, MAX_ARRAY_DEPTH + 2, 200] {
        let b = build(&[kv("deep", nested_array(levels))], &[], 32);
        quick(|| {
            assert_err!(b, K::NestingTooDeep);
        });
    }
    // A chain of array headers with no end, as a fuzzer would write it: each claims one
    // array element. Refused at the limit, not by exhausting the stack.
    let mut b = build(&[kv("deep", nested_array(1))], &[], 32);
    b.truncate(HEADER_LEN + 8 + 4 + 4); // through the key and the value type (array)
    for _ in 0..100_000 {
        b.extend_from_slice(&ValueType::Array.id().to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
    }
    assert_err!(b, K::NestingTooDeep);
}

#[test]
fn arrays_nested_to_the_limit_parse_and_iterate() {
    let b = build(&[kv("deep", nested_array(MAX_ARRAY_DEPTH))], &[], 32);
    let g = Gguf::parse(&b).unwrap();
    let mut value = g.get("deep").unwrap();
    for _ in 1..MAX_ARRAY_DEPTH {
        let a = value.as_array().unwrap();
        assert_eq!((a.elem_type(), a.len()), (ValueType::Array, 1));
        value = a.iter().next().unwrap();
    }
    let leaf = value.as_array().unwrap();
    assert_eq!(leaf.iter().collect::<Vec<_>>(), [Value::U8(42)]);
    assert_eq!(leaf.ints().unwrap().collect::<Vec<_>>(), [42]);
}

#[test]
fn array_of_arrays_of_strings_iterates_correctly() {
    let b = build(
        &[kv(
            "merges",
            MetaValue::Array(
                ValueType::Array,
                vec![
                    MetaValue::strings(["a", "b"]),
                    MetaValue::strings(Vec::<String>::new()),
                    MetaValue::strings(["ccc", "", "dd"]),
                ],
            ),
        )],
        &[],
        32,
    );
    let g = Gguf::parse(&b).unwrap();
    let outer = g.get_array("merges").unwrap();
    assert_eq!((outer.elem_type(), outer.len()), (ValueType::Array, 3));
    assert!(outer.strings().is_none());
    let inner: Vec<Vec<&[u8]>> = outer
        .iter()
        .map(|v| v.as_array().unwrap().strings().unwrap().collect())
        .collect();
    let expected: Vec<Vec<&[u8]>> = vec![vec![b"a", b"b"], vec![], vec![b"ccc", b"", b"dd"]];
    assert_eq!(inner, expected);
}

#[test]
fn duplicate_metadata_key_is_a_typed_error() {
    let b = build(
        &[
            kv("general.name", MetaValue::String("a".into())),
            kv("general.other", MetaValue::U8(1)),
            kv("general.name", MetaValue::U32(2)),
        ],
        &[],
        32,
    );
    assert_err!(b, K::DuplicateKey(k) if k == "general.name");
}

#[test]
fn bad_alignment_is_a_typed_error() {
    for a in [0u32, 3, 48, 1 << 31] {
        let b = build(
            &[kv("general.alignment", MetaValue::U32(a))],
            &[tensor("t", &[4], GgmlType::F32)],
            32,
        );
        assert_err!(b, K::BadAlignment(x) if *x == u64::from(a));
    }
    let not_u32 = [
        (MetaValue::U64(32), "a u32"),
        (MetaValue::I32(32), "a u32"),
        (MetaValue::U8(32), "a u32"),
        (MetaValue::String("32".into()), "an integer"),
        (MetaValue::F32(32.0), "an integer"),
    ];
    for (value, what) in not_u32 {
        let b = build(&[kv("general.alignment", value)], &[], 32);
        assert_err!(b, K::WrongType { key, expected } if key == "general.alignment" && *expected == what);
    }
}

// ---------------------------------------------------------------------------------------
// Tensor table

#[test]
fn more_than_four_dims_is_too_many_dims() {
    let b = build(&[], &[tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32)], 32);
    assert_err!(b, K::TooManyDims { tensor, dims: 5 } if tensor == "t");
    // a dimension count that would be a huge allocation if trusted
    let l = small();
    let mut b = l.bytes.clone();
    put_u32(&mut b, l.tensors[0].n_dims, u32::MAX);
    quick(|| {
        assert_err!(b, K::TooManyDims { dims: u32::MAX, .. });
    });
}

#[test]
fn zero_dimension_is_a_bad_shape() {
    let b = build(&[], &[tensor("t", &[4, 0], GgmlType::F32)], 32);
    assert_err!(b, K::BadShape { tensor } if tensor == "t");
    let l = small();
    let mut b = l.bytes.clone();
    put_u64(&mut b, l.tensors[0].dims[0], 0);
    assert_err!(b, K::BadShape { tensor } if tensor == "token_embd.weight");
}

#[test]
fn dims_whose_product_overflows_are_a_bad_shape() {
    let l = small();
    let at = &l.tensors[0].dims;
    for (d0, d1) in [(1 << 32, 1 << 32), (u64::MAX, 2), (3, u64::MAX / 2)] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, at[0], d0);
        put_u64(&mut b, at[1], d1);
        assert_err!(b, K::BadShape { tensor } if tensor == "token_embd.weight");
    }
    // elements fit in u64 but their bytes do not (2^62 f32 = 2^64 bytes)
    let mut b = l.bytes.clone();
    put_u64(&mut b, at[0], 1 << 62);
    put_u64(&mut b, at[1], 1);
    assert_err!(b, K::BadShape { .. });
    // and the writer refuses such a shape with an error, not an overflow panic
    let spec = tensor("t", &[1 << 32, 1 << 32], GgmlType::F32);
    assert!(spec.bytes().is_err());
    assert!(airs_gguf::writer::encode_header(&[], &[spec], 32).is_err());
}

#[test]
fn row_length_not_a_multiple_of_the_block_length_is_a_bad_shape() {
    // 16 × 2 = 32 elements is one whole Q8_0 block, but a row of 16 is half a block.
    let b = build(&[], &[tensor("q", &[16, 2], GgmlType::Q8_0)], 32);
    assert_err!(b, K::BadShape { tensor } if tensor == "q");
    let b = build(&[], &[tensor("k", &[128, 2], GgmlType::Q4K)], 32);
    assert_err!(b, K::BadShape { tensor } if tensor == "k");
    let l = small();
    let mut b = l.bytes.clone();
    put_u64(&mut b, l.tensors[1].dims[0], 33);
    assert_err!(b, K::BadShape { tensor } if tensor == "blk.0.attn_q.weight");
}

#[test]
fn unknown_tensor_type_ids_are_a_typed_error() {
    let l = small();
    for id in [4, 5, 31, 32, 33, 36, 1000, u32::MAX] {
        let mut b = l.bytes.clone();
        put_u32(&mut b, l.tensors[1].ty, id);
        assert_err!(b, K::UnknownTensorType { tensor, id: i }
            if tensor == "blk.0.attn_q.weight" && *i == id);
    }
}

#[test]
fn duplicate_tensor_names_are_a_typed_error() {
    let b = build(
        &[],
        &[
            tensor("w", &[4], GgmlType::F32),
            tensor("x", &[4], GgmlType::F32),
            tensor("w", &[8], GgmlType::F32),
        ],
        32,
    );
    assert_err!(b, K::DuplicateTensor(t) if t == "w");
}

#[test]
fn misaligned_tensor_offset_is_a_typed_error() {
    let l = small();
    let at = l.tensors[1].offset;
    let original = get_u64(&l.bytes, at);
    for offset in [original + 1, original + 16, 1, u64::MAX] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, at, offset);
        assert_err!(b, K::MisalignedTensor { tensor, offset: o }
            if tensor == "blk.0.attn_q.weight" && *o == offset);
    }
}

#[test]
fn tensor_data_past_the_end_is_out_of_bounds() {
    let l = small();
    let at = l.tensors[2].offset;
    let original = get_u64(&l.bytes, at);
    let len = l.bytes.len() as u64;
    for offset in [original + 32, original + 4096, 1 << 40] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, at, offset);
        assert_err!(b, K::TensorOutOfBounds { tensor, end, file_len }
            if tensor == "blk.0.attn_norm.weight"
                && *end == l.data_offset as u64 + offset + 16
                && *file_len == len);
    }
    // a tensor that ends exactly at the end of the file is fine
    assert_eq!(l.data_offset as u64 + original + 16, len);
    Gguf::parse(&l.bytes).unwrap();
}

#[test]
fn tensor_offset_plus_size_overflow_is_out_of_bounds() {
    let l = small();
    // data offset + tensor offset overflows; then only adding the tensor's 64 bytes does
    let barely = (u64::MAX - l.data_offset as u64) & !31;
    let top: u64 = !31; // the largest 32-aligned offset
    for offset in [top, top - 64, barely] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, l.tensors[0].offset, offset);
        assert_err!(b, K::TensorOutOfBounds { tensor, end: u64::MAX, .. }
            if tensor == "token_embd.weight");
    }
}

#[test]
fn overlapping_tensors_are_a_typed_error() {
    let l = small();
    // token_embd.weight occupies [0, 64); put the Q8_0 tensor at 0 and at 32
    for offset in [0, 32] {
        let mut b = l.bytes.clone();
        put_u64(&mut b, l.tensors[1].offset, offset);
        assert_err!(b, K::OverlappingTensors { first, second }
            if [first.as_str(), second.as_str()].contains(&"token_embd.weight")
                && [first.as_str(), second.as_str()].contains(&"blk.0.attn_q.weight"));
    }
    // the 16-byte third tensor inside the 34-byte second one
    let mut b = l.bytes.clone();
    let second = get_u64(&b, l.tensors[1].offset);
    put_u64(&mut b, l.tensors[2].offset, second);
    assert_err!(b, K::OverlappingTensors { first, second }
        if first == "blk.0.attn_norm.weight" && second == "blk.0.attn_q.weight");
}

#[test]
fn back_to_back_tensors_with_alignment_one_are_not_overlapping() {
    let b = build(
        &[kv("general.alignment", MetaValue::U32(1))],
        &[
            tensor("a", &[1], GgmlType::F32),
            tensor("b", &[3], GgmlType::I8),
            tensor("c", &[1], GgmlType::F64),
        ],
        1,
    );
    let g = Gguf::parse(&b).unwrap();
    let ranges: Vec<_> = g.tensors().iter().map(|t| t.byte_range()).collect();
    assert_eq!(ranges[0].end, ranges[1].start);
    assert_eq!(ranges[1].end, ranges[2].start);
    assert_eq!(ranges[2].end, b.len() as u64);
}

#[test]
fn zero_dimension_tensor_is_a_scalar() {
    let b = build(&[], &[tensor("s", &[], GgmlType::F32)], 32);
    let g = Gguf::parse(&b).unwrap();
    let s = g.tensor("s").unwrap();
    assert_eq!((s.elements(), s.bytes, s.row_len(), s.rows()), (1, 4, 1, 1));
}

// ---------------------------------------------------------------------------------------
// Positive counterparts

fn owned(v: &Value<'_>) -> MetaValue {
    match *v {
        Value::U8(x) => MetaValue::U8(x),
        Value::I8(x) => MetaValue::I8(x),
        Value::U16(x) => MetaValue::U16(x),
        Value::I16(x) => MetaValue::I16(x),
        Value::U32(x) => MetaValue::U32(x),
        Value::I32(x) => MetaValue::I32(x),
        Value::F32(x) => MetaValue::F32(x),
        Value::Bool(x) => MetaValue::Bool(x),
        Value::String(s) => MetaValue::String(String::from_utf8(s.to_vec()).unwrap()),
        Value::Array(a) => MetaValue::Array(a.elem_type(), a.iter().map(|e| owned(&e)).collect()),
        Value::U64(x) => MetaValue::U64(x),
        Value::I64(x) => MetaValue::I64(x),
        Value::F64(x) => MetaValue::F64(x),
    }
}

#[test]
fn every_metadata_value_type_round_trips_through_writer_and_reader() {
    let metadata = all_types_metadata();
    let b = build(&metadata, &[], 32);
    let g = Gguf::parse(&b).unwrap();
    let read: Vec<(String, MetaValue)> = g
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), owned(v)))
        .collect();
    assert_eq!(read, metadata);
    for (key, value) in &metadata {
        let v = g.get(key).unwrap();
        assert_eq!(v.value_type(), value.value_type(), "{key}");
        // every array is walkable with the typed helpers too
        if let Some(a) = v.as_array() {
            assert_eq!(a.iter().count(), a.len(), "{key}");
            if let Some(s) = a.strings() {
                assert_eq!(s.count(), a.len());
            }
            if let Some(f) = a.f32s() {
                assert_eq!(f.count(), a.len());
            }
        }
    }
    assert_eq!(g.get_u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.get("t.i8").unwrap().as_i64(), Some(-128));
    assert_eq!(g.get("t.i8").unwrap().as_u64(), None);
    assert_eq!(g.get_str("t.string").unwrap(), "héllo wörld ✓");
    assert_eq!(g.get_f64("t.f64").unwrap(), std::f64::consts::PI);
    assert_eq!(g.get("t.bool_true").unwrap().as_bool(), Some(true));
    let f32s: Vec<f32> = g.get_array("a.f32").unwrap().f32s().unwrap().collect();
    assert_eq!(f32s, [0.5, -2.0]);
    let ints: Vec<i64> = g.get_array("a.i64").unwrap().ints().unwrap().collect();
    assert_eq!(ints, [i64::MIN, 1]);
    assert!(matches!(
        g.get_u64("t.string").unwrap_err().kind(),
        K::WrongType { key, .. } if key == "t.string"
    ));
    assert!(matches!(
        g.get_u64("absent").unwrap_err().kind(),
        K::MissingKey(k) if k == "absent"
    ));
}

#[test]
fn tensor_data_round_trips() {
    let l = small();
    let g = Gguf::parse(&l.bytes).unwrap();
    assert_eq!(g.data_offset() as usize, l.data_offset);
    for (i, (t, spec)) in g.tensors().iter().zip(small_tensors()).enumerate() {
        assert_eq!(
            (t.name, &t.dims, t.ty),
            (spec.name.as_str(), &spec.dims, spec.ty)
        );
        let data = g.tensor_data(t);
        assert_eq!(data.len() as u64, spec.bytes().unwrap());
        assert!(data.iter().enumerate().all(|(j, &x)| x == fill_byte(i, j)));
    }
    let map = LayerMap::new(&g);
    assert_eq!(map.layers.len(), 1);
    assert_eq!(map.layers[0].tensors, [1, 2]);
    assert_eq!(map.other, [0]);
}

#[test]
fn version_2_files_parse() {
    let l = small();
    let mut b = l.bytes.clone();
    put_u32(&mut b, VERSION_AT, 2);
    let v2 = Gguf::parse(&b).unwrap();
    let v3 = Gguf::parse(&l.bytes).unwrap();
    assert_eq!((v2.version(), v3.version()), (2, 3));
    assert_eq!(v2.metadata(), v3.metadata());
    assert_eq!(v2.tensors(), v3.tensors());
}

#[test]
fn general_alignment_64_is_honoured_for_the_data_offset() {
    // Grow a string until the table ends 1..=32 bytes past a multiple of 64, where aligning
    // to 32 and to 64 give different data offsets.
    for pad in 0..64 {
        let metadata = vec![
            kv("general.alignment", MetaValue::U32(64)),
            kv("pad", MetaValue::String("x".repeat(pad))),
        ];
        let tensors = [
            tensor("a", &[3], GgmlType::F32),
            tensor("b", &[5], GgmlType::F32),
        ];
        let l = layout(&metadata, &tensors, 64);
        if !(1..=32).contains(&(l.table_end % 64)) {
            continue;
        }
        let g = Gguf::parse(&l.bytes).unwrap();
        assert_eq!(g.alignment(), 64);
        assert_eq!(g.data_offset() as usize, l.table_end.next_multiple_of(64));
        assert_ne!(g.data_offset() as usize, l.table_end.next_multiple_of(32));
        let b = g.tensor("b").unwrap();
        assert_eq!(b.offset, g.data_offset() + 64);
        assert_eq!(g.tensor_data(b)[0], fill_byte(1, 0));
        // The same header read with the default alignment would misplace the data.
        let mut wrong = l.bytes.clone();
        put_u32(&mut wrong, l.kv[0].value, 32);
        let g32 = Gguf::parse(&wrong).unwrap();
        assert_ne!(g32.data_offset(), g.data_offset());
        return;
    }
    panic!("no padding put the table end where the alignments differ");
}

// ---------------------------------------------------------------------------------------
// Hyperparameters (ModelConfig::from_gguf)

#[test]
fn tiny_llama_and_qwen2_configs_are_read() {
    let g_bytes = llama_bytes(|_, _| {});
    let g = Gguf::parse(&g_bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(cfg.arch, Architecture::Llama);
    assert_eq!(
        (
            cfg.layers,
            cfg.embedding_len,
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim
        ),
        (2, 8, 2, 1, 4)
    );
    assert_eq!(
        (cfg.ff_len, cfg.vocab_len, cfg.context_len, cfg.rope_dims),
        (16, 8, 64, 4)
    );
    assert!(!cfg.tied_output && !cfg.qkv_bias);

    let qwen = llama_bytes(|m, t| {
        for (k, _) in m.iter_mut() {
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("qwen2.{rest}");
            }
        }
        set(m, "general.architecture", MetaValue::String("qwen2".into()));
        t.retain(|t| t.name != "output.weight");
        t.push(tensor("blk.0.attn_q.bias", &[8], GgmlType::F32));
    });
    let g = Gguf::parse(&qwen).unwrap();
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(cfg.arch, Architecture::Qwen2);
    assert_eq!(cfg.rope_style, RopeStyle::Neox);
    assert!(cfg.tied_output && cfg.qkv_bias);
}

#[test]
fn unsupported_architecture_is_a_typed_error() {
    for arch in ["gpt2", "LLAMA", "", "llama "] {
        assert_config_err!(
            llama_bytes(|m, _| set(m, "general.architecture", MetaValue::String(arch.into()))),
            K::UnsupportedArchitecture(a) if a == arch
        );
    }
}

#[test]
fn missing_hyperparameter_key_is_a_typed_error() {
    for key in [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.feed_forward_length",
    ] {
        assert_config_err!(
            llama_bytes(|m, _| unset(m, key)),
            K::MissingKey(k) if k == key
        );
    }
    // optional keys have defaults
    let b = llama_bytes(|m, _| {
        for key in [
            "llama.context_length",
            "llama.attention.head_count_kv",
            "llama.rope.dimension_count",
            "llama.rope.freq_base",
            "llama.attention.layer_norm_rms_epsilon",
        ] {
            unset(m, key);
        }
    });
    let cfg = ModelConfig::from_gguf(&Gguf::parse(&b).unwrap()).unwrap();
    assert_eq!((cfg.context_len, cfg.kv_heads, cfg.rope_dims), (2048, 2, 4));
    assert_eq!((cfg.rope_base, cfg.rms_eps), (10_000.0, 1e-5));
}

#[test]
fn wrongly_typed_hyperparameter_is_a_typed_error() {
    let cases = [
        ("general.architecture", MetaValue::U32(1)),
        ("llama.embedding_length", MetaValue::String("8".into())),
        ("llama.embedding_length", MetaValue::F32(8.0)),
        ("llama.block_count", MetaValue::I32(-2)),
        ("llama.attention.head_count", MetaValue::strings(["2"])),
        ("llama.context_length", MetaValue::Bool(true)),
        ("llama.rope.freq_base", MetaValue::U32(10_000)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::String("x".into()),
        ),
    ];
    for (key, value) in cases {
        assert_config_err!(
            llama_bytes(|m, _| set(m, key, value)),
            K::WrongType { key: k, .. } if k == key
        );
    }
}

#[test]
fn heads_not_dividing_the_embedding_are_a_bad_hyperparameter() {
    assert_config_err!(
        llama_bytes(|m, _| set(m, "llama.attention.head_count", MetaValue::U32(3))),
        K::BadHyperparameter { key, .. } if key == "llama.attention.head_count"
    );
    assert_config_err!(
        llama_bytes(|m, _| set(m, "llama.attention.head_count_kv", MetaValue::U32(3))),
        K::BadHyperparameter { key, .. } if key == "llama.attention.head_count_kv"
    );
}

#[test]
fn zero_or_huge_counts_are_a_bad_hyperparameter() {
    for (key, value) in [
        ("llama.attention.head_count", 0),
        ("llama.attention.head_count_kv", 0),
        ("llama.block_count", 0),
        ("llama.embedding_length", 0),
        ("llama.feed_forward_length", u64::MAX),
        ("llama.context_length", 1 << 40),
    ] {
        assert_config_err!(
            llama_bytes(|m, _| set(m, key, MetaValue::U64(value))),
            K::BadHyperparameter { key: k, .. } if k == key
        );
    }
}

#[test]
fn impossible_rope_and_norm_settings_are_a_bad_hyperparameter() {
    let cases = [
        ("llama.rope.dimension_count", MetaValue::U32(3)),
        ("llama.rope.dimension_count", MetaValue::U32(8)),
        ("llama.attention.key_length", MetaValue::U32(5)),
        ("llama.rope.freq_base", MetaValue::F32(0.0)),
        ("llama.rope.freq_base", MetaValue::F32(f32::NAN)),
        ("llama.rope.freq_base", MetaValue::F64(1e300)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(-1.0),
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::INFINITY),
        ),
    ];
    for (key, value) in cases {
        assert_config_err!(
            llama_bytes(|m, _| set(m, key, value)),
            K::BadHyperparameter { key: k, .. } if k == key
        );
    }
}

#[test]
fn missing_or_misshapen_embedding_tensor_is_a_bad_tensor() {
    assert_config_err!(
        llama_bytes(|_, t| t.retain(|t| t.name != "token_embd.weight")),
        K::BadTensor { tensor, .. } if tensor == "token_embd.weight"
    );
    for dims in [&[16, 8][..], &[8, 8, 1], &[64]] {
        assert_config_err!(
            llama_bytes(|_, t| t[0].dims = dims.to_vec()),
            K::BadTensor { tensor, .. } if tensor == "token_embd.weight"
        );
    }
}
