//! Parallel helpers over the [`ThreadPool`]: a matrix product split by weight rows, and a
//! writer that lets chunks of one job fill disjoint parts of a shared output.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use airs_kernels::{ActType, Isa, PreparedActs};

use crate::model::TensorRef;
#[cfg(test)]
use crate::pool::ChunksPerThread;
use crate::pool::{ReadAhead, Take, ThreadPool};

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

/// What a pool job does: bytes it reads (weights, activations, KV rows) and multiply-adds.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    pub(crate) bytes: usize,
    pub(crate) macs: usize,
}

impl std::ops::Add for Work {
    type Output = Work;

    fn add(self, other: Work) -> Work {
        Work {
            bytes: self.bytes + other.bytes,
            macs: self.macs + other.macs,
        }
    }
}

impl std::iter::Sum for Work {
    fn sum<I: Iterator<Item = Work>>(jobs: I) -> Work {
        jobs.fold(Work::default(), |a, b| a + b)
    }
}

impl Work {
    /// A job that reads fewer bytes than this and does fewer multiply-adds than
    /// [`Self::INLINE_MACS`] runs on the calling thread: its microseconds are less than handing
    /// chunks to a worker, which takes a wake-up when the worker has gone to sleep, and on a
    /// virtual machine waking a vCPU can take hundreds of microseconds (stories260K, whose
    /// products read 16-128 KiB of f32 weights, decoded at 1.3 k tokens/s with 2 threads and
    /// 13 k with 1 on such a host: BENCHMARKS.md). Every matrix of the real models this project
    /// serves reads more.
    pub(crate) const INLINE_BYTES: usize = 256 << 10;
    /// About 10-60 µs on one core: a few rows of a small matrix (stories260K's drafts and
    /// prompts) stay on it, where the worker would have to be woken for them alone.
    pub(crate) const INLINE_MACS: usize = 2 << 20;

    pub(crate) fn bytes(bytes: usize) -> Work {
        Work { bytes, macs: 0 }
    }

    /// What one f32 multiply-add costs in the int8 multiply-adds [`Self::INLINE_MACS`]
    /// counts: a 256-bit fused multiply-add does 8 where `vpmaddubsw` does 32, and one query's
    /// attention ran at 10-20 G a second on one Zen 3 core (`cargo bench -p airs-engine
    /// --bench attention`) where the int8 products run at ~100. Counted as int8 ones,
    /// Qwen2.5's decode attention stayed on the calling thread up to 512 positions (its bytes
    /// decided), up to ~47 µs a layer while the worker spun (two KV heads at 46 ns a position
    /// each in that bench's "qwen2.5 f16 2048", from L3); at this cost it is dealt from 147 on.
    /// Alternated within one run (`airs bench decode --prompt-tokens 16 --gen-tokens 512`, a
    /// throwaway build switching the cost between 1 and 8), steps took 1-4 % less time with 8
    /// in every window of 256 on Qwen2.5 and TinyLlama Q4_K_M (BENCHMARKS.md). stories260K's
    /// attention (8 heads of 8 values) stays inline up to 2,047 positions of its 2,048.
    pub(crate) const F32_MAC_COST: usize = 8;

    /// Attention that reads `bytes` of K and V rows and does `f32_macs` f32 multiply-adds.
    pub(crate) fn attention(bytes: usize, f32_macs: usize) -> Work {
        Work {
            bytes,
            macs: f32_macs * Self::F32_MAC_COST,
        }
    }

    /// The product of `tokens` input rows with `w`: its weights read once, a multiply-add per
    /// weight and input row.
    pub(crate) fn product(w: &TensorRef, tokens: usize) -> Work {
        Work {
            bytes: w.rows * w.row_bytes,
            macs: w.rows * w.cols * tokens,
        }
    }

    fn inline(&self) -> bool {
        self.bytes < Self::INLINE_BYTES && self.macs < Self::INLINE_MACS
    }
}

/// `f` over `0..items` in chunks of `chunk` on the pool's threads, each thread taking its own
/// run as `take` says and then prefetching what `ahead` says it reads next, or all of it at
/// once on this thread when `work` is small ([`Work::INLINE_BYTES`]).
pub(crate) fn for_chunks_of(
    pool: &ThreadPool,
    items: usize,
    chunk: usize,
    take: Take,
    work: Work,
    ahead: &[ReadAhead],
    f: &(dyn Fn(Range<usize>) + Sync),
) {
    if work.inline() {
        if items > 0 {
            f(0..items);
        }
        return;
    }
    pool.for_chunks_as(items, chunk, take, ahead, f);
}

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
    /// Each encoding's buffer, and how many of its bytes hold the current input's encoding
    /// (0: not computed since the last `reset`). The buffers keep their length from input to
    /// input, so a new input is written over the old without being zeroed first.
    cached: Vec<(ActType, Vec<u8>, usize)>,
}

impl QuantizedActs {
    /// Forget the cached encodings (the input changed).
    pub(crate) fn reset(&mut self) {
        for (_, _, len) in &mut self.cached {
            *len = 0;
        }
    }

