//! Malformed tokenizer metadata gives typed errors, never panics. The files are built in
//! memory with airs-gguf's writer.

use airs_gguf::Gguf;
use airs_gguf::ValueType;
use airs_gguf::writer::{MetaValue, encode_header};
use airs_tokenizer::{
    EncodeOptions, ModelKind, PreTokenizerKind, TokenId, Tokenizer, TokenizerError,
    TokenizerErrorKind,
};
use proptest::prelude::*;

type Meta = Vec<(String, MetaValue)>;

fn build(meta: &Meta) -> Result<Tokenizer, TokenizerError> {
    let (bytes, _) = encode_header(meta, &[], 32).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    Tokenizer::from_gguf(&gguf)
}

fn kind(meta: &Meta) -> TokenizerErrorKind {
    build(meta).expect_err("should be rejected").kind().clone()
}

fn set(meta: &mut Meta, key: &str, value: MetaValue) {
    meta.retain(|(k, _)| k != key);
    meta.push((key.to_owned(), value));
}

fn remove(meta: &mut Meta, key: &str) {
    meta.retain(|(k, _)| k != key);
}

fn f32s(values: &[f32]) -> MetaValue {
    MetaValue::Array(
        ValueType::F32,
        values.iter().map(|&v| MetaValue::F32(v)).collect(),
    )
}

fn i32s(values: &[i32]) -> MetaValue {
    MetaValue::Array(
        ValueType::I32,
        values.iter().map(|&v| MetaValue::I32(v)).collect(),
    )
}

/// A tiny valid SentencePiece vocabulary.
fn spm_meta() -> Meta {
    let tokens = ["<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁ab"];
    vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("llama".into()),
        ),
        ("tokenizer.ggml.tokens".into(), MetaValue::strings(tokens)),
        (
            "tokenizer.ggml.scores".into(),
            f32s(&[0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0]),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            i32s(&[2, 3, 3, 1, 1, 1, 1, 1]),
        ),
    ]
}

/// A tiny valid byte-level BPE vocabulary ("Ġ" is the space byte).
fn bpe_meta() -> Meta {
    let tokens = ["a", "b", "Ġ", "ab", "Ġab", "<|endoftext|>"];
    vec![
        (
            "tokenizer.ggml.model".into(),
            MetaValue::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".into(),
            MetaValue::String("gpt-2".into()),
        ),
        ("tokenizer.ggml.tokens".into(), MetaValue::strings(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            i32s(&[1, 1, 1, 1, 1, 3]),
        ),
        (
            "tokenizer.ggml.merges".into(),
            MetaValue::strings(["a b", "Ġ ab"]),
        ),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(5)),
    ]
}

#[test]
fn the_tiny_vocabularies_work() {
    let spm = build(&spm_meta()).unwrap();
    assert_eq!(spm.model_kind(), ModelKind::SentencePiece);
    assert_eq!(spm.pre_kind(), None);
    assert!(spm.add_bos());
    assert_eq!(spm.bos_id(), Some(TokenId(1)));
    let ids = spm.encode("ab ab", EncodeOptions::prompt(&spm));
    assert_eq!(ids, [TokenId(1), TokenId(7), TokenId(7)]);
    assert_eq!(spm.decode(&ids), "ab ab");

    let bpe = build(&bpe_meta()).unwrap();
    assert_eq!(bpe.model_kind(), ModelKind::ByteLevelBpe);
    assert_eq!(bpe.pre_kind(), Some(PreTokenizerKind::Gpt2));
    assert!(!bpe.add_bos());
    assert_eq!(bpe.bos_id(), None);
    assert_eq!(bpe.merge_count(), 2);
    let ids = bpe.encode("ab ab<|endoftext|>", EncodeOptions::prompt(&bpe));
    assert_eq!(ids, [TokenId(3), TokenId(4), TokenId(5)]);
    assert!(bpe.is_end_of_generation(TokenId(5)));
    // A character the vocabulary cannot spell is dropped, as llama.cpp does.
    assert_eq!(bpe.encode("ac", EncodeOptions::default()), [TokenId(0)]);
}

