//! Parallel helpers over the [`ThreadPool`]: a matrix product split by weight rows, and a
//! writer that lets chunks of one job fill disjoint parts of a shared output.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

use airs_kernels::{ActType, Isa, PreparedActs};

use crate::model::TensorRef;
use crate::pool::ThreadPool;

/// An output buffer that the chunks of a parallel job write disjoint parts of.
pub(crate) struct DisjointOut<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: `DisjointOut` is a `&mut [T]` split among threads; `slice` requires callers to
// touch disjoint ranges, so sharing it across threads is as safe as `split_at_mut`.
unsafe impl<T: Send> Send for DisjointOut<'_, T> {}
// SAFETY: as above: concurrent `slice` calls must name disjoint ranges.
unsafe impl<T: Send> Sync for DisjointOut<'_, T> {}

impl<'a, T> DisjointOut<'a, T> {
    pub(crate) fn new(out: &'a mut [T]) -> DisjointOut<'a, T> {
        DisjointOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _borrow: PhantomData,
        }
    }

    /// The elements `range` of the buffer.
    ///
    /// # Safety
    /// No two live slices obtained from this writer may overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, range: Range<usize>) -> &mut [T] {
        assert!(
            range.start <= range.end && range.end <= self.len,
            "range out of bounds"
        );
        // SAFETY: the range is inside the buffer (checked above), the buffer is mutably
        // borrowed for 'a, and the caller guarantees no other live slice overlaps it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

/// Rows of a rows16 group.
const G: usize = airs_kernels::rows16::GROUP_ROWS;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Repacked weight rows unpacked for the tiled prefill kernels.
    static NATURAL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Activations prepared for the tiled kernels, on the thread that calls `matmul`.
    static PREP: RefCell<PreparedActs> = RefCell::new(PreparedActs::new());
}

/// Activations quantized once per matmul input, per activation encoding.
#[derive(Default)]
pub(crate) struct QuantizedActs {
    /// (encoding, rows, bytes) of each encoding computed since the last `reset`.
    cached: Vec<(ActType, Vec<u8>)>,
}

impl QuantizedActs {
    /// Forget the cached encodings (the input changed).
    pub(crate) fn reset(&mut self) {
        for (_, buf) in &mut self.cached {
            buf.clear();
        }
    }

    /// `x` (`rows × cols` floats) encoded as `act`, computed at most once between resets.
    pub(crate) fn get(&mut self, pool: &ThreadPool, act: ActType, x: &[f32], cols: usize) -> &[u8] {
        let idx = match self.cached.iter().position(|(a, _)| *a == act) {
            Some(i) => i,
            None => {
                self.cached.push((act, Vec::new()));
                self.cached.len() - 1
            }
        };
        let buf = &mut self.cached[idx].1;
        if buf.is_empty() && !x.is_empty() {
            let rows = x.len() / cols;
            let row_bytes = act.row_bytes(cols);
            buf.resize(rows * row_bytes, 0);
            let writer = DisjointOut::new(buf);
            pool.for_chunks(rows, 4, &|range| {
                // SAFETY: chunks partition the rows, so their byte ranges are disjoint.
                let out = unsafe { writer.slice(range.start * row_bytes..range.end * row_bytes) };
                for (r, o) in range.zip(out.chunks_exact_mut(row_bytes)) {
                    airs_kernels::quantize_act(act, &x[r * cols..(r + 1) * cols], o)
                        .expect("activation row geometry");
                }
            });
        }
        &self.cached[idx].1
    }
}