    /// Encode `x` (whole rows of `w.cols` floats) in `w`'s activation encoding, unless that
    /// encoding is already cached.
    pub(crate) fn encode(&mut self, pool: &ThreadPool, w: &TensorRef, x: &[f32]) {
        let (act, cols) = (act_of(w), w.cols);
        let idx = match self.cached.iter().position(|(a, _, _)| *a == act) {
            Some(i) => i,
            None => {
                self.cached.push((act, Vec::new(), 0));
                self.cached.len() - 1
            }
        };
        let (_, buf, len) = &mut self.cached[idx];
        if *len == 0 && !x.is_empty() {
            let rows = x.len() / cols;
            let row_bytes = act.row_bytes(cols);
            *len = rows * row_bytes;
            if buf.len() < *len {
                buf.resize(*len, 0);
            }
            let writer = DisjointOut::new(&mut buf[..*len]);
            let work = Work::bytes(std::mem::size_of_val(x));
            for_chunks_of(pool, rows, 4, Take::OneByOne, work, &[], &|range| {
                // SAFETY: chunks partition the rows, so their byte ranges are disjoint.
                let out = unsafe { writer.slice(range.start * row_bytes..range.end * row_bytes) };
                for (r, o) in range.zip(out.chunks_exact_mut(row_bytes)) {
                    airs_kernels::quantize_act(act, &x[r * cols..(r + 1) * cols], o)
                        .expect("activation row geometry");
                }
            });
        }
    }

    /// The product of `w` with the input, which [`QuantizedActs::encode`] encoded for `w`
    /// since the last reset, into `out`.
    pub(crate) fn product<'a>(&'a self, w: &'a TensorRef, out: &'a mut [f32]) -> Product<'a> {
        let act = act_of(w);
        let acts = self
            .cached
            .iter()
            .find(|(a, _, _)| *a == act)
            .map(|(_, buf, len)| &buf[..*len])
            .expect("activations encoded before use");
        Product { w, acts, out }
    }
}

/// The activation encoding `w`'s kernels read.
fn act_of(w: &TensorRef) -> ActType {
    airs_kernels::act_type(w.ty).expect("type checked at model load")
}

/// One matrix product: `out[t][r] = W[r] · x[t]` for all rows `r` of `w` and the `tokens`
/// input rows, given as `acts` (already in `w`'s activation encoding).
pub(crate) struct Product<'a> {
    pub(crate) w: &'a TensorRef,
    pub(crate) acts: &'a [u8],
    pub(crate) out: &'a mut [f32],
}

/// The product `p` over `tokens` input rows, split across the pool by row chunks.
pub(crate) fn matmul(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    tokens: usize,
    p: &mut Product<'_>,
    ahead: &[ReadAhead],
) {
    matmul_after(pool, isa, image, tokens, p, None, ahead);
}

/// [`matmul`], right after a product on this thread that prepared the tiled kernels'
/// activations from `prepared` (what this function returned for it): when this product reads
/// the same input and the tiled kernels serve it with the same activation layout (q, k and v
/// of one type kind; gate and up), those activations are used again instead of prepared anew.
/// Returns the input whose preparation this thread's buffer now holds, if any.
fn matmul_after<'a>(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    tokens: usize,
    p: &mut Product<'a>,
    prepared: Option<&[u8]>,
    ahead: &[ReadAhead],
) -> Option<&'a [u8]> {
    let (w, acts) = (p.w, p.acts);
    let same_input = prepared.is_some_and(|prev| std::ptr::eq(prev, acts));
    if !by_rows(isa, w, tokens)
        && matmul_tiled(pool, isa, image, w, acts, tokens, p.out, same_input)
    {
        return Some(acts);
    }
    let out = &mut *p.out;
    let job = RowJob::new(isa, image, tokens, Product { w, acts, out }, &[]);
    let chunk = RowDeal::rows_per_chunk_alone(pool, tokens, w.rows, w.row_bytes);
    for_chunks_of(
        pool,
        w.rows,
        chunk,
        Take::InBites,
        job.work(),
        ahead,
        &|range| job.compute(range),
    );
    None
}

