//! The model-memory loaders under the engine, on the real models (stories260K and
//! Qwen2.5-Coder-0.5B Q4_K_M): every loader gives bitwise the logits of a plain memory map;
//! lazy inference starts before the region is filled; a file truncated under a lazy load is an
//! engine `Load` error, not a hang; forced fallbacks (no userfaultfd, no mlock) keep the logits
//! and report their notices.
//! Cost: a few forward passes per model and loader (Qwen: 8 prompt tokens, 3 decode steps).

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use airs_engine::image::{OpenedModel, open_model};
use airs_engine::sampler::argmax;
use airs_engine::{
    ContiguousKv, EngineError, EngineErrorKind, KvShape, KvType, Logits, MappedFile, Model, Runtime,
};
use airs_memory::{Backing, LoadOptions, LoaderKind, NoticeKind};
use airs_testdata::{Reference, qwen_path, stories_path};

const KIB: usize = 1 << 10;

/// stories260K prompt: token ids whose embedding rows lie in the file's first 64 KiB chunk
/// (rows 0..=199), so with 64 KiB chunks the second embedding chunk is not needed for token 1.
const STORIES_PROMPT: [u32; 8] = [1, 10, 50, 100, 150, 199, 42, 7];

fn qwen_prompt() -> Vec<u32> {
    Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf32").prompt_token_ids[..8].to_vec()
}

/// The prompt's next-token logits, then those of `steps` greedy decode steps.
fn run(model: &Model, rt: &Runtime, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    try_run(model, rt, prompt, steps).expect("forward pass")
}

fn try_run(
    model: &Model,
    rt: &Runtime,
    prompt: &[u32],
    steps: usize,
) -> Result<Vec<Vec<f32>>, EngineError> {
    let shape = KvShape {
        layers: model.config.layers,
        kv_heads: model.config.kv_heads,
        head_dim: model.config.head_dim,
    };
    let mut kv = ContiguousKv::new(shape, prompt.len() + steps + 1, KvType::F32);
    let mut out = vec![model.forward(rt, &mut kv, prompt, Logits::Last)?];
    for _ in 0..steps {
        let next = argmax(out.last().expect("one logits vector"));
        out.push(model.forward(rt, &mut kv, &[next], Logits::Last)?);
    }
    Ok(out)
}

/// Logits through a plain memory map of the file: the reference every loader must match.
fn baseline(path: &Path, rt: &Runtime, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let image = Arc::new(MappedFile::open(path).unwrap());
    let model = airs_engine::image::load_model(image).unwrap();
    run(&model, rt, prompt, steps)
}

fn assert_bitwise_equal(what: &str, got: &[Vec<f32>], want: &[Vec<f32>]) {
    assert_eq!(got.len(), want.len(), "{what}: number of steps");
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: step {step} vocabulary");
        let differing = g
            .iter()
            .zip(w)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "{what}: step {step}: {differing} logits differ"
        );
    }
}

