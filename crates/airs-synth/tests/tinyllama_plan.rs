//! tinyllama-1.1b's tensor table and exact file size, computed without generating weights.
mod common;

use airs_gguf::GgmlType;
use airs_synth::{QuantMix, Recipe, Shape, plan, use_more_bits};
use common::*;

const N_EMBD: u64 = 2048;
const N_VOCAB: u64 = 32000;
const N_FF: u64 = 5632;
const N_KV: u64 = 4 * 64;
const LAYERS: usize = 22;

/// Bytes of `n` values of `ty`, from ggml's block geometry (spelled out, not looked up).
fn bytes(ty: GgmlType, n: u64) -> u64 {
    match ty {
        GgmlType::F32 => 4 * n,
        GgmlType::F16 => 2 * n,
        GgmlType::Q8_0 => n / 32 * 34,
        GgmlType::Q4K => n / 256 * 144,
        GgmlType::Q5K => n / 256 * 176,
        GgmlType::Q6K => n / 256 * 210,
        other => panic!("unexpected type {other}"),
    }
}

/// The expected table, written out independently of the library's plan.
fn expected_table(quant: QuantMix) -> Vec<(String, Vec<u64>, GgmlType)> {
    use GgmlType::*;
    let matrix = match quant {
        QuantMix::F32 => F32,
        QuantMix::F16 => F16,
        QuantMix::Q8_0 => Q8_0,
        QuantMix::Q4KM => Q4K,
        QuantMix::Q5KM => Q5K,
        QuantMix::Q4_1 => Q4_1,
        QuantMix::Q5_1 => Q5_1,
    };
    let k_mix = matches!(quant, QuantMix::Q4KM | QuantMix::Q5KM);
    let more_bits = |l: usize| {
        if k_mix && use_more_bits(l, LAYERS) {
            Q6K
        } else {
            matrix
        }
    };
    let mut table = vec![(
        "token_embd.weight".to_string(),
        vec![N_EMBD, N_VOCAB],
        matrix,
    )];
    for l in 0..LAYERS {
        let n = |s: &str| format!("blk.{l}.{s}");
        table.extend([
            (n("attn_norm.weight"), vec![N_EMBD], F32),
            (n("attn_q.weight"), vec![N_EMBD, N_EMBD], matrix),
            (n("attn_k.weight"), vec![N_EMBD, N_KV], matrix),
            (n("attn_v.weight"), vec![N_EMBD, N_KV], more_bits(l)),
            (n("attn_output.weight"), vec![N_EMBD, N_EMBD], matrix),
            (n("ffn_norm.weight"), vec![N_EMBD], F32),
            (n("ffn_gate.weight"), vec![N_EMBD, N_FF], matrix),
            (n("ffn_up.weight"), vec![N_EMBD, N_FF], matrix),
            (n("ffn_down.weight"), vec![N_FF, N_EMBD], more_bits(l)),
        ]);
    }
    let output = if matches!(matrix, F32 | F16 | Q8_0) {
        matrix
    } else {
        Q6K
    };
    table.push(("output_norm.weight".into(), vec![N_EMBD], F32));
    table.push(("output.weight".into(), vec![N_EMBD, N_VOCAB], output));
    table
}

#[test]
fn tinyllama_tensor_table_matches_llama_cpp_layout_for_every_mix() {
    for quant in QuantMix::ALL {
        let got: Vec<_> = plan(Shape::TinyLlama1_1B, quant)
            .into_iter()
            .map(|t| (t.name, t.dims, t.ty))
            .collect();
        assert_eq!(got, expected_table(quant), "{quant}");
    }
}

/// Tensor count, Q6_K count, data size and file size of tinyllama-1.1b in `quant`, a k-quant
/// mix whose tensor data takes `data_bytes`.
fn check_k_mix_sizes(quant: QuantMix, data_bytes: u64) {
    let specs = plan(Shape::TinyLlama1_1B, quant);
    assert_eq!(specs.len(), 3 + 9 * LAYERS);
    assert_eq!(
        specs.iter().filter(|t| t.ty == GgmlType::Q6K).count(),
        1 + 2 * 10,
        "output + attn_v/ffn_down in layers 0 1 4 7 10 13 16 19 20 21"
    );
    let data: u64 = specs
        .iter()
        .map(|t| bytes(t.ty, t.dims.iter().product()))
        .sum();
    // Every tensor's size is a multiple of 32, so the data section has no padding.
    assert!(specs.iter().all(|t| t.bytes().unwrap() % 32 == 0));
    assert_eq!(data, data_bytes, "{quant}");
    let params: u64 = specs.iter().map(|t| t.dims.iter().product::<u64>()).sum();
    assert_eq!(params, 1_100_048_384);

    let recipe = Recipe::new(Shape::TinyLlama1_1B, quant, 1);
    assert_eq!(recipe.parameters(), params);
    let vocab = vocab(Shape::TinyLlama1_1B);
    let meta = recipe.metadata(&vocab).unwrap();
    let (header, _) = airs_gguf::writer::encode_header(&meta, &specs, 32).unwrap();
    assert_eq!(
        recipe.file_size(&vocab).unwrap(),
        header.len() as u64 + data
    );
}

#[test]
fn tinyllama_q4_k_m_data_and_file_sizes_are_exact() {
    // 636.18 MiB of tensor data.
    check_k_mix_sizes(QuantMix::Q4KM, 667_078_656);
}

#[test]
fn tinyllama_q5_k_m_data_and_file_sizes_are_exact() {
    // 745.11 MiB: the 913_833_984 values Q4_K_M stores as Q4_K take 32 more bytes per 256.
    check_k_mix_sizes(QuantMix::Q5KM, 781_307_904);
}

#[test]
fn tinyllama_q8_0_data_size_is_exact() {
    let specs = plan(Shape::TinyLlama1_1B, QuantMix::Q8_0);
    let data: u64 = specs.iter().map(|t| t.bytes().unwrap()).sum();
    assert_eq!(data, 1_169_072_128);
    assert!(specs.iter().all(|t| t.ty
        == if t.dims.len() == 1 {
            GgmlType::F32
        } else {
            GgmlType::Q8_0
        }));
}