/// Several products of the same `tokens` input rows (q, k and v) in one pool job when the
/// row kernels serve them all (decode: one token, or up to 16 of a repacked matrix): their row
/// chunks form one list the pool deals out, so the threads meet at one barrier, not one per
/// matrix. Qwen2.5-0.5B decodes a token in ~13 ms through 169 products (7 per layer and the
/// output), and every barrier waits for the slowest thread. Otherwise (the tiled prefill
/// kernels) they run one after another, sharing prepared activations where they fit.
pub(crate) fn matmuls(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    tokens: usize,
    products: Vec<Product<'_>>,
    ahead: &[ReadAhead],
) {
    if !products.iter().all(|p| by_rows(isa, p.w, tokens)) {
        let mut prepared = None;
        let last = products.len().saturating_sub(1);
        for (i, mut p) in products.into_iter().enumerate() {
            // The next job's reads follow the last product only.
            let ahead = if i == last { ahead } else { &[] };
            prepared = matmul_after(pool, isa, image, tokens, &mut p, prepared, ahead);
        }
        return;
    }
    let mut jobs: Vec<RowJob<'_>> = Vec::with_capacity(products.len());
    for p in products {
        let job = RowJob::new(isa, image, tokens, p, &jobs);
        jobs.push(job);
    }
    let deal = RowDeal::on(pool, tokens, jobs.iter().map(|j| (j.w.rows, j.w.row_bytes)));
    let work = jobs.iter().map(RowJob::work).sum();
    for_chunks_of(
        pool,
        deal.chunks(),
        1,
        Take::InBites,
        work,
        ahead,
        &|range| {
            for c in range {
                let (i, start) = deal.chunk(c);
                let rows = jobs[i].w.rows;
                jobs[i].compute(start..(start + deal.rows_per_chunk[i]).min(rows));
            }
        },
    );
}

/// `gate` and `up` (products with the same rows) and the gated activation
/// `gate = act(gate, up)`, which `act` applies to equal slices of the two. With the row
/// kernels, one pool job: each chunk computes its rows of both and activates them at once, so
/// the activation costs no job of its own. Otherwise the products, then the activation in
/// chunks. Every element is computed the same way either way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_gated(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    tokens: usize,
    mut gate: Product<'_>,
    mut up: Product<'_>,
    act: &(dyn Fn(&mut [f32], &[f32]) + Sync),
    ahead: &[ReadAhead],
) {
    debug_assert_eq!(gate.w.rows, up.w.rows);
    if !(by_rows(isa, gate.w, tokens) && by_rows(isa, up.w, tokens)) {
        let prepared = matmul_after(pool, isa, image, tokens, &mut gate, None, &[]);
        matmul_after(pool, isa, image, tokens, &mut up, prepared, &[]);
        const CHUNK: usize = 4096;
        let up = &*up.out;
        let writer = DisjointOut::new(gate.out);
        pool.for_chunks(up.len(), CHUNK, &|range| {
            // SAFETY: `for_chunks` hands every index range to exactly one call.
            act(unsafe { writer.slice(range.clone()) }, &up[range]);
        });
        return;
    }
    let rows = gate.w.rows;
    let gate = RowJob::new(isa, image, tokens, gate, &[]);
    let up = RowJob::new(isa, image, tokens, up, std::slice::from_ref(&gate));
    let work = gate.work() + up.work();
    // A chunk computes the same rows of both.
    let row_bytes = gate.w.row_bytes + up.w.row_bytes;
    let chunk = RowDeal::rows_per_chunk_alone(pool, tokens, rows, row_bytes);
    for_chunks_of(pool, rows, chunk, Take::InBites, work, ahead, &|range| {
        gate.compute(range.clone());
        up.compute(range.clone());
        for t in 0..tokens {
            let at = t * rows + range.start..t * rows + range.end;
            // SAFETY: chunks partition the rows, so this chunk alone touches these columns
            // of every token row of both outputs, and its products above are done.
            let (g, u) = unsafe { (gate.out.slice(at.clone()), up.out.slice(at)) };
            act(g, u);
        }
    });
}

/// Whether a product of `tokens` rows with `w` runs on the row kernels ([`RowJob`]): one token, or
/// up to a group's worth of a repacked matrix, or any number where the rows16 kernels run on AMX
/// tiles (16 rows at a time: 1.2-1.75× the VNNI kernels from 10 rows on; TinyLlama's 512-token
/// prompts 8-13 % faster than on the tiled kernels, Qwen2.5's within the noise, BENCHMARKS.md).
/// Longer inputs take the tiled kernels where the type has them ([`matmul_tiled`]).
fn by_rows(isa: Isa, w: &TensorRef, tokens: usize) -> bool {
    tokens == 1
        || (w.packed.is_some() && (tokens <= G || airs_kernels::rows16::tiles_serve(isa, w.ty)))
}

/// The product on the tiled kernels, if `w`'s type has them and `tokens` makes them pay:
/// activations prepared once on the calling thread's buffer (or, with `same_input`, kept from
/// the product just before, which read the same `acts`, when they fit `w`), then row chunks
/// over the pool. Returns whether it ran.
#[allow(clippy::too_many_arguments)]
fn matmul_tiled(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    w: &TensorRef,
    acts: &[u8],
    tokens: usize,
    out: &mut [f32],
    same_input: bool,
) -> bool {
    PREP.with(|prep| {
        let mut prep = prep.borrow_mut();
        let kept = same_input && prep.fits(w.ty, w.cols, tokens);
        let ready = kept
            || airs_kernels::layout_prepared_acts(isa, w.ty, w.cols, tokens, &mut prep)
                .expect("matmul geometry checked at model load");
        if ready {
            if !kept {
                prepare_acts(pool, w, acts, tokens, &mut prep);
            }
            matmul_prepared(pool, isa, w, w.data(image), &prep, tokens, out);
        }
        ready
    })
}

