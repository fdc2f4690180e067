//! llama.cpp's tokenizer test vectors (testdata/tokenizer): every case of every vocabulary
//! must encode to exactly the expected ids (no BOS, special tokens not parsed, as
//! test-tokenizer-0 does), and decode back to the input (with llama.cpp's space clean-up
//! applied where the vocabulary asks for it, as `llama_detokenize` applies it).

use std::path::PathBuf;
use std::time::Instant;

use airs_gguf::Gguf;
use airs_tokenizer::{
    EncodeOptions, ModelKind, PreTokenizerKind, TokenId, Tokenizer, clean_up_tokenization_spaces,
};

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/tokenizer")
        .join(name)
}

fn load(name: &str) -> Tokenizer {
    let bytes = std::fs::read(testdata(name)).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let start = Instant::now();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    eprintln!(
        "{name}: {} tokens, {} merges, built in {:?}",
        tokenizer.vocab_len(),
        tokenizer.merge_count(),
        start.elapsed()
    );
    tokenizer
}

/// The cases of `NAME.inp` / `NAME.out`, split as test-tokenizer-0 splits them.
fn cases(name: &str) -> Vec<(String, Vec<TokenId>)> {
    let inp = std::fs::read_to_string(testdata(&format!("{name}.inp"))).unwrap();
    let out = std::fs::read_to_string(testdata(&format!("{name}.out"))).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(i) => {
                inputs.push(inp[pos..pos + i].to_string());
                pos += i + sep.len();
            }
            None => {
                inputs.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let outputs: Vec<Vec<TokenId>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|t| TokenId(t.parse().unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{name}: case counts differ");
    inputs.into_iter().zip(outputs).collect()
}

fn check_vocab(name: &str, model: ModelKind, pre: Option<PreTokenizerKind>) {
    let tokenizer = load(name);
    assert_eq!(tokenizer.model_kind(), model);
    assert_eq!(tokenizer.pre_kind(), pre);
    let cases = cases(name);
    assert_eq!(cases.len(), 46);
    let options = EncodeOptions {
        add_bos: false,
        parse_special: false,
    };
    let mut failures = Vec::new();
    let mut round_trip_failures = Vec::new();
    for (text, expected) in &cases {
        let got = tokenizer.encode(text, options);
        if &got != expected {
            failures.push(format!(
                "{text:?}\n   expected {expected:?}\n   got      {got:?}"
            ));
        }
        let decoded = tokenizer.decode(&got);
        let want = if tokenizer.cleans_spaces() {
            clean_up_tokenization_spaces(text)
        } else {
            text.clone()
        };
        if decoded != want {
            round_trip_failures.push(format!("{text:?} decoded to {decoded:?}"));
        }
    }
    eprintln!(
        "{name}: {}/{} cases pass, {}/{} round-trip",
        cases.len() - failures.len(),
        cases.len(),
        cases.len() - round_trip_failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{name}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        round_trip_failures.is_empty(),
        "{name}: {} round-trip failures:\n{}",
        round_trip_failures.len(),
        round_trip_failures.join("\n")
    );
}

#[test]
fn llama_spm() {
    check_vocab("ggml-vocab-llama-spm.gguf", ModelKind::SentencePiece, None);
}

#[test]
fn phi_3() {
    check_vocab("ggml-vocab-phi-3.gguf", ModelKind::SentencePiece, None);
}

#[test]
fn gpt_2() {
    check_vocab(
        "ggml-vocab-gpt-2.gguf",
        ModelKind::ByteLevelBpe,
        Some(PreTokenizerKind::Gpt2),
    );
}

#[test]
fn llama_bpe() {
    check_vocab(
        "ggml-vocab-llama-bpe.gguf",
        ModelKind::ByteLevelBpe,
        Some(PreTokenizerKind::Llama3),
    );
}

#[test]
fn qwen2() {
    check_vocab(
        "ggml-vocab-qwen2.gguf",
        ModelKind::ByteLevelBpe,
        Some(PreTokenizerKind::Qwen2),
    );
}