#[test]
fn missing_and_mistyped_keys() {
    let mut m = spm_meta();
    remove(&mut m, "tokenizer.ggml.model");
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::MissingKey("tokenizer.ggml.model")
    );

    let mut m = spm_meta();
    set(
        &mut m,
        "tokenizer.ggml.model",
        MetaValue::String("bert".into()),
    );
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::UnsupportedModel("bert".into())
    );

    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.model", MetaValue::U32(1));
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::WrongType {
            key: "tokenizer.ggml.model",
            ..
        }
    ));

    let mut m = spm_meta();
    remove(&mut m, "tokenizer.ggml.tokens");
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::MissingKey("tokenizer.ggml.tokens")
    );

    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.tokens", i32s(&[1, 2, 3]));
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::WrongType {
            key: "tokenizer.ggml.tokens",
            ..
        }
    ));

    let mut m = spm_meta();
    set(
        &mut m,
        "tokenizer.ggml.scores",
        MetaValue::strings(["x"; 8]),
    );
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::WrongType {
            key: "tokenizer.ggml.scores",
            ..
        }
    ));

    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.add_bos_token", MetaValue::U8(1));
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::WrongType {
            key: "tokenizer.ggml.add_bos_token",
            ..
        }
    ));

    let mut m = bpe_meta();
    remove(&mut m, "tokenizer.ggml.merges");
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::MissingKey("tokenizer.ggml.merges")
    );

    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.pre",
        MetaValue::String("klingon".into()),
    );
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::UnknownPreTokenizer("klingon".into())
    );
    let message = build(&m).unwrap_err().to_string();
    assert!(
        message.contains("klingon") && message.contains("qwen2"),
        "{message}"
    );

    // No pre-tokenizer key: llama.cpp's `default`.
    let mut m = bpe_meta();
    remove(&mut m, "tokenizer.ggml.pre");
    assert_eq!(
        build(&m).unwrap().pre_kind(),
        Some(PreTokenizerKind::Default)
    );
}

#[test]
fn per_token_arrays_must_match_the_token_list() {
    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.scores", f32s(&[0.0; 7]));
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::LengthMismatch {
            key: "tokenizer.ggml.scores",
            len: 7,
            vocab_len: 8
        }
    );

    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.token_type", i32s(&[1; 9]));
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::LengthMismatch {
            key: "tokenizer.ggml.token_type",
            len: 9,
            vocab_len: 8
        }
    );
}

#[test]
fn bad_token_lists() {
    let mut m = spm_meta();
    set(
        &mut m,
        "tokenizer.ggml.tokens",
        MetaValue::strings(Vec::<String>::new()),
    );
    set(&mut m, "tokenizer.ggml.scores", f32s(&[]));
    set(&mut m, "tokenizer.ggml.token_type", i32s(&[]));
    assert_eq!(kind(&m), TokenizerErrorKind::EmptyVocabulary);

    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.tokens",
        MetaValue::strings(["a", "b", "a", "ab", "Ġab", "x"]),
    );
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::DuplicateToken {
            first: 0,
            second: 2,
            ..
        }
    ));

    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.tokens",
        MetaValue::strings(["a", "b", "", "ab", "Ġab", "x"]),
    );
    assert_eq!(kind(&m), TokenizerErrorKind::InvalidTokenText { id: 2 });
}

#[test]
fn special_ids_must_be_in_the_vocabulary() {
    let mut m = spm_meta();
    set(&mut m, "tokenizer.ggml.bos_token_id", MetaValue::U32(8));
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::SpecialIdOutOfRange {
            key: "tokenizer.ggml.bos_token_id",
            id: 8,
            vocab_len: 8
        }
    );

    let mut m = bpe_meta();
    set(&mut m, "tokenizer.ggml.eos_token_id", MetaValue::I32(-7));
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::SpecialIdOutOfRange { id: -7, .. }
    ));

    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.eos_token_id",
        MetaValue::U64(u64::MAX),
    );
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::SpecialIdOutOfRange { .. }
    ));

    // u32::MAX and -1 are how converters write "no such token" (stories260K does).
    let mut m = spm_meta();
    set(
        &mut m,
        "tokenizer.ggml.eos_token_id",
        MetaValue::U32(u32::MAX),
    );
    set(
        &mut m,
        "tokenizer.ggml.unknown_token_id",
        MetaValue::I32(-1),
    );
    let t = build(&m).unwrap();
    assert_eq!((t.eos_id(), t.unk_id()), (None, None));

    // add_bos_token without a BOS token.
    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.add_bos_token",
        MetaValue::Bool(true),
    );
    assert_eq!(kind(&m), TokenizerErrorKind::MissingBos);
}

