//! The paged KV cache: each sequence's keys and values live in fixed blocks of the airs-memory
//! [`KvPool`], reached through the sequence's block table, allocated as the sequence grows,
//! shared between sequences with a common prompt prefix, and copied only when a sequence must
//! write into a block it shares.
//!
//! Design: vLLM's PagedAttention (Kwon et al., SOSP 2023) — the block table is to a sequence's
//! KV what a page table is to an address space — and SGLang's RadixAttention (Zheng et al.,
//! 2024) for prefix reuse through the pool's radix index, per §6.3 of the model-memory chapter.
//! [`PagedKvPool`] sizes the pool from the model's KV shape and element type; [`PagedKv`] is one
//! sequence and implements [`KvCache`], so [`crate::Model::forward_batch`] runs on it
//! unchanged. [`PagedKv::new_sequence_with_prefix`] starts a sequence with the cached part of its
//! prompt already in place (the caller computes only the rest).
//!
//! Block layout: a block holds `tokens_per_block` positions of K and V for every layer (see
//! [`airs_memory::kv_pool`] for why). Inside it the rows of one (layer, K or V, KV head) are
//! contiguous — `[layer][K, V][kv_head][tile]`, where V's tile is its rows in position order and
//! K's holds them in columns (value `d` of every position together, `kv::encode_k`) —
//! so attention reads one contiguous run per block and KV head, decodes it once for all the
//! query heads of the group, and moves on; the block table is consulted once per run, and the
//! next block's run is prefetched while the current one is computed (a jump between blocks
//! otherwise costs the hardware prefetcher its stream: ~12% of attention time at 2K context
//! without it, nothing measurable with it).
//!
//! Cost: memory is `ceil(len / tokens_per_block)` blocks per sequence (waste below one block),
//! minus the blocks shared with other sequences; `reserve` takes the pool lock once per new
//! block, `set_len` once per forward pass; attention costs what the contiguous cache's does plus
//! one table lookup per `tokens_per_block` rows.

use std::sync::Arc;

use airs_memory::{
    BlockTable, KvPool, KvPoolConfig, KvPoolStats, ModelPool, PinPolicy, PoolExhausted,
};

use crate::error::{EngineError, EngineErrorKind};
use crate::kv::{KvCache, KvShape, KvType, RowRun, attend_runs, encode_k, encode_row};

/// How to build a [`PagedKvPool`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagedKvConfig {
    /// The pool's byte budget (all sequences together).
    pub pool_bytes: usize,
    /// Positions per block.
    pub tokens_per_block: u32,
    pub pin: PinPolicy,
    /// The pool's memory on transparent huge pages ([`KvPoolConfig::huge_pages`]).
    pub huge_pages: bool,
}

impl PagedKvConfig {
    /// A budget of `pool_bytes` with default blocks (16 positions) and pinning.
    pub fn new(pool_bytes: usize) -> PagedKvConfig {
        PagedKvConfig {
            pool_bytes,
            tokens_per_block: airs_memory::DEFAULT_TOKENS_PER_BLOCK,
            pin: PinPolicy::default(),
            huge_pages: true,
        }
    }
}

/// Where rows lie inside a block.
#[derive(Copy, Clone, Debug)]
struct BlockLayout {
    ty: KvType,
    kv_heads: usize,
    head_dim: usize,
    tokens_per_block: usize,
    /// Bytes of one head's row.
    row_bytes: usize,
    /// Bytes of the rows of one (layer, K/V, head): `tokens_per_block × row_bytes`.
    run_bytes: usize,
}

impl BlockLayout {
    /// Byte offset of the run of (`layer`, K if `value` is 0 else V, `head`).
    #[inline]
    fn run(&self, layer: usize, value: usize, head: usize) -> usize {
        ((layer * 2 + value) * self.kv_heads + head) * self.run_bytes
    }
}

/// A KV block pool sized for one model's KV shape and element type. Cheap to clone (shared).
#[derive(Clone, Debug)]
pub struct PagedKvPool {
    pool: Arc<KvPool>,
    shape: KvShape,
    layout: BlockLayout,
}

fn kv_pool_err(e: airs_memory::MemoryError) -> EngineError {
    EngineError::new(EngineErrorKind::KvPool(e))
}