/// `out[t][r] = W[r] · x[t]` for all rows `r` of `w` and the `tokens` activation rows in
/// `acts` (already in `w`'s activation encoding), split across the pool by row chunks.
pub(crate) fn matmul(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    w: &TensorRef,
    acts: &[u8],
    tokens: usize,
    out: &mut [f32],
) {
    let rows = w.rows;
    debug_assert_eq!(out.len(), tokens * rows);
    let data = w.data(image);
    let threads = pool.threads();
    // Repacked matrices: the rows16 kernels up to 16 tokens; beyond, the tiled kernels (faster
    // on long prompts: BENCHMARKS.md) over groups unpacked per call, where they exist.
    let packed = w.packed.is_some();
    if tokens > 1 && !(packed && tokens <= G) {
        let done = PREP.with(|prep| {
            let mut prep = prep.borrow_mut();
            let ready = airs_kernels::layout_prepared_acts(isa, w.ty, w.cols, tokens, &mut prep)
                .expect("matmul geometry checked at model load");
            if ready {
                prepare_acts(pool, w, acts, tokens, &mut prep);
                matmul_prepared(pool, isa, w, data, &prep, tokens, out);
            }
            ready
        });
        if done {
            return;
        }
    }
    if packed {
        matmul_packed(pool, isa, w, data, acts, tokens, out);
        return;
    }
    // Enough chunks for balance on a noisy machine, each a multiple of the kernels' 16-row
    // tiles.
    let chunk = if threads == 1 {
        rows
    } else {
        (rows / (threads * 8)).next_multiple_of(16).max(16)
    };
    let act_row_bytes = acts.len() / tokens.max(1);
    let writer = DisjointOut::new(out);
    pool.for_chunks(rows, chunk, &|range| {
        let w_rows = &data[range.start * w.row_bytes..range.end * w.row_bytes];
        let width = range.len();
        if tokens == 1 {
            // SAFETY: chunks partition 0..rows, so each output range is written by one chunk.
            let o = unsafe { writer.slice(range.clone()) };
            airs_kernels::matmul(isa, w.ty, w.cols, w_rows, acts, o, width)
                .expect("matmul geometry checked at model load");
            return;
        }
        TILE.with(|tile| {
            let mut tile = tile.borrow_mut();
            tile.resize(tokens * width, 0.0);
            airs_kernels::matmul(
                isa,
                w.ty,
                w.cols,
                w_rows,
                &acts[..tokens * act_row_bytes],
                &mut tile,
                width,
            )
            .expect("matmul geometry checked at model load");
            for t in 0..tokens {
                let start = t * rows + range.start;
                // SAFETY: row ranges of different chunks are disjoint within every token row.
                let o = unsafe { writer.slice(start..start + width) };
                o.copy_from_slice(&tile[t * width..(t + 1) * width]);
            }
        });
    });
}

/// Fill `prep` (laid out for `tokens` rows of `w`'s activations) from `acts`, token groups
/// split across the pool.
fn prepare_acts(
    pool: &ThreadPool,
    w: &TensorRef,
    acts: &[u8],
    tokens: usize,
    prep: &mut PreparedActs,
) {
    let group_bytes = prep.group_bytes();
    let groups = prep.groups();
    let acts = &acts[..acts.len() / tokens.max(1) * tokens];
    let writer = DisjointOut::new(prep.bytes_mut());
    pool.for_chunks(groups, 4, &|range| {
        // SAFETY: chunks partition the groups, so their byte ranges are disjoint.
        let dst = unsafe { writer.slice(range.start * group_bytes..range.end * group_bytes) };
        airs_kernels::prepare_act_groups(w.ty, w.cols, acts, range.start, dst)
            .expect("matmul geometry checked at model load");
    });
}

/// The tiled product of all rows of `w` with the prepared activations: row chunks that are
/// multiples of the kernels' 16-row tiles, each chunk computed into a per-thread tile and
/// copied to its columns of `out` (`tokens × rows`).
fn matmul_prepared(
    pool: &ThreadPool,
    isa: Isa,
    w: &TensorRef,
    data: &[u8],
    prep: &PreparedActs,
    tokens: usize,
    out: &mut [f32],
) {
    let rows = w.rows;
    let chunk = (rows / (pool.threads() * 4)).next_multiple_of(16).max(16);
    let writer = DisjointOut::new(out);
    pool.for_chunks(rows, chunk, &|range| {
        let w_rows = &data[range.start * w.row_bytes..range.end * w.row_bytes];
        let width = range.len();
        TILE.with(|tile| {
            let mut tile = tile.borrow_mut();
            tile.resize(tokens * width, 0.0);
            if w.packed.is_some() {
                // One 16-row group at a time, unpacked into a cache-resident buffer just
                // before the tiled kernel repacks it.
                NATURAL.with(|natural| {
                    let mut natural = natural.borrow_mut();
                    for r0 in range.clone().step_by(G) {
                        let r1 = (r0 + G).min(range.end);
                        let rows = unpack_group(
                            w,
                            r0,
                            &data[r0 * w.row_bytes..r1 * w.row_bytes],
                            &mut natural,
                        );
                        let o = &mut tile[r0 - range.start..];
                        airs_kernels::matmul_prepared(isa, w.ty, w.cols, rows, prep, o, width)
                            .expect("matmul geometry checked at model load");
                    }
                });
            } else {
                airs_kernels::matmul_prepared(isa, w.ty, w.cols, w_rows, prep, &mut tile, width)
                    .expect("matmul geometry checked at model load");
            }
            for t in 0..tokens {
                let start = t * rows + range.start;
                // SAFETY: row ranges of different chunks are disjoint within every token row.
                let o = unsafe { writer.slice(start..start + width) };
                o.copy_from_slice(&tile[t * width..(t + 1) * width]);
            }
        });
    });
}

