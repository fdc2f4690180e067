//! A recipe determines its file byte for byte, whatever the thread count.
mod common;

use airs_gguf::Gguf;
use airs_synth::{QuantMix, Recipe, Shape, SynthError, Vocabulary, default_vocab_dir};
use common::*;

#[test]
fn same_seed_gives_identical_bytes_for_any_thread_count() {
    let one = generate(Shape::Tiny, QuantMix::Q4KM, 7, 1);
    for threads in [2, 3, 8] {
        assert!(
            one == generate(Shape::Tiny, QuantMix::Q4KM, 7, threads),
            "tiny q4_k_m: 1 vs {threads} threads"
        );
    }
    assert!(
        generate(Shape::Tiny, QuantMix::Q5KM, 7, 1) == generate(Shape::Tiny, QuantMix::Q5KM, 7, 3),
        "tiny q5_k_m: 1 vs 3 threads"
    );
    for quant in [QuantMix::F16, QuantMix::Q8_0] {
        assert!(
            generate(Shape::Qwen2Tiny, quant, 7, 1) == generate(Shape::Qwen2Tiny, quant, 7, 3),
            "qwen2-tiny {quant}: 1 vs 3 threads"
        );
    }
}

#[test]
fn different_seeds_give_different_weights_and_the_same_header() {
    let a = generate(Shape::Tiny, QuantMix::Q8_0, 1, 2);
    let b = generate(Shape::Tiny, QuantMix::Q8_0, 2, 2);
    assert_eq!(a.len(), b.len());
    let (ga, gb) = (Gguf::parse(&a).unwrap(), Gguf::parse(&b).unwrap());
    for (ta, tb) in ga.tensors().iter().zip(gb.tensors()) {
        assert_eq!((ta.name, &ta.dims, ta.ty), (tb.name, &tb.dims, tb.ty));
        assert_ne!(
            ga.tensor_data(ta),
            gb.tensor_data(tb),
            "{} is the same for seeds 1 and 2",
            ta.name
        );
    }
}

#[test]
fn every_mix_of_one_seed_encodes_the_same_weights() {
    let f32_bytes = generate(Shape::Tiny, QuantMix::F32, 3, 2);
    let reference = Gguf::parse(&f32_bytes).unwrap();
    // Largest allowed |quantized - f32| for a value x: f16 rounds to 11 significant bits;
    // (subnormals below 6e-5 to a fixed 6e-8); Q8_0, Q4_K and Q5_K round to a step of about
    // max|x| / 127, max|x| / 15 and max|x| / 31 per block.
    for (quant, tolerance) in [
        (
            QuantMix::F16,
            (|x: f32| x.abs() / 1024.0 + 1e-7) as fn(f32) -> f32,
        ),
        (QuantMix::Q8_0, |_| 1e-3),
        (QuantMix::Q4KM, |_| 1e-2),
        (QuantMix::Q5KM, |_| 5e-3),
        (QuantMix::Q4_1, |_| 1e-2),
        (QuantMix::Q5_1, |_| 5e-3),
    ] {
        let bytes = generate(Shape::Tiny, quant, 3, 2);
        let gguf = Gguf::parse(&bytes).unwrap();
        for (want, got) in reference.tensors().iter().zip(gguf.tensors()) {
            let n = want.elements() as usize;
            let mut a = vec![0.0f32; n];
            let mut b = vec![0.0f32; n];
            airs_kernels::dequantize_row(want.ty, reference.tensor_data(want), &mut a).unwrap();
            airs_kernels::dequantize_row(got.ty, gguf.tensor_data(got), &mut b).unwrap();
            let worst = a
                .iter()
                .zip(&b)
                .position(|(&x, &y)| (x - y).abs() > tolerance(x));
            if let Some(i) = worst {
                panic!("{quant} {}[{i}]: {} vs f32 {}", got.name, b[i], a[i]);
            }
        }
    }
}

#[test]
fn write_file_matches_write_and_leaves_no_partial_file() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("airs-synth-write-file");
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = Recipe::new(Shape::Tiny, QuantMix::Q4KM, 5);
    let path = dir.join(recipe.file_name());
    assert_eq!(recipe.file_name(), "tiny-q4_k_m-seed5.gguf");
    let written = recipe.write_file(&path, &vocab(Shape::Tiny), 2).unwrap();
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(written.bytes, on_disk.len() as u64);
    assert_eq!(written.tensors, 21);
    assert!(on_disk == generate(Shape::Tiny, QuantMix::Q4KM, 5, 1));
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn errors_name_the_problem() {
    let e = "llama-7b".parse::<Shape>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown model shape \"llama-7b\" (known: tiny, qwen2-tiny, qwen3-tiny, llama3-tiny, phi3-tiny, tinyllama-1.1b)"
    );
    let e = "q4_k_s".parse::<QuantMix>().unwrap_err();
    assert_eq!(
        e.to_string(),
        "unknown quantization mix \"q4_k_s\" (known: f32, f16, q8_0, q4_k_m, q5_k_m, q4_1, q5_1)"
    );
    let qwen_vocab = vocab(Shape::Qwen2Tiny);
    let e = Recipe::new(Shape::Tiny, QuantMix::F32, 1)
        .write(&mut Vec::new(), &qwen_vocab, 1)
        .unwrap_err();
    assert!(matches!(e, SynthError::VocabSize { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "shape tiny needs a 32000-token vocabulary, the vocabulary has 151936"
    );
    let e = Recipe::new(Shape::Tiny, QuantMix::F32, 1)
        .write(&mut Vec::new(), &vocab(Shape::Tiny), 0)
        .unwrap_err();
    assert!(matches!(e, SynthError::NoThreads));
    let e = Vocabulary::for_shape(Shape::Tiny, &default_vocab_dir().join("nowhere")).unwrap_err();
    assert!(matches!(e, SynthError::VocabRead { .. }), "{e}");
    assert!(e.to_string().contains("ggml-vocab-llama-spm.gguf"), "{e}");
    // A GGUF file without tokenizer metadata.
    let mut empty = Vec::new();
    airs_gguf::writer::write_gguf(&mut empty, &[], &[], 32, |_, _| Ok(())).unwrap();
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-vocab.gguf");
    std::fs::write(&path, &empty).unwrap();
    let e = Vocabulary::load(&path).unwrap_err();
    assert!(matches!(e, SynthError::VocabMissingTokens { .. }), "{e}");
}

#[test]
fn a_failing_writer_reports_the_io_error() {
    struct Full;
    impl std::io::Write for Full {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::from(std::io::ErrorKind::StorageFull))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let e = Recipe::new(Shape::Tiny, QuantMix::F32, 1)
        .write(&mut Full, &vocab(Shape::Tiny), 1)
        .unwrap_err();
    assert!(matches!(e, SynthError::Io(_)), "{e}");
}