impl PagedKvPool {
    /// Map a pool of `config.pool_bytes` for caches of `shape` holding `ty` values.
    pub fn new(
        shape: KvShape,
        ty: KvType,
        config: &PagedKvConfig,
    ) -> Result<PagedKvPool, EngineError> {
        PagedKvPool::build(shape, ty, config, None)
    }

    /// [`PagedKvPool::new`], its mapping charged first to the model pool's account `account`
    /// ([`KvPool::new_charged`]): a pool the account has no room for is an
    /// [`EngineErrorKind::KvPool`] error naming what holds the model pool.
    pub fn new_charged(
        shape: KvShape,
        ty: KvType,
        config: &PagedKvConfig,
        account: &Arc<ModelPool>,
    ) -> Result<PagedKvPool, EngineError> {
        PagedKvPool::build(shape, ty, config, Some(account))
    }

    fn build(
        shape: KvShape,
        ty: KvType,
        config: &PagedKvConfig,
        account: Option<&Arc<ModelPool>>,
    ) -> Result<PagedKvPool, EngineError> {
        let row_bytes = shape.checked_row_bytes(ty)?;
        let tokens_per_block = config.tokens_per_block as usize;
        let bytes_per_token = 2 * shape.layers * shape.kv_heads * row_bytes;
        let pool_config = KvPoolConfig {
            pool_bytes: config.pool_bytes,
            bytes_per_token,
            tokens_per_block: config.tokens_per_block,
            pin: config.pin,
            huge_pages: config.huge_pages,
        };
        let pool = match account {
            None => KvPool::new(pool_config),
            Some(account) => KvPool::new_charged(
                pool_config,
                account,
                &format!(
                    "KV pool ({} KV, {} bytes/token)",
                    ty.name(),
                    bytes_per_token
                ),
            ),
        }
        .map_err(kv_pool_err)?;
        Ok(PagedKvPool {
            pool,
            shape,
            layout: BlockLayout {
                ty,
                kv_heads: shape.kv_heads,
                head_dim: shape.head_dim,
                tokens_per_block,
                row_bytes,
                run_bytes: tokens_per_block * row_bytes,
            },
        })
    }

    /// The underlying block pool (statistics, reclaiming cached blocks, notices).
    pub fn memory(&self) -> &Arc<KvPool> {
        &self.pool
    }

    pub fn stats(&self) -> KvPoolStats {
        self.pool.stats()
    }

    pub fn shape(&self) -> KvShape {
        self.shape
    }

    pub fn kv_type(&self) -> KvType {
        self.layout.ty
    }

    /// Bytes one position takes (K and V of every layer).
    pub fn bytes_per_token(&self) -> usize {
        self.pool.config().bytes_per_token
    }

    pub fn block_bytes(&self) -> usize {
        self.pool.block_bytes()
    }

    pub fn tokens_per_block(&self) -> usize {
        self.layout.tokens_per_block
    }
}

/// One sequence's paged KV cache (see the module documentation). Dropping it returns its
/// unshared blocks to the pool; blocks in the prefix index stay cached until reclaimed.
#[derive(Debug)]
pub struct PagedKv {
    table: BlockTable,
    layout: BlockLayout,
    max_len: usize,
}

impl PagedKv {
    /// An empty sequence whose full blocks are indexed under `salt` once their token ids are
    /// declared ([`PagedKv::extend_tokens`]).
    pub fn new_sequence(pool: &PagedKvPool, salt: Option<&[u8]>) -> PagedKv {
        PagedKv {
            table: pool.pool.new_table(salt),
            layout: pool.layout,
            max_len: usize::MAX,
        }
    }

    /// A sequence for `prompt` that already holds the longest prefix of it cached under `salt`
    /// (at most `prompt.len() − 1` positions), and that indexes its own full blocks of `prompt`
    /// as they are computed. Returns it and the number of cached positions (its `len()`).
    ///
    /// The caller must compute exactly `prompt[len()..]` into it: the index trusts the declared
    /// prompt.
    pub fn new_sequence_with_prefix(
        pool: &PagedKvPool,
        salt: Option<&[u8]>,
        prompt: &[u32],
    ) -> (PagedKv, usize) {
        let (table, cached) = pool.pool.new_table_with_prefix(salt, prompt);
        let kv = PagedKv {
            table,
            layout: pool.layout,
            max_len: usize::MAX,
        };
        (kv, cached)
    }