fn open(path: &Path, options: &LoadOptions) -> OpenedModel {
    open_model(path, options, None).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn has_notice(opened: &OpenedModel, kind: NoticeKind) -> bool {
    opened.region().notices().iter().any(|n| n.kind == kind)
}

/// Every loader (and lazy with small chunks) yields bitwise the baseline logits.
fn loaders_match_baseline(path: &Path, prompt: &[u32], steps: usize) {
    let rt = Runtime::new(2);
    let want = baseline(path, &rt, prompt, steps);
    let configs = [
        ("eager", LoadOptions::with_loader(LoaderKind::Eager)),
        ("mmap", LoadOptions::with_loader(LoaderKind::Mmap)),
        ("lazy", LoadOptions::with_loader(LoaderKind::Lazy)),
        (
            "lazy, 64 KiB chunks",
            LoadOptions {
                chunk_bytes: 64 * KIB,
                ..LoadOptions::with_loader(LoaderKind::Lazy)
            },
        ),
    ];
    for (name, options) in configs {
        let opened = open(path, &options);
        assert_eq!(opened.region().loader_kind(), options.loader, "{name}");
        let model = opened.model().unwrap();
        let got = run(&model, &rt, prompt, steps);
        assert_bitwise_equal(name, &got, &want);
        opened.loader().wait_resident().unwrap();
        // Once resident, the lazy region is the same memory as the eager one.
        let stats = opened.region().stats();
        let notices = opened.region().notices();
        if options.loader != LoaderKind::Mmap {
            assert_eq!(stats.backing, Backing::Anonymous, "{name}");
            assert!(stats.read_only, "{name}: {stats:?}");
            // Pinned unless the environment refused mlock (then a notice says so).
            let refused = notices
                .iter()
                .any(|n| matches!(n.kind, NoticeKind::NotPinned | NoticeKind::PinnedOnFault));
            assert!(stats.pinned || refused, "{name}: {stats:?} {notices:?}");
            assert_eq!(stats.filled_bytes, Some(stats.bytes), "{name}");
        }
        assert!(
            !notices.iter().any(|n| matches!(
                n.kind,
                NoticeKind::LazyFellBackToMmap | NoticeKind::LoadFailed
            )),
            "{name}: {notices:?}"
        );
        drop(model);
        assert_eq!(
            opened.region().refcount(),
            1,
            "{name}: the image holds one session"
        );
    }
}

/// Loaders that repack matrices for `rt`'s kernels (`airs_engine::repack`) yield bitwise the
/// logits of the file's layout, with the default 2 MiB load chunks (where every whole 16-row
/// group is repacked, those that straddle two chunks too) and with 64 KiB chunks (where many
/// straddle a chunk and stay in the file's layout), for a prompt longer than the
/// rows16 kernels' 16 tokens (the tiled kernels over unpacked groups), a short one and decode.
/// Returns the matrices the eager loader repacked.
///
/// The baseline runs on the test runtime's instruction set where its file-layout kernels give
/// the scalar reference's bits (AVX-512 VNNI, NEON with `sdot`), as the rows16 kernels always
/// do; elsewhere (AVX2, whose file-layout dots sum in ggml's order) on the scalar reference.
fn repacked_loaders_match_baseline(path: &Path, prompts: &[&[u32]], steps: usize) -> usize {
    let rt = Runtime::new(2);
    let exact = airs_kernels::matmul_matches_scalar(rt.isa, airs_gguf::GgmlType::Q8_0);
    let reference = if exact {
        Runtime::new(2)
    } else {
        Runtime::with_isa(2, airs_kernels::Isa::Scalar)
    };
    let mut packed_matrices = 0;
    for prompt in prompts {
        let want = baseline(path, &reference, prompt, steps);
        for (name, options) in [
            ("eager", LoadOptions::with_loader(LoaderKind::Eager)),
            ("lazy", LoadOptions::with_loader(LoaderKind::Lazy)),
            (
                "lazy, 64 KiB chunks",
                LoadOptions {
                    chunk_bytes: 64 * KIB,
                    ..LoadOptions::with_loader(LoaderKind::Lazy)
                },
            ),
        ] {
            let opened = open_model(path, &options, Some(rt.isa)).unwrap();
            let model = opened.model().unwrap();
            let got = run(&model, &rt, prompt, steps);
            assert_bitwise_equal(&format!("{name}, repacked"), &got, &want);
            let matrices = model
                .layers
                .iter()
                .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
                .chain([&model.output]);
            let packed = matrices.clone().filter(|t| t.packed.is_some()).count();
            let planned = opened.region().transform().is_some();
            assert_eq!(planned, packed > 0, "{name}");
            if options.chunk_bytes == airs_memory::DEFAULT_CHUNK_BYTES {
                for t in matrices.filter(|t| t.packed.is_some()) {
                    let bits = t.packed.as_deref().unwrap();
                    let groups: u32 = bits.iter().map(|b| b.count_ones()).sum();
                    assert_eq!(
                        groups as usize,
                        t.rows / 16,
                        "{name}: every whole group packed"
                    );
                }
            }
            // The eager loader repacks wherever the kernels are fast; a lazy one falls back
            // to mmap (no repacking) where userfaultfd is refused, as under qemu-user.
            if name == "eager" {
                packed_matrices = packed;
            }
        }
    }
    packed_matrices
}

#[test]
fn qwen_repacked_weights_give_bitwise_identical_logits() {
    let long = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf32").prompt_token_ids;
    assert!(long.len() > 16, "the long prompt takes the tiled kernels");
    let packed = repacked_loaders_match_baseline(&qwen_path(), &[&long, &qwen_prompt()[..3]], 3);
    // Its Q5_0 and Q8_0 matrices have a rows16 layout; AVX-512 VNNI and NEON with the dot
    // product multiply it fast.
    let fast = airs_kernels::rows16::fast(Runtime::new(1).isa, airs_gguf::GgmlType::Q8_0);
    assert_eq!(packed > 0, fast, "{packed} repacked matrices");
}

#[test]
fn gemma_repacked_weights_with_the_tied_embedding_give_bitwise_identical_logits() {
    // Gemma's output is its Q8_0 embedding matrix: repacked, and looked up row by row.
    let prompt: Vec<u32> = (0..20).map(|i| 2 + 7919 * i % 262_000).collect();
    let path = airs_testdata::gemma_path();
    let packed = repacked_loaders_match_baseline(&path, &[&prompt, &prompt[..2]], 3);
    let fast = airs_kernels::rows16::fast(Runtime::new(1).isa, airs_gguf::GgmlType::Q8_0);
    assert_eq!(packed > 0, fast, "{packed} repacked matrices");
    let opened = open_model(
        &path,
        &LoadOptions::with_loader(LoaderKind::Eager),
        Some(Runtime::new(1).isa),
    )
    .unwrap();
    let model = opened.model().unwrap();
    assert_eq!(
        model.token_embd.packed.is_some(),
        fast,
        "the tied embedding is repacked"
    );
}

/// A generated Qwen2-shaped file of `mix` (airs-synth): its matrices of type `ty` are
/// repacked where the kernels are fast, and every loader gives the logits of the file's
/// layout bit for bit, through the rows16 kernels (decode, a short prompt) and the tiles built
/// from the groups (a prompt past 16 tokens).
fn generated_repacked_weights_match_baseline(mix: airs_synth::QuantMix, ty: airs_gguf::GgmlType) {
    use airs_synth::{Recipe, Shape, Vocabulary, default_vocab_dir};
    let file = TempFile(std::env::temp_dir().join(format!(
        "airs-engine-loaders-{mix}-{}.gguf",
        std::process::id()
    )));
    let vocab = Vocabulary::for_shape(Shape::Qwen2Tiny, &default_vocab_dir()).unwrap();
    Recipe::new(Shape::Qwen2Tiny, mix, 1)
        .write_file(&file.0, &vocab, 2)
        .unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| 9 + 6151 * i % 150_000).collect();
    let packed = repacked_loaders_match_baseline(&file.0, &[&prompt, &prompt[..3]], 3);
    let isa = Runtime::new(1).isa;
    let fast = airs_kernels::rows16::fast(isa, ty);
    let opened = open_model(
        &file.0,
        &LoadOptions::with_loader(LoaderKind::Eager),
        Some(isa),
    )
    .unwrap();
    let model = opened.model().unwrap();
    let of_type: Vec<_> = model
        .layers
        .iter()
        .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
        .filter(|t| t.ty == ty)
        .collect();
    assert!(
        of_type.len() >= 12,
        "{mix}: {} {ty} matrices",
        of_type.len()
    );
    assert!(
        of_type.iter().all(|t| t.packed.is_some() == fast),
        "{mix}: {ty} repacked iff fast"
    );
    assert_eq!(packed > 0, fast, "{mix}: {packed} repacked matrices");
}

