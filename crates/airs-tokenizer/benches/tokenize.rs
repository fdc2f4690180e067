//! Load and encode timings on the test vocabularies (`cargo bench -p airs-tokenizer`):
//! building each tokenizer from its GGUF metadata, then encoding a prose/code mix and a few
//! adversarial inputs (long runs of one character, of whitespace, of newlines) that stress
//! the pre-tokenizer regexes and the merge heap.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use airs_gguf::Gguf;
use airs_tokenizer::{EncodeOptions, Tokenizer};

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let start = Instant::now();
        let out = f();
        best = best.min(start.elapsed());
        last = Some(out);
    }
    (best, last.expect("at least one run"))
}

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer");
    let prose = std::fs::read_to_string(dir.join("ggml-vocab-qwen2.gguf.inp")).unwrap()
        + include_str!("../src/bpe.rs")
        + include_str!("../src/chat.rs");
    let prose = prose.repeat(4);
    let adversarial = [
        ("64 KiB of 'a'", "a".repeat(65_536)),
        ("64 KiB of spaces", " ".repeat(65_536)),
        ("64 KiB of ' \\n'", " \n".repeat(32_768)),
        ("64 KiB of digits", "7".repeat(65_536)),
        ("16k emoji", "🦙".repeat(16_384)),
    ];
    if let Some(home) = std::env::var_os("HOME") {
        let path =
            PathBuf::from(home).join(".cache/airs/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
        if let Ok(bytes) = std::fs::read(&path) {
            let gguf = Gguf::parse(&bytes).unwrap();
            let (load, tokenizer) = best_of(5, || Tokenizer::from_gguf(&gguf).unwrap());
            println!(
                "Qwen2.5-Coder-0.5B model file: {} tokens, {} merges: load {:.1} ms",
                tokenizer.vocab_len(),
                tokenizer.merge_count(),
                load.as_secs_f64() * 1e3
            );
        }
    }
    for name in [
        "ggml-vocab-llama-spm.gguf",
        "ggml-vocab-gpt-2.gguf",
        "ggml-vocab-llama-bpe.gguf",
        "ggml-vocab-qwen2.gguf",
    ] {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        let gguf = Gguf::parse(&bytes).unwrap();
        let (load, tokenizer) = best_of(5, || Tokenizer::from_gguf(&gguf).unwrap());
        println!(
            "{name}: {} tokens, {} merges: load {:.1} ms",
            tokenizer.vocab_len(),
            tokenizer.merge_count(),
            load.as_secs_f64() * 1e3
        );
        let options = EncodeOptions {
            add_bos: tokenizer.add_bos(),
            parse_special: false,
        };
        let (t, ids) = best_of(5, || tokenizer.encode(black_box(&prose), options));
        println!(
            "  prose+code {} KiB -> {} tokens: {:.2} ms ({:.1} MB/s)",
            prose.len() / 1024,
            ids.len(),
            t.as_secs_f64() * 1e3,
            prose.len() as f64 / t.as_secs_f64() / 1e6
        );
        let (t, _) = best_of(5, || tokenizer.decode(black_box(&ids)));
        println!("  decode: {:.2} ms", t.as_secs_f64() * 1e3);
        for (label, text) in &adversarial {
            let (t, ids) = best_of(3, || tokenizer.encode(black_box(text), options));
            println!(
                "  {label} -> {} tokens: {:.2} ms",
                ids.len(),
                t.as_secs_f64() * 1e3
            );
        }
    }
}
