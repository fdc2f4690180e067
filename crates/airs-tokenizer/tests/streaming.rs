//! Streaming decoding: characters split across tokens (byte-fallback tokens in SentencePiece,
//! byte-level pieces in GPT-2 BPE) are held back until complete, and what a stream emits
//! always adds up to `Tokenizer::decode` of the same ids (before the space clean-up that
//! whole-text decoding applies for BPE vocabularies that ask for it, as llama.cpp's
//! `llama_detokenize` does and its streaming `token_to_piece` does not).

use std::path::PathBuf;
use std::sync::OnceLock;

use airs_gguf::Gguf;
use airs_tokenizer::{
    EncodeOptions, StreamDecoder, TokenId, Tokenizer, clean_up_tokenization_spaces,
};

fn load(name: &str) -> Tokenizer {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tokenizer")
        .join(name);
    let bytes = std::fs::read(path).unwrap();
    Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap()
}

fn spm() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("ggml-vocab-llama-spm.gguf"))
}

fn gpt2() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| load("ggml-vocab-gpt-2.gguf"))
}

const PLAIN: EncodeOptions = EncodeOptions {
    add_bos: false,
    parse_special: false,
};

/// Feed `ids` one at a time, returning what each push emitted and the final flush.
fn stream(
    tokenizer: &Tokenizer,
    mut decoder: StreamDecoder,
    ids: &[TokenId],
) -> (Vec<String>, String) {
    let pushes = ids
        .iter()
        .map(|&id| decoder.push(tokenizer, id).to_owned())
        .collect();
    let rest = decoder.finish().to_owned();
    (pushes, rest)
}

#[test]
fn spm_byte_tokens_of_an_emoji_emit_nothing_until_the_character_is_complete() {
    let tokenizer = spm();
    let ids = tokenizer.encode("🦙", PLAIN);
    // ▁ then the four byte-fallback tokens <0xF0> <0x9F> <0xA6> <0x99>.
    let pieces: Vec<&str> = ids
        .iter()
        .map(|&id| tokenizer.token_piece(id).unwrap())
        .collect();
    assert_eq!(pieces, ["▁", "<0xF0>", "<0x9F>", "<0xA6>", "<0x99>"]);

    let (pushes, rest) = stream(tokenizer, StreamDecoder::new(), &ids);
    assert_eq!(pushes, [" ", "", "", "", "🦙"]);
    assert_eq!(rest, "");

    let (pushes, _) = stream(tokenizer, StreamDecoder::at_sequence_start(), &ids);
    assert_eq!(pushes, ["", "", "", "", "🦙"]);
    assert_eq!(pushes.concat(), tokenizer.decode(&ids));
    assert_eq!(tokenizer.decode(&ids), "🦙");
}

#[test]
fn gpt2_byte_level_pieces_that_split_a_character_are_held_back() {
    let tokenizer = gpt2();
    let text = "🦙 and 😁!";
    let ids = tokenizer.encode(text, PLAIN);
    let mut decoder = StreamDecoder::new();
    let mut saw_hold_back = false;
    let mut out = String::new();
    for &id in &ids {
        let emitted = decoder.push(tokenizer, id).to_owned();
        if decoder.pending_len() > 0 {
            saw_hold_back = true;
        }
        assert!(
            !emitted.contains('\u{FFFD}'),
            "emitted a broken character: {emitted:?}"
        );
        out.push_str(&emitted);
    }
    out.push_str(decoder.finish());
    assert!(
        saw_hold_back,
        "expected some token to end inside a character: {ids:?}"
    );
    assert_eq!(out, text);
    assert_eq!(out, tokenizer.decode(&ids));
}

#[test]
fn streams_add_up_to_decode_for_every_test_case() {
    for tokenizer in [spm(), gpt2()] {
        let inp = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../testdata/tokenizer/ggml-vocab-llama-spm.gguf.inp"),
        )
        .unwrap();
        for text in inp.split("\n__ggml_vocab_test__\n") {
            let ids = tokenizer.encode(
                text,
                EncodeOptions {
                    add_bos: true,
                    parse_special: false,
                },
            );
            let (pushes, rest) = stream(tokenizer, StreamDecoder::at_sequence_start(), &ids);
            let streamed = pushes.concat() + &rest;
            let whole = if tokenizer.cleans_spaces() {
                clean_up_tokenization_spaces(&streamed)
            } else {
                streamed.clone()
            };
            assert_eq!(whole, tokenizer.decode(&ids));
            assert_eq!(streamed, text);
        }
    }
}

#[test]
fn invalid_byte_sequences_become_replacement_characters_where_lossy_decoding_puts_them() {
    let tokenizer = spm();
    let byte = |b: u8| tokenizer.token_id(&format!("<0x{b:02X}>")).unwrap();
    // A stray continuation byte, a truncated 3-byte sequence followed by ASCII, then a
    // truncated sequence at the very end.
    let ids = [
        byte(0x80),
        byte(b'a'),
        byte(0xE2),
        byte(0x82),
        byte(b'b'),
        byte(0xE2),
    ];
    let mut raw = Vec::new();
    for &id in &ids {
        tokenizer.append_token_bytes(id, false, &mut raw);
    }
    let expected = String::from_utf8_lossy(&raw).into_owned();
    let (pushes, rest) = stream(tokenizer, StreamDecoder::new(), &ids);
    assert_eq!(pushes, ["\u{FFFD}", "a", "", "", "\u{FFFD}b", ""]);
    assert_eq!(rest, "\u{FFFD}");
    assert_eq!(pushes.concat() + &rest, expected);
    assert_eq!(tokenizer.decode(&ids), expected);
}

#[test]
fn control_tokens_and_out_of_range_ids_emit_nothing() {
    let tokenizer = spm();
    let mut decoder = StreamDecoder::new();
    assert_eq!(decoder.push(tokenizer, tokenizer.bos_id().unwrap()), "");
    assert_eq!(decoder.push(tokenizer, TokenId(1_000_000)), "");
    let mut shown = Vec::new();
    tokenizer.append_token_bytes(tokenizer.eos_id().unwrap(), true, &mut shown);
    assert_eq!(shown, b"</s>");
}

/// Which vocabularies clean up spaces when decoding whole texts, as llama.cpp decides:
/// byte-level BPE by default (gpt-2, llama-bpe), not qwen2's, never SentencePiece.
#[test]
fn whole_text_decoding_cleans_spaces_where_llama_cpp_does() {
    let text = "Hello , world ! it 's a test .";
    for (file, cleans) in [
        ("ggml-vocab-gpt-2.gguf", true),
        ("ggml-vocab-llama-bpe.gguf", true),
        ("ggml-vocab-qwen2.gguf", false),
        ("ggml-vocab-llama-spm.gguf", false),
        ("ggml-vocab-phi-3.gguf", false),
    ] {
        let tokenizer = load(file);
        assert_eq!(tokenizer.cleans_spaces(), cleans, "{file}");
        let decoded = tokenizer.decode(&tokenizer.encode(text, PLAIN));
        let want = if cleans {
            "Hello, world! it's a test."
        } else {
            text
        };
        assert_eq!(decoded, want, "{file}");
    }
}
