//! The tiny and qwen2-tiny shapes, generated in full for every mix: valid GGUF, intended
//! hyperparameters, the mix's tensor types, finite weights of plausible spread, the source
//! vocabulary copied verbatim, and a forward pass through airs-engine with finite logits.
mod common;

use std::sync::Arc;

use airs_engine::{ContiguousKv, KvShape, KvType, Logits, Model, OwnedImage, Runtime};

use airs_gguf::{Architecture, GgmlType, Gguf, ModelConfig, RopeStyle, Value};
use airs_synth::{
    QuantMix, Recipe, Shape, TensorRole, default_vocab_dir, plan, plan_tensors, use_more_bits,
};
use common::*;

fn check_model(shape: Shape, quant: QuantMix) {
    let recipe = Recipe::new(shape, quant, 1);
    let bytes = generate(shape, quant, 1, 2);
    let what = format!("{shape} {quant}");
    assert_eq!(
        bytes.len() as u64,
        recipe.file_size(&vocab(shape)).unwrap(),
        "{what}: predicted file size"
    );
    let gguf = Gguf::parse(&bytes).unwrap();
    let hp = shape.hparams();

    // Hyperparameters, as the engine will read them.
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let (arch, rope_style) = match hp.arch {
        "llama" => (Architecture::Llama, RopeStyle::Interleaved),
        _ => (Architecture::Qwen2, RopeStyle::Neox),
    };
    assert_eq!(
        cfg,
        ModelConfig {
            arch,
            layers: hp.layers,
            embedding_len: hp.embedding_len,
            heads: hp.heads,
            kv_heads: hp.kv_heads,
            head_dim: hp.head_dim(),
            ff_len: hp.ff_len,
            vocab_len: hp.vocab_len,
            context_len: hp.context_len,
            rope_base: hp.rope_base,
            rope_dims: hp.head_dim(),
            rope_style,
            rms_eps: hp.rms_eps,
            tied_output: false,
            qkv_bias: hp.qkv_bias,
        },
        "{what}"
    );
    assert_eq!(
        gguf.get_u64("general.file_type").unwrap(),
        u64::from(quant.file_type())
    );
    assert_eq!(gguf.get_u64("general.alignment").unwrap(), 32);
    assert_eq!(gguf.alignment(), 32);

    // Tensor table: exactly the plan.
    let planned = plan(shape, quant);
    assert_eq!(gguf.tensors().len(), planned.len(), "{what}");
    for (info, spec) in gguf.tensors().iter().zip(&planned) {
        assert_eq!(info.name, spec.name, "{what}");
        assert_eq!(info.dims, spec.dims, "{what} {}", spec.name);
        assert_eq!(info.ty, spec.ty, "{what} {}", spec.name);
    }
    let per_layer = if hp.qkv_bias { 12 } else { 9 };
    assert_eq!(planned.len(), 3 + per_layer * hp.layers, "{what}");

    // Types follow the mix.
    let count = |ty: GgmlType| gguf.tensors().iter().filter(|t| t.ty == ty).count();
    let vectors = (2 + if hp.qkv_bias { 3 } else { 0 }) * hp.layers + 1;
    let matrices = gguf.tensors().len() - vectors;
    match quant {
        QuantMix::F32 => assert_eq!(count(GgmlType::F32), gguf.tensors().len()),
        QuantMix::F16 => {
            assert_eq!(count(GgmlType::F16), matrices);
            assert_eq!(count(GgmlType::F32), vectors);
        }
        QuantMix::Q8_0 => {
            assert_eq!(count(GgmlType::Q8_0), matrices);
            assert_eq!(count(GgmlType::F32), vectors);
        }
        QuantMix::Q4KM => {
            let more_bits_layers = (0..hp.layers)
                .filter(|&l| use_more_bits(l, hp.layers))
                .count();
            // output.weight, plus attn_v and ffn_down of every more-bits layer.
            assert_eq!(count(GgmlType::Q6K), 1 + 2 * more_bits_layers, "{what}");
            assert_eq!(count(GgmlType::Q4K), matrices - 1 - 2 * more_bits_layers);
            assert_eq!(count(GgmlType::F32), vectors);
            assert_eq!(gguf.tensor("output.weight").unwrap().ty, GgmlType::Q6K);
            assert_eq!(gguf.tensor("token_embd.weight").unwrap().ty, GgmlType::Q4K);
            for l in 0..hp.layers {
                let want = if use_more_bits(l, hp.layers) {
                    GgmlType::Q6K
                } else {
                    GgmlType::Q4K
                };
                for t in ["attn_v", "ffn_down"] {
                    let name = format!("blk.{l}.{t}.weight");
                    assert_eq!(gguf.tensor(&name).unwrap().ty, want, "{what} {name}");
                }
            }
        }
    }

    // Every value decodes to a finite number; spreads are the intended ones.
    for (info, planned) in gguf.tensors().iter().zip(plan_tensors(shape, quant)) {
        let row_len = info.row_len() as usize;
        let data = gguf.tensor_data(info);
        let row_bytes = data.len() / info.rows() as usize;
        let mut row = vec![0.0f32; row_len];
        let (mut n, mut sum, mut sq) = (0usize, 0.0f64, 0.0f64);
        for encoded in data.chunks_exact(row_bytes) {
            airs_kernels::dequantize_row(info.ty, encoded, &mut row).unwrap();
            for &v in &row {
                assert!(v.is_finite(), "{what} {}: {v}", info.name);
                n += 1;
                sum += f64::from(v);
                sq += f64::from(v) * f64::from(v);
            }
        }
        let mean = sum / n as f64;
        let std = (sq / n as f64 - mean * mean).max(0.0).sqrt();
        let name = info.name;
        if planned.role.is_norm() {
            assert!((mean - 1.0).abs() < 0.01, "{what} {name}: mean {mean}");
            assert!(std > 0.005 && std < 0.04, "{what} {name}: std {std}");
        } else {
            assert!(mean.abs() < 0.005, "{what} {name}: mean {mean}");
            // Q4_K rounds to 16 levels per sub-block, which adds some spread of its own.
            assert!(std > 0.016 && std < 0.026, "{what} {name}: std {std}");
        }
        if planned.role == TensorRole::AttnBias {
            assert_eq!(info.dims.len(), 1);
        }
    }

    // The vocabulary is the source file's, entry for entry.
    let source_bytes = std::fs::read(default_vocab_dir().join(hp.vocab_file)).unwrap();
    let source = Gguf::parse(&source_bytes).unwrap();
    let ours = tokenizer_entries(&gguf);
    let theirs = tokenizer_entries(&source);
    assert!(theirs.len() >= 8, "{what}: {} tokenizer keys", theirs.len());
    assert_eq!(ours.len(), theirs.len(), "{what}");
    for ((k1, v1), (k2, v2)) in ours.iter().zip(&theirs) {
        assert_eq!(k1, k2, "{what}");
        assert!(v1 == v2, "{what}: {k1} differs from the source vocabulary");
    }
    assert_eq!(
        gguf.get_array("tokenizer.ggml.tokens").unwrap().len(),
        hp.vocab_len
    );

    check_forward_pass(&what, bytes);
}