/// Q5_K_M: Q5_K matrices, Q6_K output and, in the last layer, `attn_v`/`ffn_down`.
#[test]
fn q5_k_m_repacked_weights_give_bitwise_identical_logits() {
    generated_repacked_weights_match_baseline(airs_synth::QuantMix::Q5KM, airs_gguf::GgmlType::Q5K);
}

/// Q4_1 and Q5_1 (whose blocks have a min): every matrix but the Q6_K output.
#[test]
fn q4_1_and_q5_1_repacked_weights_give_bitwise_identical_logits() {
    use airs_gguf::GgmlType;
    use airs_synth::QuantMix;
    generated_repacked_weights_match_baseline(QuantMix::Q4_1, GgmlType::Q4_1);
    generated_repacked_weights_match_baseline(QuantMix::Q5_1, GgmlType::Q5_1);
}

/// A file in the temp directory, removed on drop.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn stories_loaders_give_bitwise_identical_logits() {
    loaders_match_baseline(&stories_path(), &STORIES_PROMPT, 6);
}

#[test]
fn qwen_loaders_give_bitwise_identical_logits() {
    loaders_match_baseline(&qwen_path(), &qwen_prompt(), 3);
}

/// Lazy with a crawling background filler: token 1 is computed from what the forward pass
/// faulted in and prefetched, before the region is filled, with unchanged logits.
fn inference_starts_before_fully_resident(path: &Path, prompt: &[u32], chunk_bytes: usize) {
    let rt = Runtime::new(2);
    let want = baseline(path, &rt, prompt, 2);
    let options = LoadOptions {
        chunk_bytes,
        filler_bytes_per_s: Some(4 * KIB as u64),
        ..LoadOptions::with_loader(LoaderKind::Lazy)
    };
    let opened = open(path, &options);
    assert_eq!(opened.region().loader_kind(), LoaderKind::Lazy);
    let model = opened.model().unwrap();
    let shape = KvShape {
        layers: model.config.layers,
        kv_heads: model.config.kv_heads,
        head_dim: model.config.head_dim,
    };
    let mut kv = ContiguousKv::new(shape, prompt.len() + 4, KvType::F32);
    let first = model.forward(&rt, &mut kv, prompt, Logits::Last).unwrap();
    let progress = opened.loader().progress();
    assert!(
        progress.filled_bytes < progress.total_bytes,
        "the region was filled before token 1: {progress:?}"
    );
    assert!(!opened.loader().is_resident());
    eprintln!(
        "{}: token 1 with {} of {} bytes loaded",
        path.display(),
        progress.filled_bytes,
        progress.total_bytes
    );
    let mut got = vec![first];
    for _ in 0..2 {
        let next = argmax(got.last().unwrap());
        got.push(model.forward(&rt, &mut kv, &[next], Logits::Last).unwrap());
    }
    assert_bitwise_equal("lazy, filling", &got, &want);
    assert!(opened.loader().error().is_none());
}

