use std::sync::Arc;
use airs_engine::*;
use airs_memory::PinPolicy;

fn load(path: &std::path::Path) -> Model {
    let image = Arc::new(MappedFile::open(path).unwrap());
    let gguf = airs_gguf::Gguf::parse(airs_engine::ModelImage::bytes(&*image)).unwrap();
    Model::new(image.clone(), &gguf).unwrap()
}

fn run(model: &Model, rt: &Runtime, prompt: &[u32], chunks: &[usize], steps: usize) -> Vec<Vec<u32>> {
    let shape = KvShape { layers: model.config.layers, kv_heads: model.config.kv_heads, head_dim: model.config.head_dim };
    let pool = PagedKvPool::new(shape, KvType::F16, &PagedKvConfig { pool_bytes: 256 * 16 * shape.bytes_per_token(KvType::F16).unwrap(), tokens_per_block: 16, pin: PinPolicy::None }).unwrap();
    let mut kv = PagedKv::new_sequence(&pool, None);
    let mut at = 0;
    let mut last = Vec::new();
    for &c in chunks {
        let end = (at + c).min(prompt.len());
        if end > at { last = model.forward(rt, &mut kv, &prompt[at..end], Logits::Last).unwrap(); }
        at = end;
    }
    if at < prompt.len() { last = model.forward(rt, &mut kv, &prompt[at..], Logits::Last).unwrap(); }
    let mut out = vec![last.iter().map(|f| f.to_bits()).collect::<Vec<u32>>()];
    for _ in 0..steps {
        let next = airs_engine::sampler::argmax(&last);
        last = model.forward(rt, &mut kv, &[next], Logits::Last).unwrap();
        out.push(last.iter().map(|f| f.to_bits()).collect());
    }
    out
}

#[test]
fn scratch() {
    for (name, path) in [("stories", airs_testdata::stories_path()), ("qwen", std::path::PathBuf::from("/root/.cache/airs/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))] {
        let model = load(&path);
        let rt = Runtime::new(2);
        let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 200 + 5).collect();
        let base = run(&model, &rt, &prompt, &[40], 6);
        for chunks in [vec![20, 20], vec![3, 37], vec![7, 9, 11, 13], vec![1; 40], vec![39, 1], vec![2;20], vec![33, 7], vec![16, 24]] {
            let other = run(&model, &rt, &prompt, &chunks, 6);
            let same: Vec<bool> = base.iter().zip(&other).map(|(a, b)| a == b).collect();
            eprintln!("{name} {chunks:?}: {same:?}");
        }
        let rt1 = Runtime::new(1);
        let one = run(&model, &rt1, &prompt, &[40], 6);
        eprintln!("{name} 1 thread: {:?}", base.iter().zip(&one).map(|(a, b)| a == b).collect::<Vec<_>>());
    }
}