/// The model runs through airs-engine's forward pass to finite, non-constant logits.
fn check_forward_pass(what: &str, bytes: Vec<u8>) {
    let image = Arc::new(OwnedImage(bytes));
    let gguf = Gguf::parse(&image.0).unwrap();
    let model = Model::new(image.clone(), &gguf).unwrap();
    let cfg = &model.config;
    let mut kv = ContiguousKv::new(
        KvShape {
            layers: cfg.layers,
            kv_heads: cfg.kv_heads,
            head_dim: cfg.head_dim,
        },
        64,
        KvType::F32,
    );
    let rt = Runtime::new(2);
    let prompt = [1, 450, 4996, 17354, 1701, 29916];
    let logits = model.forward(&rt, &mut kv, &prompt, Logits::All).unwrap();
    assert_eq!(logits.len(), prompt.len() * cfg.vocab_len);
    assert!(
        logits.iter().all(|v| v.is_finite()),
        "{what}: non-finite logits"
    );
    let last = &logits[(prompt.len() - 1) * cfg.vocab_len..];
    let (min, max) = last
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    assert!(max - min > 1e-3, "{what}: flat logits {min}..{max}");
    assert!(
        max.abs() < 100.0 && min.abs() < 100.0,
        "{what}: logits {min}..{max}"
    );
}

/// The `tokenizer.*` metadata entries of a file, in order.
fn tokenizer_entries<'a>(gguf: &Gguf<'a>) -> Vec<(String, Value<'a>)> {
    gguf.metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), *v))
        .collect()
}

#[test]
fn tiny_llama_in_every_mix() {
    for quant in QuantMix::ALL {
        check_model(Shape::Tiny, quant);
    }
}

#[test]
fn qwen2_tiny_in_every_mix() {
    for quant in QuantMix::ALL {
        check_model(Shape::Qwen2Tiny, quant);
    }
}

#[test]
fn qwen2_tiny_carries_merges_pre_tokenizer_and_biases() {
    let bytes = generate(Shape::Qwen2Tiny, QuantMix::Q4KM, 1, 2);
    let gguf = Gguf::parse(&bytes).unwrap();
    assert_eq!(gguf.get_str("tokenizer.ggml.pre").unwrap(), "qwen2");
    assert_eq!(gguf.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert!(gguf.get_array("tokenizer.ggml.merges").unwrap().len() > 150_000);
    for l in 0..2 {
        for (t, len) in [("attn_q", 256), ("attn_k", 128), ("attn_v", 128)] {
            let bias = gguf.tensor(&format!("blk.{l}.{t}.bias")).unwrap();
            assert_eq!((bias.dims.as_slice(), bias.ty), (&[len][..], GgmlType::F32));
        }
    }
    assert_eq!(gguf.get_f64("qwen2.rope.freq_base").unwrap(), 1e6);
}

#[test]
fn tiny_llama_carries_the_spm_special_tokens() {
    let bytes = generate(Shape::Tiny, QuantMix::Q8_0, 1, 1);
    let gguf = Gguf::parse(&bytes).unwrap();
    assert_eq!(gguf.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(gguf.get_u64("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(gguf.get_u64("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert_eq!(
        gguf.get_array("tokenizer.ggml.scores").unwrap().len(),
        32000
    );
    assert_eq!(
        gguf.get_array("tokenizer.ggml.token_type").unwrap().len(),
        32000
    );
}