#[test]
fn stories_inference_starts_while_the_lazy_load_is_filling() {
    inference_starts_before_fully_resident(&stories_path(), &STORIES_PROMPT, 64 * KIB);
}

#[test]
fn qwen_inference_starts_while_the_lazy_load_is_filling() {
    inference_starts_before_fully_resident(&qwen_path(), &qwen_prompt(), 2 << 20);
}

/// A copy of stories260K in the temp directory, removed on drop.
struct TempCopy(PathBuf);

impl TempCopy {
    fn new(tag: &str) -> TempCopy {
        let path = std::env::temp_dir().join(format!(
            "airs-engine-loaders-{tag}-{}.gguf",
            std::process::id()
        ));
        std::fs::copy(stories_path(), &path).unwrap();
        TempCopy(path)
    }

    fn truncate(&self, len: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.0)
            .unwrap()
            .set_len(len)
            .unwrap();
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn assert_load_error(result: Result<(), EngineError>) {
    let e = result.expect_err("a truncated model must not compute");
    assert!(
        matches!(e.kind(), EngineErrorKind::Load(_)),
        "expected a Load error, got: {e}"
    );
    assert!(e.to_string().contains("truncated"), "{e}");
}

/// Runs `f` on another thread; panics if it does not finish within a minute (a hang).
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the engine hung on a truncated model file")
}

