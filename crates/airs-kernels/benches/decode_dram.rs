//! Decode from DRAM with 1 and 2 threads: one activation row against weight matrices that do
//! not fit in the caches (a ring of copies ≥ 256 MiB and ≥ 4× the last-level cache), rows split
//! between the threads as the engine splits them (one contiguous run of 64-row chunks per
//! thread; `AIRS_BENCH_SPLIT=interleaved` hands the chunks out in turn instead, as the engine
//! did before). Reports GB/s of weight bytes.
//!
//! Modes: `stream` (the read-bandwidth probe's kernel over the same bytes in the same chunks:
//! the ceiling), `matmul` (the public entry: multi-row decode kernels) and `rowdot` (one `dot`
//! call per row, what `matmul` did before); `rows16` the same product on the matrices repacked
//! into the 16-row interleaved layout the loaders write (`rows16::matmul_with`, the activation
//! terms prepared once per product as the engine does). Each case reports the fastest of several passes over
//! the ring, so a noisy machine mostly costs time, not accuracy.
//!
//! `AIRS_BENCH_TOKENS=T` (1..=16, default 1) multiplies T activation rows at once (batched
//! decode of T sequences); the GB/s column stays weight bytes over time. Several tokens' outputs
//! of a 64-row chunk go to one 1 KiB window that stays in L1; `AIRS_BENCH_OUT=rows` lays them
//! out as the engine does instead (`rows16` mode): one call for a thread's whole share, each
//! token's outputs a row of `rows` floats starting on a cache line, as the kernels' streaming
//! stores need (BENCHMARKS.md: 4 tokens of Q4_K 5632×2048 from DRAM took 238-250 µs with the
//! window, 238-258 with the rows streamed, 263-300 with ordinary stores to the rows).
//!
//! `cargo bench -p airs-kernels --bench decode_dram [-- FILTER...]`.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use airs_kernels::{
    GgmlType, Isa, act_type, dot, matmul, quantize_act, quantize_row, row_bytes, rows16, xor_fold,
};
use airs_memory::HugePageBuffer;

/// (type, rows, n): TinyLlama ffn_up of a Q5_K_M file, Qwen2.5-0.5B ffn_up (Q5_0/Q8_0) and
/// ffn_down (Q4_K/Q6_K), TinyLlama ffn_up and ffn_down (Q4_K_M and Q8_0 files).
const CASES: [(GgmlType, usize, usize); 10] = [
    (GgmlType::Q5K, 5632, 2048),
    (GgmlType::Q5_0, 4864, 896),
    (GgmlType::Q8_0, 4864, 896),
    (GgmlType::Q4_0, 4864, 896),
    (GgmlType::Q4K, 896, 4864),
    (GgmlType::Q6K, 896, 4864),
    (GgmlType::Q4K, 5632, 2048),
    (GgmlType::Q6K, 2048, 5632),
    (GgmlType::Q8_0, 5632, 2048),
    (GgmlType::Q8_0, 2048, 5632),
];

/// Bytes of distinct matrix copies cycled through: 256 MiB, or four times the last-level
/// cache where that is larger (`AIRS_BENCH_RING_MIB` overrides, e.g. 1 to measure from cache).
/// On an Intel host reporting a 480 MiB L3, a 256 MiB ring streamed at 39-42 GB/s (two
/// threads) where 1.5 GiB streamed at 33-34, the read probe's figure: partly from cache.
fn ring_bytes() -> usize {
    std::env::var("AIRS_BENCH_RING_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or_else(
            || (256 << 20).max(4 * last_level_cache_bytes()),
            |m| m << 20,
        )
}

/// The largest cache CPU 0 reports in sysfs (`cache/index*/size`, e.g. `480M`, `2048K`), or 0.
fn last_level_cache_bytes() -> usize {
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return 0;
    };
    entries
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("size")).ok())
        .filter_map(|size| {
            let size = size.trim();
            let (digits, unit) = size.split_at(size.find(|c: char| !c.is_ascii_digit())?);
            let scale = match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                _ => return None,
            };
            digits.parse::<usize>().ok().map(|v| v * scale)
        })
        .max()
        .unwrap_or(0)
}
const CHUNK: usize = 64;

