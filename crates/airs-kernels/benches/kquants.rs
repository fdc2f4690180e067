//! Decode-shaped k-quant matmul throughput: one Q8_K activation row against a whole weight
//! matrix (TinyLlama's 5632×2048 FFN shapes), single-threaded, per instruction set.
//! Throughput is reported in weight bytes per second.
//!
//! `hot`: one matrix, resident in L3 after the first pass (the kernel's compute bound).
//! `cold`: 8 different matrices in turn (> 32 MiB L3), so weights stream from DRAM as in decode.

use airs_kernels::{ActType, GgmlType, Isa, matmul, quantize_act, quantize_row, row_bytes};
use divan::{Bencher, counter::BytesCount};

fn main() {
    divan::main();
}

const ISAS: [&str; 4] = ["scalar", "avx2", "avx512", "neon"];
/// (rows, n): ffn_up/gate (n = 2048) and ffn_down (n = 5632).
const SHAPES: [(usize, usize); 2] = [(5632, 2048), (2048, 5632)];

struct Case {
    ty: GgmlType,
    n: usize,
    rows: usize,
    mats: Vec<Vec<u8>>,
    act: Vec<u8>,
}

fn case(ty: GgmlType, rows: usize, n: usize, copies: usize) -> Case {
    let mut s = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
    };
    // Quantize a few distinct rows and tile them (the reference quantizer is slow).
    let rb = row_bytes(ty, n).unwrap();
    let distinct: Vec<Vec<u8>> = (0..16)
        .map(|_| {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            let mut q = vec![0u8; rb];
            quantize_row(ty, &x, &mut q).unwrap();
            q
        })
        .collect();
    let mats = (0..copies)
        .map(|c| {
            (0..rows)
                .flat_map(|r| distinct[(r + c) % 16].clone())
                .collect()
        })
        .collect();
    let x: Vec<f32> = (0..n).map(|_| next() * 20.0).collect();
    let mut act = vec![0u8; ActType::Q8K.row_bytes(n)];
    quantize_act(ActType::Q8K, &x, &mut act).unwrap();
    Case {
        ty,
        n,
        rows,
        mats,
        act,
    }
}

fn run(bencher: Bencher, ty: GgmlType, isa: &str, shape: (usize, usize), copies: usize) {
    let Some(isa) = Isa::from_name(isa).filter(|i| i.is_available()) else {
        return;
    };
    let c = case(ty, shape.0, shape.1, copies);
    let bytes = c.mats[0].len();
    let mut out = vec![0f32; c.rows];
    let mut i = 0;
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        let m = &c.mats[i % c.mats.len()];
        i += 1;
        matmul(isa, c.ty, c.n, m, &c.act, &mut out, c.rows).unwrap();
        divan::black_box(out[0])
    });
}

#[divan::bench(args = ISAS, consts = [0, 1])]
fn q4k_hot<const S: usize>(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q4K, isa, SHAPES[S], 1);
}

#[divan::bench(args = ISAS, consts = [0, 1])]
fn q6k_hot<const S: usize>(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q6K, isa, SHAPES[S], 1);
}

#[divan::bench(args = ISAS, consts = [0, 1])]
fn q5k_hot<const S: usize>(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q5K, isa, SHAPES[S], 1);
}

#[divan::bench(args = ISAS)]
fn q4k_cold(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q4K, isa, SHAPES[0], 8);
}

#[divan::bench(args = ISAS)]
fn q6k_cold(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q6K, isa, SHAPES[0], 8);
}

#[divan::bench(args = ["scalar", "avx2", "neon"], consts = [0])]
fn q2k_hot<const S: usize>(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q2K, isa, SHAPES[S], 1);
}

#[divan::bench(args = ["scalar", "avx2", "neon"], consts = [0])]
fn q3k_hot<const S: usize>(bencher: Bencher, isa: &str) {
    run(bencher, GgmlType::Q3K, isa, SHAPES[S], 1);
}