#[test]
fn file_truncated_during_a_rate_limited_lazy_load_is_a_load_error() {
    let copy = TempCopy::new("truncated-early");
    let options = LoadOptions {
        chunk_bytes: 64 * KIB,
        storage_bytes_per_s: Some(256 * KIB as u64), // the whole file takes ~4.5 s
        ..LoadOptions::with_loader(LoaderKind::Lazy)
    };
    let opened = open(&copy.0, &options);
    // Keep the header, embedding and output; cut into layer 0.
    copy.truncate(300_000);
    let image = opened.dyn_image();
    let result = within_a_minute(move || {
        let rt = Runtime::new(2);
        let model = airs_engine::image::load_model(image)?;
        try_run(&model, &rt, &STORIES_PROMPT, 2).map(drop)
    });
    assert_load_error(result);
    let e = opened.loader().wait_resident().unwrap_err();
    assert_eq!(e.kind(), airs_memory::ErrorKind::Truncated, "{e}");
    assert!(has_notice(&opened, NoticeKind::LoadFailed));
    assert!(!opened.region().is_safe_for_inference());
}

#[test]
fn file_truncated_after_the_model_is_built_fails_the_forward_pass() {
    let copy = TempCopy::new("truncated-late");
    // Only faults load: the model's norm vectors now, the layers during the forward pass.
    let options = LoadOptions {
        chunk_bytes: 64 * KIB,
        background_fill: false,
        prefetch_layers: 0,
        ..LoadOptions::with_loader(LoaderKind::Lazy)
    };
    let opened = open(&copy.0, &options);
    let model = opened.model().unwrap();
    let before = opened.loader().progress();
    assert!(before.filled_bytes < before.total_bytes, "{before:?}");
    copy.truncate(300_000);
    let result = within_a_minute(move || {
        let rt = Runtime::new(2);
        try_run(&model, &rt, &STORIES_PROMPT, 2).map(drop)
    });
    assert_load_error(result);
    let e = opened.loader().wait_resident().unwrap_err();
    assert_eq!(e.kind(), airs_memory::ErrorKind::Truncated, "{e}");
}

/// Forced degradations: the logits stay bitwise the same and each one is reported.
fn fallbacks_keep_logits(path: &Path, prompt: &[u32], steps: usize) {
    let rt = Runtime::new(2);
    let want = baseline(path, &rt, prompt, steps);
    let cases = [
        (
            "lazy without userfaultfd",
            LoadOptions {
                force_no_uffd: true,
                ..LoadOptions::with_loader(LoaderKind::Lazy)
            },
            LoaderKind::Mmap,
            NoticeKind::LazyFellBackToMmap,
        ),
        (
            "lazy without mlock",
            LoadOptions {
                force_no_mlock: true,
                ..LoadOptions::with_loader(LoaderKind::Lazy)
            },
            LoaderKind::Lazy,
            NoticeKind::PinnedOnFault,
        ),
        (
            "eager without mlock",
            LoadOptions {
                force_no_mlock: true,
                ..LoadOptions::with_loader(LoaderKind::Eager)
            },
            LoaderKind::Eager,
            NoticeKind::PinnedOnFault,
        ),
        (
            "eager without any pinning",
            LoadOptions {
                force_no_mlock: true,
                force_no_mlock_onfault: true,
                ..LoadOptions::with_loader(LoaderKind::Eager)
            },
            LoaderKind::Eager,
            NoticeKind::NotPinned,
        ),
    ];
    for (name, options, runs_as, notice) in cases {
        let opened = open(path, &options);
        assert_eq!(opened.region().loader_kind(), runs_as, "{name}");
        let model = opened.model().unwrap();
        let got = run(&model, &rt, prompt, steps);
        assert_bitwise_equal(name, &got, &want);
        opened.loader().wait_resident().unwrap();
        let notices = opened.region().notices();
        assert!(
            notices.iter().any(|n| n.kind == notice),
            "{name}: expected {notice:?} in {notices:?}"
        );
        for n in &notices {
            assert!(
                !n.message.contains('\n'),
                "{name}: notice not one line: {n}"
            );
        }
        let stats = opened.region().stats();
        assert_eq!(stats.pinned, notice == NoticeKind::PinnedOnFault, "{name}");
    }
}