/// `bytes` of anonymous memory aligned to the huge-page size and asked for huge pages before it
/// is touched, as the loaders' weight regions are. A plain anonymous mapping of a matrix's size
/// starts anywhere: about half of a 256 MiB ring of 4 MiB matrices sat on base pages, where one
/// thread streamed 19-26 GB/s against 23-29 on huge pages, case by case (BENCHMARKS.md, "The read probe on huge
/// pages"). Without THP the bench still runs, on base pages.
fn huge_page_backed(bytes: usize) -> HugePageBuffer {
    HugePageBuffer::new(bytes).expect("anonymous mapping")
}

/// Activation rows per product (`AIRS_BENCH_TOKENS`, default 1: decode of one sequence; up to
/// 16, the batched decode of that many sequences).
fn tokens() -> usize {
    std::env::var("AIRS_BENCH_TOKENS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(1, |t| t.clamp(1, 16))
}

/// Whether chunks are handed out in turn (`AIRS_BENCH_SPLIT=interleaved`) rather than as one
/// contiguous run per thread.
fn interleaved() -> bool {
    std::env::var("AIRS_BENCH_SPLIT").is_ok_and(|v| v == "interleaved")
}

fn floats(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
        })
        .collect()
}

/// Whether several tokens' outputs are laid out as the engine's (`AIRS_BENCH_OUT=rows`); read
/// once, like the split.
fn engine_rows() -> bool {
    std::env::var("AIRS_BENCH_OUT").is_ok_and(|v| v == "rows")
}

/// Threads each case runs with, and the modes it runs in (module doc).
const THREADS: [usize; 2] = [1, 2];
const MODES: [&str; 4] = ["stream", "rows16", "matmul", "rowdot"];

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |label: &str| filters.iter().all(|f| label.contains(f.as_str()));
    let isa = Isa::detect();
    let interleaved = interleaved();
    let engine_rows = engine_rows();
    println!("{:<36} {:>10} {:>8}", "case", "µs/matvec", "GB/s");
    for (ty, rows, n) in CASES {
        let label =
            |threads: usize, mode: &str| format!("{} {rows}x{n} t{threads} {mode}", ty.name());
        // Build the rings only for a case some label of which is wanted.
        if !THREADS
            .iter()
            .any(|&t| MODES.iter().any(|m| wanted(&label(t, m))))
        {
            continue;
        }
        let wrb = row_bytes(ty, n).unwrap();
        let matrix = rows * wrb;
        let distinct: Vec<Vec<u8>> = (0..16)
            .map(|r| {
                let mut q = vec![0u8; wrb];
                quantize_row(ty, &floats(n, r), &mut q).unwrap();
                q
            })
            .collect();
        let copies = ring_bytes().div_ceil(matrix);
        let ring: Vec<HugePageBuffer> = (0..copies)
            .map(|c| {
                let mut m = huge_page_backed(matrix);
                for (r, row) in m.as_mut_slice().chunks_exact_mut(wrb).enumerate() {
                    row.copy_from_slice(&distinct[(r + c) % 16]);
                }
                m
            })
            .collect();
        // The same matrices in the rows16 layout the loader repacks into, where `ty` has one.
        let packed_ring: Vec<HugePageBuffer> = if rows16::has_layout(ty) {
            let group = rows16::GROUP_ROWS * wrb;
            ring.iter()
                .map(|m| {
                    let mut p = huge_page_backed(matrix);
                    for (src, dst) in m
                        .as_slice()
                        .chunks_exact(group)
                        .zip(p.as_mut_slice().chunks_exact_mut(group))
                    {
                        rows16::repack_group(ty, n, src, dst).unwrap();
                    }
                    p
                })
                .collect()
        } else {
            Vec::new()
        };
        let act = act_type(ty).unwrap();
        let tokens = tokens();
        let mut a = vec![0u8; tokens * act.row_bytes(n)];
        for (t, a) in a.chunks_exact_mut(act.row_bytes(n)).enumerate() {
            quantize_act(act, &floats(n, 99 + t as u64), a).unwrap();
        }
        for threads in THREADS {
            for mode in MODES {
                let label = label(threads, mode);
                let ring = if mode == "rows16" {
                    &packed_ring
                } else {
                    &ring
                };
                // `rowdot` is one activation row's per-row product.
                if !wanted(&label) || ring.is_empty() || (tokens > 1 && mode == "rowdot") {
                    continue;
                }
                let passes = 4;
                let mut best = f64::INFINITY;
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline || best.is_infinite() {
                    let barrier = Barrier::new(threads);
                    let elapsed = std::thread::scope(|s| {
                        let handles: Vec<_> = (0..threads)
                            .map(|me| {
                                let (barrier, ring, a) = (&barrier, &ring, &a);
                                s.spawn(move || {
                                    // Room for every token's row, starting on a cache line.
                                    let mut lines = vec![0f32; rows.max(CHUNK) * tokens + 16];
                                    let skip = lines.as_ptr().align_offset(64).min(16);
                                    let out = &mut lines[skip..];
                                    barrier.wait();
                                    let start = Instant::now();
                                    for _ in 0..passes {
                                        for m in ring.iter() {
                                            let geometry = (n, wrb, rows);
                                            run_one(
                                                isa,
                                                ty,
                                                geometry,
                                                (me, threads, interleaved),
                                                m.as_slice(),
                                                a,
                                                out,
                                                (mode, engine_rows),
                                            );
                                        }
                                    }
                                    black_box(&*out);
                                    start.elapsed()
                                })
                            })
                            .collect();
                        handles
                            .into_iter()
                            .map(|h| h.join().unwrap())
                            .max()
                            .unwrap()
                    });
                    let per = elapsed.as_secs_f64() / (passes * ring.len()) as f64;
                    best = best.min(per);
                }
                println!(
                    "{label:<36} {:>10.1} {:>8.2}",
                    best * 1e6,
                    matrix as f64 / best / 1e9
                );
            }
        }
    }
}