/// A product on the row kernels, computed in row chunks of whole 16-row groups: each chunk
/// split into runs of repacked groups (the rows16 kernels, see [`crate::repack`]) and of rows
/// in the file's layout (the ordinary kernels). Both are bit-identical to the scalar reference,
/// so neither the split nor the chunking shows in the results.
struct RowJob<'a> {
    isa: Isa,
    w: &'a TensorRef,
    data: &'a [u8],
    /// The whole input rows.
    acts: &'a [u8],
    tokens: usize,
    /// The rows16 kernels' per-block activation terms, once for every chunk and thread (a
    /// repacked matrix only), and shared with the other products of one pool job that read
    /// the same input with the same weight type (q/k/v, gate/up).
    prepared: Option<Arc<airs_kernels::rows16::Activations<'a>>>,
    out: DisjointOut<'a, f32>,
}

impl<'a> RowJob<'a> {
    /// The job of product `p`; its activation terms taken from one of `earlier` (jobs of the
    /// same pool job) that prepared them for the same input and weight type, else computed.
    fn new(
        isa: Isa,
        image: &'a [u8],
        tokens: usize,
        p: Product<'a>,
        earlier: &[RowJob<'a>],
    ) -> RowJob<'a> {
        let w = p.w;
        let act_row_bytes = p.acts.len() / tokens.max(1);
        let acts = &p.acts[..tokens * act_row_bytes];
        let prepared = w.packed.as_ref().map(|_| {
            let shared = earlier
                .iter()
                .find(|j| j.w.ty == w.ty && j.w.cols == w.cols && std::ptr::eq(j.acts, acts));
            match shared.and_then(|j| j.prepared.as_ref()) {
                Some(terms) => Arc::clone(terms),
                None => Arc::new(
                    airs_kernels::rows16::Activations::new(isa, w.ty, w.cols, acts)
                        .expect("matmul geometry checked at model load"),
                ),
            }
        });
        debug_assert_eq!(p.out.len(), tokens * w.rows);
        RowJob {
            isa,
            w,
            data: w.data(image),
            acts,
            tokens,
            prepared,
            out: DisjointOut::new(p.out),
        }
    }

    fn work(&self) -> Work {
        Work::product(self.w, self.tokens)
    }

    /// Rows `range` (starting at a group) of the product, for every token.
    fn compute(&self, range: Range<usize>) {
        for (rows, packed) in layout_runs(self.w, range) {
            self.run(rows, packed);
        }
    }

    /// Rows `r0..r1`, all repacked or all in the file's layout.
    fn run(&self, Range { start: r0, end: r1 }: Range<usize>, packed: bool) {
        let (w, isa, tokens, rows) = (self.w, self.isa, self.tokens, self.w.rows);
        let w_rows = &self.data[r0 * w.row_bytes..r1 * w.row_bytes];
        let width = r1 - r0;
        // Group columns `g0..g0 + width` of every token row of the output.
        let token_outs = |g0: usize, width: usize| -> Vec<&mut [f32]> {
            (0..tokens)
                .map(|t| {
                    let start = t * rows + g0;
                    // SAFETY: runs of different chunks are disjoint within every token row,
                    // and the token rows are disjoint.
                    unsafe { self.out.slice(start..start + width) }
                })
                .collect()
        };
        match &self.prepared {
            Some(prepared) if packed => {
                // Straight into each token's row of `out`: no staging tile.
                airs_kernels::rows16::matmul_rows(
                    isa,
                    w_rows,
                    prepared,
                    &mut token_outs(r0, width),
                )
                .expect("matmul geometry checked at model load");
            }
            _ if tokens == 1 && airs_kernels::matmul_matches_scalar(isa, w.ty) => {
                // SAFETY: chunks partition 0..rows and runs partition each chunk.
                let out = unsafe { self.out.slice(r0..r1) };
                airs_kernels::matmul(isa, w.ty, w.cols, w_rows, self.acts, out, width)
                    .expect("matmul geometry checked at model load");
            }
            Some(prepared)
                if width.is_multiple_of(G)
                    && (tokens <= G || !airs_kernels::matmul_matches_scalar(isa, w.ty)) =>
            {
                // Whole groups of a repacked matrix left in the file's layout (those that
                // straddle a load chunk and are over an eighth of it: none at the default
                // 2 MiB chunks, see `crate::repack`): repacked here, one at a time, for the
                // rows16 kernel — preparing every token's activations for the tiled kernels
                // cost ~4 % of a 16-sequence decode step for such rows (profiled), and the
                // one-token kernel token by token more. Where the file-layout kernels do not
                // sum as the scalar reference does (AVX2), always, so that every whole group
                // of a repacked matrix gives the reference's bits whatever its layout.
                NATURAL.with(|packed| {
                    let mut packed = packed.borrow_mut();
                    packed.resize(G * w.row_bytes, 0);
                    for g0 in (r0..r1).step_by(G) {
                        let natural = &self.data[g0 * w.row_bytes..(g0 + G) * w.row_bytes];
                        airs_kernels::rows16::repack_group(w.ty, w.cols, natural, &mut packed)
                            .expect("a repacked matrix's type has the layout");
                        airs_kernels::rows16::matmul_rows(
                            isa,
                            &packed,
                            prepared,
                            &mut token_outs(g0, G),
                        )
                        .expect("matmul geometry checked at model load");
                    }
                });
            }
            _ if tokens == 1 => {
                // SAFETY: chunks partition 0..rows and runs partition each chunk.
                let out = unsafe { self.out.slice(r0..r1) };
                airs_kernels::matmul(isa, w.ty, w.cols, w_rows, self.acts, out, width)
                    .expect("matmul geometry checked at model load");
            }
            _ => TILE.with(|tile| {
                let mut tile = tile.borrow_mut();
                tile.resize(tokens * width, 0.0);
                airs_kernels::matmul(isa, w.ty, w.cols, w_rows, self.acts, &mut tile, width)
                    .expect("matmul geometry checked at model load");
                for (o, t) in token_outs(r0, width)
                    .into_iter()
                    .zip(tile.chunks_exact(width))
                {
                    o.copy_from_slice(t);
                }
            }),
        }
    }
}

