//! The reference prompts of testdata/reference (produced by llama.cpp): tokenizing each
//! `prompt_text` (special tokens parsed, BOS as the model wants) must give exactly its
//! `prompt_token_ids`; the ids must decode to `prompt_token_pieces` and the greedy
//! continuation ids to `greedy_text`.
//!
//! stories260K uses models/stories260K.gguf. The Qwen2.5-Coder prompts use the Qwen2 test
//! vocabulary (testdata/tokenizer/ggml-vocab-qwen2.gguf: the same 151,643 regular tokens and
//! 151,387 merges, with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at 151643..=151645;
//! only the ids from 151646 on, which none of these prompts use, differ), and also the real
//! model file when it has been downloaded to ~/.cache/airs/models.

use std::path::{Path, PathBuf};

use airs_gguf::Gguf;
use airs_tokenizer::chat::{ChatMessage, ChatTemplate, TemplateSource};
use airs_tokenizer::{EncodeOptions, StreamDecoder, TokenId, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Reference {
    prompt_text: Option<String>,
    prompt_token_ids: Vec<u32>,
    prompt_token_pieces: Vec<String>,
    greedy_token_ids: Vec<u32>,
    greedy_text: String,
}

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn cached_qwen_model() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".cache/airs/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    path.is_file().then_some(path)
}

fn references(prefix: &str) -> Vec<(String, Reference)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(repo("testdata/reference")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // `*.kld-*.json` are next-token distributions over a text, another format (the
        // perplexity tests check their tokenization).
        if name.starts_with(prefix) && name.ends_with(".json") && !name.contains(".kld-") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((name, serde_json::from_str(&text).unwrap()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no reference files for {prefix}");
    out
}

fn ids(raw: &[u32]) -> Vec<TokenId> {
    raw.iter().copied().map(TokenId).collect()
}

fn check_references(tokenizer: &Tokenizer, prefix: &str) {
    for (name, r) in references(prefix) {
        let text = r.prompt_text.as_deref().unwrap_or("");
        let got = tokenizer.encode(text, EncodeOptions::prompt(tokenizer));
        assert_eq!(got, ids(&r.prompt_token_ids), "{name}: prompt ids");

        for (&id, piece) in r.prompt_token_ids.iter().zip(&r.prompt_token_pieces) {
            let mut bytes = Vec::new();
            assert!(tokenizer.append_token_bytes(TokenId(id), true, &mut bytes));
            assert_eq!(
                &String::from_utf8_lossy(&bytes),
                piece,
                "{name}: piece of {id}"
            );
        }

        let mut stream = StreamDecoder::new();
        let mut generated = String::new();
        for &id in &r.greedy_token_ids {
            generated.push_str(stream.push(tokenizer, TokenId(id)));
        }
        generated.push_str(stream.finish());
        assert_eq!(generated, r.greedy_text, "{name}: greedy text");
        eprintln!("{name}: {} prompt ids match", got.len());
    }
}

fn load(path: &Path) -> (Vec<u8>, Tokenizer) {
    let bytes = std::fs::read(path).unwrap();
    let tokenizer = Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap();
    (bytes, tokenizer)
}

#[test]
fn stories260k_prompts() {
    let (_, tokenizer) = load(&repo("models/stories260K.gguf"));
    assert_eq!(tokenizer.vocab_len(), 512);
    assert!(tokenizer.add_bos());
    assert_eq!(tokenizer.bos_id(), Some(TokenId(1)));
    assert_eq!(tokenizer.eos_id(), Some(TokenId(2)));
    assert!(tokenizer.is_end_of_generation(TokenId(2)));
    check_references(&tokenizer, "stories260K.");
}

#[test]
fn qwen_prompts_with_the_qwen2_test_vocabulary() {
    let (_, tokenizer) = load(&repo("testdata/tokenizer/ggml-vocab-qwen2.gguf"));
    assert_eq!(tokenizer.vocab_len(), 151_936);
    for (id, text) in [
        (151_643, "<|endoftext|>"),
        (151_644, "<|im_start|>"),
        (151_645, "<|im_end|>"),
    ] {
        assert_eq!(tokenizer.token_piece(TokenId(id)), Some(text));
        assert!(tokenizer.is_control(TokenId(id)));
    }
    assert!(!tokenizer.add_bos());
    assert!(tokenizer.is_end_of_generation(TokenId(151_643)));
    assert!(tokenizer.is_end_of_generation(TokenId(151_645)));
    assert!(!tokenizer.is_end_of_generation(TokenId(151_644)));
    assert_eq!(tokenizer.eot_id(), Some(TokenId(151_645)));
    check_references(&tokenizer, "qwen2.5-coder-0.5b-q4km.");
}

/// The Qwen2 vocabulary's template is ChatML, like Qwen2.5's, and with an explicit system
/// message renders the reference chat prompt exactly.
#[test]
fn qwen_chat_prompt_from_the_test_vocabulary_template() {
    let bytes = std::fs::read(repo("testdata/tokenizer/ggml-vocab-qwen2.gguf")).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).unwrap();
    assert_eq!(template.source(), TemplateSource::Model);
    check_chat_prompt(&tokenizer, &template);
}

fn check_chat_prompt(tokenizer: &Tokenizer, template: &ChatTemplate) {
    let messages = [
        ChatMessage::system("You are a helpful assistant."),
        ChatMessage::user("Write a Python function that checks whether a number is prime."),
    ];
    for (name, r) in references("qwen2.5-coder-0.5b-q4km.chat-prime.") {
        assert_eq!(
            template.render(&messages, true).unwrap(),
            r.prompt_text.clone().unwrap(),
            "{name}"
        );
        assert_eq!(
            template.encode(tokenizer, &messages, true).unwrap(),
            ids(&r.prompt_token_ids),
            "{name}"
        );
    }
}

#[test]
fn qwen_prompts_with_the_cached_model() {
    let Some(path) = cached_qwen_model() else {
        eprintln!(
            "skipped: ~/.cache/airs/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf is absent \
             (the reference prompts were checked against the Qwen2 test vocabulary instead)"
        );
        return;
    };
    let bytes = std::fs::read(&path).unwrap();
    let gguf = Gguf::parse(&bytes).unwrap();
    let tokenizer = Tokenizer::from_gguf(&gguf).unwrap();
    assert_eq!(tokenizer.vocab_len(), 151_936);
    check_references(&tokenizer, "qwen2.5-coder-0.5b-q4km.");
    let template = ChatTemplate::from_gguf(&gguf, &tokenizer).unwrap();
    assert_eq!(template.source(), TemplateSource::Model);
    check_chat_prompt(&tokenizer, &template);
}