#[test]
fn bad_merges() {
    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.merges",
        MetaValue::strings(["a b", "Ġ zz"]),
    );
    assert_eq!(
        kind(&m),
        TokenizerErrorKind::MergeUnknownToken {
            rank: 1,
            text: "Ġ zz".into(),
            part: "zz".into()
        }
    );

    for bad in ["ab", "a ", " b", ""] {
        let mut m = bpe_meta();
        set(
            &mut m,
            "tokenizer.ggml.merges",
            MetaValue::strings(["a b", bad]),
        );
        assert_eq!(
            kind(&m),
            TokenizerErrorKind::MalformedMerge {
                rank: 1,
                text: bad.into()
            },
            "{bad:?}"
        );
    }

    let mut m = bpe_meta();
    set(&mut m, "tokenizer.ggml.merges", i32s(&[1]));
    assert!(matches!(
        kind(&m),
        TokenizerErrorKind::WrongType {
            key: "tokenizer.ggml.merges",
            ..
        }
    ));

    // A rule whose result is not a token is skipped, not an error.
    let mut m = bpe_meta();
    set(
        &mut m,
        "tokenizer.ggml.merges",
        MetaValue::strings(["a b", "b a"]),
    );
    let t = build(&m).unwrap();
    assert_eq!((t.merge_count(), t.skipped_merge_count()), (1, 1));
}

fn arbitrary_meta() -> impl Strategy<Value = Meta> {
    let texts = prop::collection::vec("[ab Ġ▁<>|s/0-9xA-F]{0,4}", 0..12);
    (
        any::<bool>(),
        texts,
        prop::collection::vec("[ab Ġ]{0,5}", 0..8),
        prop::collection::vec(-3i32..8, 0..14),
        prop::option::of(-2i64..16),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(spm, tokens, merges, types, bos, add_bos)| {
            let n = tokens.len();
            let mut meta: Meta = vec![
                (
                    "tokenizer.ggml.model".into(),
                    MetaValue::String(if spm { "llama" } else { "gpt2" }.into()),
                ),
                ("tokenizer.ggml.tokens".into(), MetaValue::strings(tokens)),
                ("tokenizer.ggml.merges".into(), MetaValue::strings(merges)),
                (
                    "tokenizer.ggml.scores".into(),
                    f32s(&(0..n).map(|i| -(i as f32)).collect::<Vec<_>>()),
                ),
            ];
            // Sometimes of the right length, sometimes not.
            let types: Vec<i32> = if types.len() % 3 == 0 {
                types
            } else {
                types.into_iter().cycle().take(n).collect()
            };
            meta.push(("tokenizer.ggml.token_type".into(), i32s(&types)));
            if let Some(bos) = bos {
                meta.push(("tokenizer.ggml.bos_token_id".into(), MetaValue::I64(bos)));
            }
            if let Some(add) = add_bos {
                meta.push(("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(add)));
            }
            meta
        })
}

proptest! {
    /// Whatever the metadata, building either fails with an error or gives a tokenizer that
    /// encodes and decodes arbitrary text without panicking.
    #[test]
    fn arbitrary_metadata_never_panics(meta in arbitrary_meta(), text in "[ab Ġ<>|s/\\n😀é]{0,16}") {
        if let Ok(t) = build(&meta) {
            for parse_special in [false, true] {
                let ids = t.encode(&text, EncodeOptions { add_bos: t.add_bos(), parse_special });
                prop_assert!(ids.iter().all(|id| id.index() < t.vocab_len()));
                let _ = t.decode(&ids);
            }
        }
    }
}