/// Bytes of weights a chunk of a pool job reading `bytes` of them on `threads` threads holds:
/// an equal share, `chunks_per_thread` shares a thread (the pool's
/// [`ChunksPerThread`](crate::pool::ChunksPerThread) for the job's input rows).
fn chunk_share(bytes: usize, chunks_per_thread: usize, threads: usize) -> usize {
    bytes / (threads * chunks_per_thread).max(1)
}

/// Rows of `row_bytes` bytes that make up a chunk of `share` bytes: whole groups, at least one.
fn rows_per_chunk(share: usize, row_bytes: usize) -> usize {
    (share / row_bytes.max(1)).next_multiple_of(G).max(G)
}

/// How the row chunks of one pool job over one or more products are laid out ([`matmul`],
/// [`matmuls`], [`matmul_gated`]): the products' chunks in one list, product by product.
#[derive(Debug, PartialEq, Eq)]
struct RowDeal {
    /// Rows a chunk of each product holds: a share of the whole job's bytes, not of each
    /// product's, so that one thread's run is not all of q while the other's is the small k
    /// and v and whatever it takes back from q (steps of one token and of four 0-1.5 % faster
    /// on TinyLlama-1.1B and Qwen2.5-0.5B, BENCHMARKS.md).
    rows_per_chunk: Vec<usize>,
    /// Product `i`'s chunks are `first[i]..first[i + 1]` of the list.
    first: Vec<usize>,
}

impl RowDeal {
    /// The deal of the products `shapes` (rows, bytes a row) on `pool` for `tokens` input rows.
    fn on(
        pool: &ThreadPool,
        tokens: usize,
        shapes: impl Iterator<Item = (usize, usize)> + Clone,
    ) -> RowDeal {
        RowDeal::new(shapes, pool.chunks_per_thread().of(tokens), pool.threads())
    }

    /// Rows a chunk holds when one product of `rows` rows of `row_bytes` is dealt alone on
    /// `pool` (what [`RowDeal::on`] gives it, without the lists).
    fn rows_per_chunk_alone(
        pool: &ThreadPool,
        tokens: usize,
        rows: usize,
        row_bytes: usize,
    ) -> usize {
        let per_thread = pool.chunks_per_thread().of(tokens);
        rows_per_chunk(
            chunk_share(rows * row_bytes, per_thread, pool.threads()),
            row_bytes,
        )
    }

    /// The deal of the products `shapes` in `chunks_per_thread` chunks a thread on `threads`.
    fn new(
        shapes: impl Iterator<Item = (usize, usize)> + Clone,
        chunks_per_thread: usize,
        threads: usize,
    ) -> RowDeal {
        let bytes = shapes
            .clone()
            .map(|(rows, row_bytes)| rows * row_bytes)
            .sum();
        let share = chunk_share(bytes, chunks_per_thread, threads);
        let mut deal = RowDeal {
            rows_per_chunk: Vec::new(),
            first: vec![0],
        };
        for (rows, row_bytes) in shapes {
            let chunk = rows_per_chunk(share, row_bytes);
            deal.rows_per_chunk.push(chunk);
            deal.first.push(deal.chunks() + rows.div_ceil(chunk));
        }
        deal
    }

    /// Chunks in the list.
    fn chunks(&self) -> usize {
        self.first.last().copied().unwrap_or(0)
    }

    /// The product chunk `c` of the list belongs to, and its first row.
    fn chunk(&self, c: usize) -> (usize, usize) {
        let i = self.first.partition_point(|&f| f <= c) - 1;
        (i, (c - self.first[i]) * self.rows_per_chunk[i])
    }
}

/// The row products of the pool job after the current one, for [`read_ahead`].
pub(crate) enum Upcoming<'a> {
    /// Products of one input dealt as one list ([`matmuls`]; one of them: [`matmul`]).
    Products(&'a [&'a TensorRef]),
    /// Gate and up, a chunk holding the same rows of both ([`matmul_gated`]).
    Gated(&'a TensorRef, &'a TensorRef),
}

