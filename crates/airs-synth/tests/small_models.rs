//! The tiny and qwen2-tiny shapes, generated in full for every mix: valid GGUF, intended
//! hyperparameters, the mix's tensor types, finite weights of plausible spread, the source
//! vocabulary copied verbatim, and a forward pass through airs-engine with finite logits.
mod common;

use std::sync::Arc;

use airs_engine::{ContiguousKv, KvShape, KvType, Logits, Model, OwnedImage, Runtime};

use airs_gguf::{
    Architecture, FfnActivation, GgmlType, Gguf, ModelConfig, RopeFactors, RopeStyle,
    SlidingWindow, Value,
};
use airs_synth::RopeScaling;
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
        "qwen3" => (Architecture::Qwen3, RopeStyle::Neox),
        "phi3" => (Architecture::Phi3, RopeStyle::Neox),
        _ => (Architecture::Qwen2, RopeStyle::Neox),
    };
    let (rope_factors, rope_attn_factor, context_len) = match hp.rope_scaling {
        None => (None, 1.0, hp.context_len),
        Some(RopeScaling::Llama3) => (Some(RopeFactors::Llama3), 1.0, hp.context_len),
        Some(RopeScaling::LongRope {
            attn_factor,
            original_context,
        }) => (
            Some(RopeFactors::LongRopeShort),
            attn_factor,
            original_context,
        ),
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
            context_len,
            rope_base: hp.rope_base,
            rope_dims: hp.rotated_dims(),
            rope_style,
            rms_eps: hp.rms_eps,
            tied_output: false,
            qkv_bias: hp.qkv_bias,
            embedding_scale: None,
            qk_norm: hp.qk_norm,
            post_norms: false,
            ffn_activation: FfnActivation::Silu,
            attention_scale: 1.0 / (hp.head_dim() as f32).sqrt(),
            sliding_window: hp.sliding_window.map(|window| SlidingWindow {
                window,
                global_every: None,
                local_rope_base: None,
            }),
            rope_factors,
            rope_attn_factor,
            fused_qkv: hp.fused,
            fused_gate_up: hp.fused,
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
    // Per layer: 2 norms and 7 matrices (phi3 fuses q/k/v into one and gate/up into one),
    // plus biases and q/k norms; outside: embeddings, output norm and output, RoPE factors.
    let matrices_per_layer = if hp.fused { 4 } else { 7 };
    let vectors_per_layer = 2 + if hp.qkv_bias { 3 } else { 0 } + if hp.qk_norm { 2 } else { 0 };
    let rope_tensors = match hp.rope_scaling {
        None => 0,
        Some(airs_synth::RopeScaling::Llama3) => 1,
        Some(airs_synth::RopeScaling::LongRope { .. }) => 2,
    };
    assert_eq!(
        planned.len(),
        3 + rope_tensors + (matrices_per_layer + vectors_per_layer) * hp.layers,
        "{what}"
    );

    // Types follow the mix.
    let count = |ty: GgmlType| gguf.tensors().iter().filter(|t| t.ty == ty).count();
    let vectors = vectors_per_layer * hp.layers + 1 + rope_tensors;
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
        QuantMix::Q4_1 | QuantMix::Q5_1 => {
            let base = if quant == QuantMix::Q4_1 {
                GgmlType::Q4_1
            } else {
                GgmlType::Q5_1
            };
            assert_eq!(count(base), matrices - 1, "{what}");
            assert_eq!(count(GgmlType::F32), vectors);
            assert_eq!(gguf.tensor("output.weight").unwrap().ty, GgmlType::Q6K);
            assert_eq!(gguf.tensor("token_embd.weight").unwrap().ty, base);
        }
        QuantMix::Q4KM | QuantMix::Q5KM => {
            // Q5_K_M is Q4_K_M with Q5_K for the matrices Q4_K_M leaves Q4_K.
            let base = if quant == QuantMix::Q4KM {
                GgmlType::Q4K
            } else {
                GgmlType::Q5K
            };
            let more_bits_layers = (0..hp.layers)
                .filter(|&l| use_more_bits(l, hp.layers))
                .count();
            // output.weight, plus attn_v (not fused into attn_qkv) and ffn_down of every
            // more-bits layer.
            let per_layer = if hp.fused { 1 } else { 2 };
            let q6k = 1 + per_layer * more_bits_layers;
            assert_eq!(count(GgmlType::Q6K), q6k, "{what}");
            assert_eq!(count(base), matrices - q6k, "{what}");
            assert_eq!(count(GgmlType::F32), vectors);
            assert_eq!(gguf.tensor("output.weight").unwrap().ty, GgmlType::Q6K);
            assert_eq!(gguf.tensor("token_embd.weight").unwrap().ty, base);
            for l in 0..hp.layers {
                let want = if use_more_bits(l, hp.layers) {
                    GgmlType::Q6K
                } else {
                    base
                };
                let more_bits: &[&str] = if hp.fused {
                    &["ffn_down"]
                } else {
                    &["attn_v", "ffn_down"]
                };
                for t in more_bits {
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
        if let Some(fixed) = &planned.fixed {
            let got: Vec<f32> = data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            assert_eq!(&got, fixed, "{what} {}", info.name);
            continue;
        }
        if planned.role.is_norm() {
            assert!((mean - 1.0).abs() < 0.01, "{what} {name}: mean {mean}");
            assert!(std > 0.005 && std < 0.04, "{what} {name}: std {std}");
        } else {
            // The role's std (sharp shapes draw some roles wider); Q4_K rounds to 16 levels
            // per sub-block, which adds some spread of its own.
            let (_, want) = airs_synth::weights::distribution(planned.role, hp.sharp);
            let want = f64::from(want);
            assert!(mean.abs() < 0.25 * want, "{what} {name}: mean {mean}");
            assert!(
                std > 0.8 * want && std < 1.3 * want,
                "{what} {name}: std {std}, drawn with {want}"
            );
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
    assert!(theirs.len() >= 7, "{what}: {} tokenizer keys", theirs.len());
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
fn qwen3_tiny_in_every_mix() {
    for quant in QuantMix::ALL {
        check_model(Shape::Qwen3Tiny, quant);
    }
}

/// qwen3-tiny: per-head q/k norms, no biases, and sharp weights (embedding rows of std ~1,
/// where the default shapes draw 0.02).
#[test]
fn qwen3_tiny_has_qk_norms_no_biases_and_sharp_weights() {
    let bytes = generate(Shape::Qwen3Tiny, QuantMix::F32, 1, 2);
    let gguf = Gguf::parse(&bytes).unwrap();
    for l in 0..2 {
        for t in ["attn_q_norm", "attn_k_norm"] {
            let info = gguf.tensor(&format!("blk.{l}.{t}.weight")).unwrap();
            assert_eq!(info.dims, [64]);
        }
        assert!(gguf.tensor(&format!("blk.{l}.attn_q.bias")).is_none());
    }
    let embd = gguf.tensor("token_embd.weight").unwrap();
    let data = &gguf.tensor_data(embd)[..256 * 4 * 100];
    let values: Vec<f32> = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let var = values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32;
    assert!(
        (0.8..1.2).contains(&var.sqrt()),
        "embedding std {}",
        var.sqrt()
    );
}

#[test]
fn llama3_and_phi3_tiny_in_every_mix() {
    for quant in QuantMix::ALL {
        check_model(Shape::Llama3Tiny, quant);
        check_model(Shape::Phi3Tiny, quant);
    }
}

/// llama3-tiny's `rope_freqs` follow llama.cpp's converter: 1 for the fastest pairs, 8 for the
/// slowest, monotone between; the engine reads them and phi3-tiny's fused tensors.
#[test]
fn llama3_rope_freqs_and_phi3_fused_tensors_reach_the_engine_config() {
    let bytes = generate(Shape::Llama3Tiny, QuantMix::F32, 1, 2);
    let gguf = Gguf::parse(&bytes).unwrap();
    let info = gguf.tensor("rope_freqs.weight").unwrap();
    let f: Vec<f32> = gguf
        .tensor_data(info)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(f.len(), 16);
    assert_eq!(f[0], 1.0);
    assert_eq!(f[15], 8.0);
    assert!(f.windows(2).all(|w| w[0] <= w[1]), "{f:?}");
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    assert_eq!(cfg.rope_factors, Some(airs_gguf::RopeFactors::Llama3));
    assert_eq!((cfg.heads, cfg.kv_heads), (16, 8));

    let bytes = generate(Shape::Phi3Tiny, QuantMix::Q8_0, 1, 2);
    let gguf = Gguf::parse(&bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    assert_eq!(cfg.arch, Architecture::Phi3);
    assert!(cfg.fused_qkv && cfg.fused_gate_up);
    assert_eq!(cfg.rope_dims, 48);
    assert_eq!(
        cfg.rope_factors,
        Some(airs_gguf::RopeFactors::LongRopeShort)
    );
    assert!((cfg.rope_attn_factor - 1.190_239).abs() < 1e-6);
    // LongRoPE: airs serves the original context, where the short factors apply.
    assert_eq!(cfg.context_len, 4096);
    assert_eq!(cfg.layer_window(0), Some(160));
    assert_eq!(cfg.layer_window(1), Some(160));
    assert!(gguf.tensor("blk.0.attn_qkv.weight").is_some());
    assert!(gguf.tensor("blk.0.ffn_gate.weight").is_none());
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