/// One matrix-vector product, this thread's share of the rows: thread `me` takes the `me`-th
/// contiguous run of chunks (the engine's runs without the stealing), or with `interleaved`
/// chunks me, me + threads, …; with `engine_rows`, several tokens' outputs laid out as the
/// engine's (module doc).
#[allow(clippy::too_many_arguments)]
fn run_one(
    isa: Isa,
    ty: GgmlType,
    (n, wrb, rows): (usize, usize, usize),
    (me, threads, interleaved): (usize, usize, bool),
    m: &[u8],
    a: &[u8],
    out: &mut [f32],
    (mode, engine_rows): (&str, bool),
) {
    // Several activation rows: each chunk's products go to the start of `out` (rows of CHUNK).
    let batched = a.len() > act_type(ty).unwrap().row_bytes(n);
    // The rows16 kernels' activation terms, once per product as the engine prepares them.
    let prepared = (mode == "rows16").then(|| rows16::Activations::new(isa, ty, n, a).unwrap());
    let chunks = rows.div_ceil(CHUNK);
    let per = chunks.div_ceil(threads);
    let (first, end, step) = if interleaved {
        (me, chunks, threads)
    } else {
        (me * per, ((me + 1) * per).min(chunks), 1)
    };
    if let Some(prepared) = prepared.as_ref().filter(|_| batched && engine_rows) {
        // The thread's whole share in one call, each token's outputs a row `rows` apart.
        let (r0, r1) = (first * CHUNK, (end * CHUNK).min(rows));
        if !interleaved && r0 < r1 {
            let w = &m[r0 * wrb..r1 * wrb];
            rows16::matmul_with(isa, black_box(w), prepared, &mut out[r0..], rows).unwrap();
            return;
        }
    }
    for c in (first..end).step_by(step) {
        let r0 = c * CHUNK;
        let r1 = (r0 + CHUNK).min(rows);
        let w = &m[r0 * wrb..r1 * wrb];
        let o = if batched {
            &mut out[..]
        } else {
            &mut out[r0..r1]
        };
        if mode == "stream" {
            out[r0] = xor_fold(isa, black_box(w)) as f32;
        } else if let Some(prepared) = &prepared {
            rows16::matmul_with(isa, black_box(w), prepared, o, r1 - r0).unwrap();
        } else if mode == "matmul" {
            matmul(isa, ty, n, black_box(w), black_box(a), o, r1 - r0).unwrap();
        } else {
            for (r, w) in w.chunks_exact(wrb).enumerate() {
                out[r0 + r] = dot(isa, ty, n, black_box(w), black_box(a)).unwrap();
            }
        }
    }
}