/// What each of the pool's threads reads first in `next` of `tokens` input rows, up to the
/// pool's [`ThreadPool::read_ahead_bytes`]: the front of its own run of the next job's row
/// chunks. Nothing when `next` does not run on the row kernels (the tiled kernels deal their
/// tiles otherwise).
pub(crate) fn read_ahead(
    pool: &ThreadPool,
    isa: Isa,
    image: &[u8],
    tokens: usize,
    next: &Upcoming<'_>,
) -> Vec<ReadAhead> {
    let (products, gated): (&[&TensorRef], _) = match next {
        Upcoming::Products(ws) => (ws, None),
        Upcoming::Gated(gate, up) => (std::slice::from_ref(gate), Some(*up)),
    };
    let bytes = pool.read_ahead_bytes();
    let row_kernels = products
        .iter()
        .chain(gated.as_ref())
        .all(|w| by_rows(isa, w, tokens));
    if pool.threads() == 1 || bytes == 0 || !row_kernels {
        return Vec::new();
    }
    let shapes = products
        .iter()
        .map(|w| (w.rows, w.row_bytes + gated.map_or(0, |up| up.row_bytes)));
    let deal = RowDeal::on(pool, tokens, shapes);
    let from = |w: &TensorRef, row: usize, bytes: usize| {
        let data = w.data(image);
        let at = (row * w.row_bytes).min(data.len());
        (data[at..].as_ptr(), bytes.min(data.len() - at))
    };
    pool.first_chunks(deal.chunks())
        .map(|c| {
            if c >= deal.chunks() {
                return ReadAhead::default();
            }
            let (i, row) = deal.chunk(c);
            let w = products[i];
            match gated {
                None => ReadAhead::new(&[from(w, row, bytes)]),
                Some(up) => {
                    let gate_bytes = bytes * w.row_bytes / (w.row_bytes + up.row_bytes);
                    ReadAhead::new(&[from(w, row, gate_bytes), from(up, row, bytes - gate_bytes)])
                }
            }
        })
        .collect()
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
    let work = Work::bytes(acts.len());
    for_chunks_of(pool, groups, 4, Take::OneByOne, work, &[], &|range| {
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
    let work = Work::product(w, tokens);
    for_chunks_of(pool, rows, chunk, Take::OneByOne, work, &[], &|range| {
        let width = range.len();
        TILE.with(|tile| {
            let mut tile = tile.borrow_mut();
            tile.resize(tokens * width, 0.0);
            // Runs of repacked groups (whose tiles the kernels make from the rows16 layout)
            // and of rows in the file's layout.
            for (run, packed) in layout_runs(w, range.clone()) {
                let rows = &data[run.start * w.row_bytes..run.end * w.row_bytes];
                let o = &mut tile[run.start - range.start..];
                if packed {
                    airs_kernels::matmul_prepared_rows16(isa, w.ty, w.cols, rows, prep, o, width)
                } else {
                    airs_kernels::matmul_prepared(isa, w.ty, w.cols, rows, prep, o, width)
                }
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

/// Rows `range` of `w` (starting at a group) as maximal runs of whole groups in one layout:
/// (rows, repacked into rows16). A matrix that is not repacked is one run in the file's layout.
fn layout_runs(w: &TensorRef, range: Range<usize>) -> impl Iterator<Item = (Range<usize>, bool)> {
    let mut r0 = range.start;
    std::iter::from_fn(move || {
        if r0 >= range.end {
            return None;
        }
        let packed = w.is_packed(r0 / G);
        let mut r1 = (r0 + G).min(range.end);
        while r1 < range.end && w.is_packed(r1 / G) == packed {
            r1 = (r1 + G).min(range.end);
        }
        let run = r0..r1;
        r0 = r1;
        Some((run, packed))
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// One decode token's attention job over `positions`: (bytes, f32 multiply-adds) for a
    /// model of `heads` query heads and `kv_heads` KV heads of `head_dim` values, f16 K and V.
    fn decode_attention(heads: usize, kv_heads: usize, head_dim: usize, positions: usize) -> Work {
        Work::attention(
            positions * 2 * 2 * kv_heads * head_dim,
            positions * heads * head_dim * 2,
        )
    }

    #[test]
    fn decode_attention_is_dealt_to_the_threads_from_short_contexts_on_real_models() {
        // Qwen2.5-0.5B (14 heads, 2 KV heads of 64 values): dealt from 147 positions (its
        // bytes alone would have kept it on the caller up to 512).
        assert!(decode_attention(14, 2, 64, 146).inline());
        assert!(!decode_attention(14, 2, 64, 147).inline());
        // TinyLlama-1.1B (32 heads, 4 KV heads): from 64.
        assert!(decode_attention(32, 4, 64, 63).inline());
        assert!(!decode_attention(32, 4, 64, 64).inline());
        // stories260K (8 heads, 4 KV heads of 8 values) stays on the caller over its context
        // of 2,048 but the last position, where a sleeping worker's wake-up would cost more
        // than the job.
        assert!(decode_attention(8, 4, 8, 2047).inline());
    }

    /// (thread, range) of every call `for_chunks_of` makes.
    fn calls(pool: &ThreadPool, items: usize, work: Work) -> Vec<(String, Range<usize>)> {
        let seen = Mutex::new(Vec::new());
        for_chunks_of(pool, items, 1, Take::OneByOne, work, &[], &|range| {
            let name = std::thread::current().name().unwrap_or("").to_string();
            seen.lock().unwrap().push((name, range));
        });
        seen.into_inner().unwrap()
    }

    /// The bytes of every chunk a [`RowDeal`] cuts `shapes` into, product after product.
    fn chunk_bytes(shapes: &[(usize, usize)], tokens: usize, threads: usize) -> Vec<usize> {
        let per_thread = ChunksPerThread::default().of(tokens);
        let chunks = RowDeal::new(shapes.iter().copied(), per_thread, threads).rows_per_chunk;
        assert_eq!(chunks.len(), shapes.len());
        assert!(chunks.iter().all(|c| c.is_multiple_of(G) && *c > 0));
        shapes
            .iter()
            .zip(&chunks)
            .flat_map(|(&(rows, row_bytes), &chunk)| {
                (0..rows)
                    .step_by(chunk)
                    .map(move |r0| chunk.min(rows - r0) * row_bytes)
            })
            .collect()
    }

    #[test]
    fn products_are_dealt_in_about_the_chunks_a_thread_the_pool_asks_for() {
        // TinyLlama's attention output (2048 rows) and feed-forward (5632), Q4_K rows of 2048
        // values (1152 bytes); Qwen's (896), Q5_0 rows of 896 (616). Chunks are whole groups,
        // so the count is only about the one asked for.
        for (rows, row_bytes) in [(2048, 1152), (5632, 1152), (896, 616)] {
            for threads in [2, 4] {
                for (tokens, per_thread) in [
                    (1, ChunksPerThread::ONE_TOKEN),
                    (4, ChunksPerThread::SEVERAL_TOKENS),
                ] {
                    let count = chunk_bytes(&[(rows, row_bytes)], tokens, threads).len();
                    assert!(
                        count.abs_diff(threads * per_thread) <= threads * per_thread / 4,
                        "{rows} rows, {threads} threads, {tokens} tokens: {count} chunks"
                    );
                }
            }
        }
        // One product alone is cut as in a list of one.
        let pool = ThreadPool::new(2);
        for (rows, row_bytes) in [(2048, 1152), (5632, 2304), (896, 616)] {
            assert_eq!(
                RowDeal::rows_per_chunk_alone(&pool, 1, rows, row_bytes),
                RowDeal::on(&pool, 1, [(rows, row_bytes)].into_iter()).rows_per_chunk[0]
            );
        }
        // A matrix of fewer rows than that: chunks of one group.
        let per_thread = ChunksPerThread::default();
        assert_eq!(
            RowDeal::new([(64, 1152)].into_iter(), per_thread.of(4), 2).rows_per_chunk,
            [G]
        );
        assert_eq!(
            RowDeal::new([(G, 1152)].into_iter(), per_thread.of(1), 8).rows_per_chunk,
            [G]
        );
    }

    #[test]
    fn q_k_and_v_dealt_together_get_chunks_of_about_equal_bytes() {
        // TinyLlama-1.1B Q4_K_M: q and k Q4_K (1152 bytes a row), v Q6_K (1680).
        let shapes = [(2048, 1152), (256, 1152), (256, 1680)];
        let total: usize = shapes
            .iter()
            .map(|&(rows, row_bytes)| rows * row_bytes)
            .sum();
        for (tokens, per_thread) in [
            (1, ChunksPerThread::ONE_TOKEN),
            (4, ChunksPerThread::SEVERAL_TOKENS),
        ] {
            let bytes = chunk_bytes(&shapes, tokens, 2);
            assert_eq!(bytes.iter().sum::<usize>(), total);
            let share = total / (2 * per_thread);
            // No chunk is more than a share and a group, and q's first is about one share.
            // (Cut per product, a quarter or a sixteenth of each, q's chunks were three
            // quarters of a share and k's and v's a tenth or less.)
            assert!(
                bytes.iter().all(|&b| b <= share + G * 1680),
                "{tokens} tokens: {bytes:?}, a share {share}"
            );
            assert!(
                bytes[0].abs_diff(share) <= G * 1152,
                "{tokens} tokens: {bytes:?}"
            );
            assert!(
                bytes.len() <= 2 * per_thread + 3,
                "{tokens} tokens: {bytes:?}"
            );
        }
    }

    #[test]
    fn a_small_job_runs_whole_on_the_calling_thread() {
        let pool = ThreadPool::new(2);
        let me = std::thread::current().name().unwrap_or("").to_string();
        let small = Work {
            bytes: Work::INLINE_BYTES - 1,
            macs: Work::INLINE_MACS - 1,
        };
        assert_eq!(calls(&pool, 64, small), [(me, 0..64)]);
        assert!(calls(&pool, 0, Work::default()).is_empty());
        // Many bytes or many multiply-adds: dealt in chunks (which threads take them is the
        // pool's business).
        for large in [
            Work::bytes(Work::INLINE_BYTES),
            Work {
                macs: Work::INLINE_MACS,
                ..small
            },
        ] {
            let mut chunks = calls(&pool, 64, large);
            chunks.sort_by_key(|(_, r)| r.start);
            assert_eq!(chunks.len(), 64);
            assert!(
                chunks
                    .iter()
                    .enumerate()
                    .all(|(i, (_, r))| *r == (i..i + 1))
            );
        }
    }

    /// A matrix of `rows` Q4_K rows of 256 values at `offset` of an image.
    fn q4k(rows: usize, offset: usize) -> TensorRef {
        let row_bytes = airs_kernels::row_bytes(airs_kernels::GgmlType::Q4K, 256).unwrap();
        TensorRef {
            ty: airs_kernels::GgmlType::Q4K,
            cols: 256,
            rows,
            offset,
            row_bytes,
            packed: None,
        }
    }

    /// The index of the pool thread running this (0: the caller).
    fn thread_index() -> usize {
        let name = std::thread::current().name().unwrap_or("").to_string();
        name.strip_prefix("airs-worker-")
            .map_or(0, |index| index.parse().unwrap())
    }

    #[test]
    fn each_thread_prefetches_the_front_of_its_own_run_of_the_next_product() {
        // q, k and v dealt as one list, and gate and up dealt together, on 2 and 3 threads.
        let (q, k, v) = (q4k(256, 0), q4k(64, 256 * 144), q4k(64, 320 * 144));
        let (gate, up) = (q4k(128, 384 * 144), q4k(128, 512 * 144));
        let image = vec![0u8; 640 * 144];
        let at = |w: &TensorRef, row: usize| image[w.offset + row * w.row_bytes..].as_ptr();
        for threads in [2, 3] {
            let pool = ThreadPool::new(threads);
            let isa = Isa::detect();
            let qkv = [&q, &k, &v];
            let ahead = read_ahead(&pool, isa, &image, 1, &Upcoming::Products(&qkv));
            assert_eq!(ahead.len(), threads);
            let gated = read_ahead(&pool, isa, &image, 1, &Upcoming::Gated(&gate, &up));
            // The chunk each thread computes first when the products run (a thread may run
            // none: the others took its run).
            let deal = RowDeal::on(&pool, 1, qkv.iter().map(|w| (w.rows, w.row_bytes)));
            let firsts = Mutex::new(vec![None; threads]);
            for_chunks_of(
                &pool,
                deal.chunks(),
                1,
                Take::InBites,
                Work::bytes(1 << 30),
                &[],
                &|r| {
                    firsts.lock().unwrap()[thread_index()].get_or_insert(r.start);
                },
            );
            let gate_chunk = RowDeal::on(&pool, 1, [(128, 2 * 144)].into_iter()).rows_per_chunk[0];
            let gate_firsts = Mutex::new(vec![None; threads]);
            let work = Work::bytes(1 << 30);
            for_chunks_of(&pool, 128, gate_chunk, Take::InBites, work, &[], &|r| {
                gate_firsts.lock().unwrap()[thread_index()].get_or_insert(r.start);
            });
            for t in 0..threads {
                if let Some(c) = firsts.lock().unwrap()[t] {
                    let (i, row) = deal.chunk(c);
                    let [(start, bytes), unused] = ahead[t].ranges();
                    assert_eq!(start, at(qkv[i], row) as usize, "thread {t} of {threads}");
                    // Up to the read-ahead, within the matrix.
                    let left = (qkv[i].rows - row) * qkv[i].row_bytes;
                    assert_eq!(bytes, left.min(ThreadPool::READ_AHEAD_BYTES));
                    assert_eq!(unused, (0, 0));
                }
                if let Some(row) = gate_firsts.lock().unwrap()[t] {
                    let [(g, g_bytes), (u, u_bytes)] = gated[t].ranges();
                    assert_eq!((g, u), (at(&gate, row) as usize, at(&up, row) as usize));
                    assert_eq!(g_bytes, (128 - row) * 144);
                    assert_eq!(u_bytes, (128 - row) * 144);
                }
            }
            assert!(
                firsts.lock().unwrap()[0].is_some(),
                "the caller always runs"
            );
            // A smaller read-ahead caps each range; none turns it off.
            pool.set_read_ahead_bytes(1000);
            let capped = read_ahead(&pool, isa, &image, 1, &Upcoming::Products(&qkv));
            assert!(capped.iter().all(|a| a.ranges()[0].1 <= 1000));
            assert_eq!(capped[0].ranges()[0], (at(&q, 0) as usize, 1000));
            pool.set_read_ahead_bytes(0);
            assert!(read_ahead(&pool, isa, &image, 1, &Upcoming::Products(&qkv)).is_empty());
        }
    }
}