#[test]
fn stories_forced_fallbacks_keep_logits_and_report_notices() {
    fallbacks_keep_logits(&stories_path(), &STORIES_PROMPT, 4);
}

#[test]
fn qwen_forced_fallbacks_keep_logits_and_report_notices() {
    fallbacks_keep_logits(&qwen_path(), &qwen_prompt(), 2);
}

/// A prompt of several passes prefilled while a (slow) lazy load is still running runs
/// layer-major — every pass overlaps the load, not only the first — and gives bitwise the
/// logits of the same passes run one after another on the resident model (`forward_passes`),
/// on both real models. Also checks `forward_passes` against pass-by-pass for every token's
/// logits on a plain map.
fn layer_major_prefill_matches_pass_by_pass(path: &Path, prompt: &[u32], pass_rows: usize) {
    let rt = Runtime::new(2);
    let new_kv = |model: &Model| {
        let shape = KvShape {
            layers: model.config.layers,
            kv_heads: model.config.kv_heads,
            head_dim: model.config.head_dim,
        };
        ContiguousKv::new(shape, prompt.len() + 1, KvType::F32)
    };
    let image = Arc::new(MappedFile::open(path).unwrap());
    let mapped = airs_engine::image::load_model(image).unwrap();
    // Pass by pass, every token's logits, then the last token's.
    let mut kv = new_kv(&mapped);
    let mut want_all = Vec::new();
    for pass in prompt.chunks(pass_rows) {
        want_all.extend(mapped.forward(&rt, &mut kv, pass, Logits::All).unwrap());
    }
    let vocab = mapped.config.vocab_len;
    let want_last = want_all[want_all.len() - vocab..].to_vec();
    let mut kv = new_kv(&mapped);
    let got_all = mapped
        .forward_passes(&rt, &mut kv, prompt, pass_rows, Logits::All)
        .unwrap();
    assert_bitwise_equal("forward_passes", &[got_all], &[want_all]);

    // Paced so that the load is still running while the prompt is prefilled.
    let file_len = std::fs::metadata(path).unwrap().len();
    let options = LoadOptions {
        storage_bytes_per_s: Some(file_len / 2),
        chunk_bytes: airs_memory::MIN_CHUNK_BYTES,
        ..LoadOptions::with_loader(LoaderKind::Lazy)
    };
    let opened = open(path, &options);
    if opened.region().loader_kind() != LoaderKind::Lazy {
        eprintln!("userfaultfd unavailable: layer-major prefill over a lazy load not exercised");
        return;
    }
    let model = opened.model().unwrap();
    assert!(opened.dyn_image().is_loading(), "the load already finished");
    let mut kv = new_kv(&model);
    let got = model
        .forward_passes(&rt, &mut kv, prompt, pass_rows, Logits::Last)
        .unwrap();
    assert_bitwise_equal("lazy layer-major prefill", &[got], &[want_last]);
    assert_eq!(airs_engine::KvCache::len(&kv), prompt.len());
}

#[test]
fn stories_layer_major_prefill_during_a_lazy_load_matches_pass_by_pass() {
    let prompt: Vec<u32> = (0..100).map(|i| 1 + (i * 37) % 500).collect();
    layer_major_prefill_matches_pass_by_pass(&stories_path(), &prompt, 16);
}

#[test]
fn qwen_layer_major_prefill_during_a_lazy_load_matches_pass_by_pass() {
    let reference = Reference::load("qwen2.5-coder-0.5b-q4km.raw-inventory-176tok.kvf32");
    layer_major_prefill_matches_pass_by_pass(&qwen_path(), &reference.prompt_token_ids, 64);
}