/// The rows `first ..` of `w` (their bytes `w_rows`: one group or the final partial one) in
/// the file's layout: a repacked group unpacked into `buf`, any other returned as it is.
fn unpack_group<'a>(
    w: &TensorRef,
    first: usize,
    w_rows: &'a [u8],
    buf: &'a mut Vec<u8>,
) -> &'a [u8] {
    if !w.is_packed(first / G) {
        return w_rows;
    }
    buf.resize(w_rows.len(), 0);
    airs_kernels::rows16::unpack_group(w.ty, w.cols, w_rows, buf)
        .expect("repacked geometry checked by the plan");
    buf
}

/// [`matmul`] of a matrix the loader repacked (see [`crate::repack`]): row chunks of whole
/// 16-row groups, each split into runs of repacked groups (the rows16 kernels, any number of
/// tokens) and of groups in the file's layout (the ordinary kernels). Both are bit-identical
/// to the scalar reference, so the split never shows in the results.
fn matmul_packed(
    pool: &ThreadPool,
    isa: Isa,
    w: &TensorRef,
    data: &[u8],
    acts: &[u8],
    tokens: usize,
    out: &mut [f32],
) {
    let rows = w.rows;
    let chunk = (rows / (pool.threads() * 8)).next_multiple_of(G).max(G);
    let act_row_bytes = acts.len() / tokens.max(1);
    let acts = &acts[..tokens * act_row_bytes];
    // The rows16 kernels' per-block activation terms, once for every chunk and thread.
    let prepared = airs_kernels::rows16::Activations::new(isa, w.ty, w.cols, acts)
        .expect("matmul geometry checked at model load");
    let writer = DisjointOut::new(out);
    pool.for_chunks(rows, chunk, &|range| {
        let mut r0 = range.start;
        while r0 < range.end {
            let packed = w.is_packed(r0 / G);
            let mut r1 = (r0 + G).min(range.end);
            while r1 < range.end && w.is_packed(r1 / G) == packed {
                r1 = (r1 + G).min(range.end);
            }
            let w_rows = &data[r0 * w.row_bytes..r1 * w.row_bytes];
            let width = r1 - r0;
            let run = |o: &mut [f32], stride: usize| {
                airs_kernels::matmul(isa, w.ty, w.cols, w_rows, acts, o, stride)
                    .expect("matmul geometry checked at model load");
            };
            if packed {
                // Straight into each token's row of `out`: no staging tile.
                let mut outs: Vec<&mut [f32]> = (0..tokens)
                    .map(|t| {
                        let start = t * rows + r0;
                        // SAFETY: runs of different chunks are disjoint within every token
                        // row, and the token rows are disjoint.
                        unsafe { writer.slice(start..start + width) }
                    })
                    .collect();
                airs_kernels::rows16::matmul_rows(isa, w_rows, &prepared, &mut outs)
                    .expect("matmul geometry checked at model load");
            } else if tokens == 1 {
                // SAFETY: chunks partition 0..rows and runs partition each chunk.
                run(unsafe { writer.slice(r0..r1) }, width);
            } else if tokens <= G && width.is_multiple_of(G) {
                // Whole groups left in the file's layout (at load-chunk boundaries: ~2 % of
                // the rows with 2 MiB chunks): repacked here, one at a time, for the rows16
                // kernel — preparing every token's activations for the tiled kernels cost
                // ~4 % of a 16-sequence decode step for these few rows (profiled), and the
                // one-token kernel token by token more.
                NATURAL.with(|packed| {
                    let mut packed = packed.borrow_mut();
                    let group_bytes = G * w.row_bytes;
                    packed.resize(group_bytes, 0);
                    for g0 in (r0..r1).step_by(G) {
                        let natural = &data[g0 * w.row_bytes..(g0 + G) * w.row_bytes];
                        airs_kernels::rows16::repack_group(w.ty, w.cols, natural, &mut packed)
                            .expect("a repacked matrix's type has the layout");
                        let mut outs: Vec<&mut [f32]> = (0..tokens)
                            .map(|t| {
                                let start = t * rows + g0;
                                // SAFETY: as above: this group's columns of each token row.
                                unsafe { writer.slice(start..start + G) }
                            })
                            .collect();
                        airs_kernels::rows16::matmul_rows(isa, &packed, &prepared, &mut outs)
                            .expect("matmul geometry checked at model load");
                    }
                });
            } else {
                TILE.with(|tile| {
                    let mut tile = tile.borrow_mut();
                    tile.resize(tokens * width, 0.0);
                    run(&mut tile, width);
                    for t in 0..tokens {
                        let start = t * rows + r0;
                        // SAFETY: runs of different chunks are disjoint within every token row.
                        let o = unsafe { writer.slice(start..start + width) };
                        o.copy_from_slice(&tile[t * width..(t + 1) * width]);
                    }
                });
            }
            r0 = r1;
        }
    });
}
