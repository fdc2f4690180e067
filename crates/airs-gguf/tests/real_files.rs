//! The reader on real files shipped in the repository.
use airs_gguf::{Architecture, GgmlType, Gguf, LayerMap, ModelConfig, RopeStyle};

fn repo_file(rel: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn stories260k_header_tensors_and_hyperparameters() {
    let bytes = repo_file("models/stories260K.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset(), 14_176);
    // gguf-dump reports 22 keys: these 19 plus its own version and count pseudo-keys.
    assert_eq!(g.metadata().len(), 19);
    assert_eq!(g.tensors().len(), 48);
    assert!(g.tensors().iter().all(|t| t.ty == GgmlType::F32));
    let embd = g.tensor("token_embd.weight").unwrap();
    assert_eq!(embd.dims, vec![64, 512]);
    assert_eq!(g.tensor_data(embd).len(), 64 * 512 * 4);
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(cfg.arch, Architecture::Llama);
    assert_eq!(
        (
            cfg.layers,
            cfg.embedding_len,
            cfg.heads,
            cfg.kv_heads,
            cfg.head_dim,
            cfg.ff_len
        ),
        (5, 64, 8, 4, 8, 172)
    );
    assert_eq!(
        (cfg.vocab_len, cfg.context_len, cfg.rope_dims),
        (512, 2048, 8)
    );
    assert_eq!(cfg.rope_base, 10_000.0);
    assert_eq!(cfg.rope_style, RopeStyle::Interleaved);
    assert!(!cfg.tied_output && !cfg.qkv_bias);
    assert!((cfg.rms_eps - 1e-5).abs() < 1e-12);
    let params: u64 = g.tensors().iter().map(|t| t.elements()).sum();
    assert_eq!(params, 292_800);

    let map = LayerMap::new(&g);
    assert_eq!(map.layers.len(), 5);
    assert!(map.layers.iter().all(|l| l.tensors.len() == 9));
    assert_eq!(map.other.len(), 3);
    let layer_bytes: u64 = map.layers.iter().map(|l| l.bytes).sum();
    let other_bytes: u64 = map.other.iter().map(|&i| g.tensors()[i].bytes).sum();
    assert_eq!(
        layer_bytes + other_bytes,
        bytes.len() as u64 - g.data_offset()
    );
}

#[test]
fn stories260k_vocabulary_is_borrowed_from_the_image() {
    let bytes = repo_file("models/stories260K.gguf");
    let g = Gguf::parse(&bytes).unwrap();
    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 512);
    let first: Vec<&[u8]> = tokens.strings().unwrap().take(4).collect();
    assert_eq!(first, [&b"<unk>"[..], b"<s>", b"</s>", b"<0x00>"]);
    let range = bytes.as_ptr_range();
    assert!(
        range.contains(&first[1].as_ptr()),
        "token strings must not be copied"
    );
    let scores: Vec<f32> = g
        .get_array("tokenizer.ggml.scores")
        .unwrap()
        .f32s()
        .unwrap()
        .collect();
    assert_eq!(scores.len(), 512);
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(g.get_u64("tokenizer.ggml.bos_token_id").unwrap(), 1);
}

#[test]
fn every_tokenizer_test_vocabulary_parses() {
    for name in ["llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2"] {
        let bytes = repo_file(&format!("testdata/tokenizer/ggml-vocab-{name}.gguf"));
        let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
        assert!(tokens.len() > 30_000, "{name}");
        assert_eq!(tokens.strings().unwrap().count(), tokens.len());
    }
}