    /// Limit the sequence to `max_len` positions (e.g. the model's context length); growing
    /// past it fails with `ContextFull`.
    pub fn with_max_len(mut self, max_len: usize) -> PagedKv {
        self.max_len = max_len;
        self
    }

    /// Declare the token ids of the next positions (e.g. generated tokens) so that full blocks
    /// holding them can be reused by later sequences. The caller must compute exactly these.
    pub fn extend_tokens(&mut self, ids: &[u32]) {
        self.table.extend_tokens(ids);
    }

    /// A second sequence with the same contents, sharing all blocks (copy-on-write).
    pub fn fork(&mut self) -> PagedKv {
        PagedKv {
            table: self.table.fork(),
            layout: self.layout,
            max_len: self.max_len,
        }
    }

    /// [`KvCache::reserve`] with the pool's typed error.
    pub fn try_reserve(&mut self, new_len: usize) -> Result<(), PoolExhausted> {
        self.table.reserve(new_len)
    }

    /// Forget the positions from `len` on (draft tokens a verification rejected), returning
    /// the blocks past them; positions in shared or indexed blocks stay
    /// ([`BlockTable::truncate`]). Returns the new length.
    pub fn truncate(&mut self, len: usize) -> usize {
        self.table.truncate(len)
    }

    /// The sequence's block table.
    pub fn table(&self) -> &BlockTable {
        &self.table
    }
}

impl KvCache for PagedKv {
    fn len(&self) -> usize {
        self.table.len()
    }

    fn reserve(&mut self, new_len: usize) -> Result<(), EngineError> {
        if new_len > self.max_len {
            return Err(EngineError::new(EngineErrorKind::ContextFull {
                needed: new_len,
                capacity: self.max_len,
            }));
        }
        self.table
            .reserve(new_len)
            .map_err(|e| EngineError::new(EngineErrorKind::KvExhausted(e)))
    }

    fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let l = self.layout;
        let (hd, rb, tpb) = (l.head_dim, l.row_bytes, l.tokens_per_block);
        let kv_len = l.kv_heads * hd;
        let end = start + k.len() / kv_len;
        let mut pos = start;
        while pos < end {
            let b = pos / tpb;
            let block_end = ((b + 1) * tpb).min(end);
            let block = self.table.block_mut(b);
            for p in pos..block_end {
                let src = (p - start) * kv_len;
                let row = (p % tpb) * rb;
                for h in 0..l.kv_heads {
                    let (s, ko, vo) = (src + h * hd, l.run(layer, 0, h), l.run(layer, 1, h) + row);
                    let tile = &mut block[ko..ko + l.run_bytes];
                    encode_k(l.ty, &k[s..s + hd], tile, tpb, p % tpb);
                    encode_row(l.ty, &v[s..s + hd], &mut block[vo..vo + rb]);
                }
            }
            pos = block_end;
        }
    }

    fn set_len(&mut self, len: usize) {
        self.table.commit(len);
    }

    /// The shared attention kernel over the blocks holding `positions`, one run per block.
    fn attend_queries(
        &self,
        layer: usize,
        kv_head: usize,
        q: &[f32],
        queries: usize,
        positions: std::ops::Range<usize>,
        scale: f32,
        out: &mut [f32],
        scores: &mut [f32],
    ) {
        let l = self.layout;
        let (tpb, rb) = (l.tokens_per_block, l.row_bytes);
        let (ko, vo) = (l.run(layer, 0, kv_head), l.run(layer, 1, kv_head));
        assert!(!positions.is_empty(), "attention over no positions");
        // Blocks `first_block..=last_block` hold the positions; the first run starts inside
        // its block when a sliding window begins there.
        let first_block = positions.start / tpb;
        let last_block = (positions.end - 1) / tpb;
        let run = |r: usize| {
            let b = first_block + r;
            let block = self.table.block(b);
            let lo = positions.start.saturating_sub(b * tpb);
            let hi = (positions.end - b * tpb).min(tpb);
            RowRun {
                k: &block[ko..ko + l.run_bytes],
                width: tpb,
                first: lo,
                v: &block[vo + lo * rb..vo + hi * rb],
                rows: hi - lo,
                stride: rb,
            }
        };
        attend_runs(
            l.ty,
            l.head_dim,
            last_block - first_block + 1,
            run,
            q,
            queries,
            positions.len(),
            scale,
            out,
            scores,
        );
    }

    fn allocated_bytes(&self) -> usize {
        self.table.allocated_bytes()
    }
}
