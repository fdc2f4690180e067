//! The KV block pool: one fixed byte budget of KV-cache memory carved into equal blocks of
//! `tokens_per_block` positions, handed to sequences through per-sequence [`BlockTable`]s that
//! grow on demand, shared between sequences by reference counting with copy-on-write, and
//! indexed by token prefix so a prompt that starts like an earlier one reuses its blocks.
//!
//! Design: vLLM's PagedAttention (Kwon et al., SOSP 2023) for the blocks and block tables, and
//! SGLang's RadixAttention (Zheng et al., 2024) for prefix reuse (see [`crate::prefix`]), as
//! §6.3 of the model-memory chapter sets out. Memory comes from one anonymous mapping of
//! `blocks_total × block_bytes ≤ pool_bytes` bytes, pinned with `mlock` (whole pool,
//! [`PinPolicy::Populate`]) or `mlock2(MLOCK_ONFAULT)` (blocks as they are first written, the
//! default), falling back visibly — a [`Notice`] — when the kernel refuses, as the rest of this
//! crate does. The mapping asks for transparent huge pages ([`KvPoolConfig::huge_pages`], on by
//! default): attention reads one short run of each block per layer (2 KiB of K, 2 KiB of V for
//! a 64-value head), so on base pages every run of a long context is a TLB miss and a page
//! walk. Whole decode steps, alternated step by step between two pools in one run (`airs bench
//! decode --alternate-kv-pages`), took 1-4 % less time on huge pages at 1,000-2,500 positions
//! and 5 % less at 3,500-4,000 (Qwen2.5-0.5B, TinyLlama-1.1B), the same at short contexts
//! (BENCHMARKS.md, "The KV pool on huge pages"). The cost: resident memory grows 2 MiB at a
//! time instead of a block at a time (the budget charged is the same). "Eviction" of a block is its
//! return to the free list (the design README): cached prefix blocks nobody references are
//! reclaimed least-recently-used when the free list is empty.
//!
//! Block granularity: **one block holds K and V of every layer** for its positions, rather than
//! one block set per layer. A sequence then needs one block table, one allocation and one
//! refcount per `tokens_per_block` positions whatever the depth of the model, and sharing,
//! copy-on-write and eviction can never leave the layers of a position inconsistent (vLLM keeps
//! per-layer tensors but addresses all of them with the same block id: the same thing in another
//! memory order). The pool does not know models: it deals in `bytes_per_token` and the engine lays
//! out rows inside a block (it keeps each (layer, K/V, head)'s rows contiguous for attention).
//!
//! Safety of the block bytes: a block is written only by the one table that holds it
//! *exclusively* (refcount 1, not indexed) at logical positions ≥ that table's length; a block
//! that is shared (refcount > 1) or indexed is immutable, and a table that must write into one
//! copies it first ([`BlockTable::reserve`]). Reads need only a reference. [`BlockTable::block`]
//! and [`BlockTable::block_mut`] enforce this with the borrow checker plus the table's
//! `exclusive_from` watermark.
//!
//! Cost: allocate and free are O(1) (a free list in a flat `Vec`; when it is empty, reclaiming a
//! cached block is O(log cached)); [`BlockTable::reserve`] takes the pool lock only when a new
//! block or a copy is needed (every `tokens_per_block` positions); [`BlockTable::commit`] takes
//! it once per forward pass. Copy-on-write and partial prefix reuse copy one block. Metadata is
//! 12 bytes per block plus, per indexed block, one tree node. [`KvPool::stats`] and
//! [`KvPool::audit`] scan every block.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::account::{ModelPool, PoolCharge, PoolUse};
use crate::error::{ErrorKind, MemoryError, Result};
use crate::prefix::{NodeId, PrefixIndex};
use crate::region::{Notice, NoticeKind, errno_name};
use crate::sys::{self, AnonMapping};

/// Positions per block unless configured otherwise (vLLM's default).
pub const DEFAULT_TOKENS_PER_BLOCK: u32 = 16;

const NO_NODE: u32 = u32::MAX;

/// A block of the pool: index `i` covers bytes `[i × block_bytes, (i + 1) × block_bytes)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

/// How the pool's memory is pinned (kept out of swap and reclaim).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum PinPolicy {
    /// `mlock` the whole pool at creation: every block is resident and pinned up front
    /// (falls back to [`PinPolicy::OnFault`], then to unpinned).
    Populate,
    /// `mlock2(MLOCK_ONFAULT)`: blocks are pinned as they are first written, so an idle pool
    /// costs address space, not RAM (falls back to unpinned).
    #[default]
    OnFault,
    /// Do not pin.
    None,
}

/// The pool's shape and budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPoolConfig {
    /// The byte budget: the pool never maps more.
    pub pool_bytes: usize,
    /// Bytes one position occupies in a block (K and V of every layer, as the engine lays out).
    pub bytes_per_token: usize,
    /// Positions per block.
    pub tokens_per_block: u32,
    pub pin: PinPolicy,
    /// Ask for transparent huge pages (`MADV_HUGEPAGE` on a mapping aligned to the huge-page
    /// size), so that attention's reads of a layer's rows, one short run per block, do not
    /// each walk the page tables. Resident memory then grows a huge page (2 MiB on x86-64 and
    /// a 4 KiB-page aarch64 kernel) at a time rather than a block at a time; the budget
    /// charged is the same. Where THP is off or refused, the pool uses base pages with a
    /// notice.
    pub huge_pages: bool,
}

impl KvPoolConfig {
    /// A pool of `pool_bytes` for positions of `bytes_per_token`, with the default block size
    /// and pinning.
    pub fn new(pool_bytes: usize, bytes_per_token: usize) -> KvPoolConfig {
        KvPoolConfig {
            pool_bytes,
            bytes_per_token,
            tokens_per_block: DEFAULT_TOKENS_PER_BLOCK,
            pin: PinPolicy::default(),
            huge_pages: true,
        }
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.bytes_per_token
            .saturating_mul(self.tokens_per_block as usize)
    }
}

/// The pool cannot supply the blocks a sequence needs. The sequence is left as it was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "KV pool exhausted: {needed_blocks} more blocks needed but only {available_blocks} \
     available (free or reclaimable) of {blocks_total} blocks of {block_bytes} bytes \
     (pool budget {pool_bytes} bytes)"
)]
pub struct PoolExhausted {
    pub needed_blocks: u32,
    /// Free plus cached-and-reclaimable blocks at the time of the request.
    pub available_blocks: u32,
    pub blocks_total: u32,
    pub block_bytes: usize,
    pub pool_bytes: usize,
}

/// What of a pool's mapping is in memory ([`KvPool::residency`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvPoolResidency {
    pub resident_bytes: u64,
    /// Resident bytes on transparent huge pages.
    pub huge_page_bytes: u64,
}

/// Event counters since the pool was created.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvPoolCounters {
    /// Sequences created with a prefix lookup.
    pub prefix_lookups: u64,
    /// Positions those lookups found cached (shared or copied).
    pub prefix_hit_tokens: u64,
    /// Positions reused by copying the rows of a partially matching block.
    pub prefix_copied_tokens: u64,
    /// Blocks copied because a sequence had to write into a shared block.
    pub cow_copies: u64,
    /// Cached blocks reclaimed (for an allocation or by [`KvPool::reclaim_cached`]).
    pub reclaimed_blocks: u64,
}

/// Accounting of the pool at one instant (every block counted once).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvPoolStats {
    /// The byte budget.
    pub pool_bytes: usize,
    pub block_bytes: usize,
    pub bytes_per_token: usize,
    pub tokens_per_block: u32,
    pub blocks_total: u32,
    /// Blocks referenced by at least one sequence.
    pub blocks_used: u32,
    /// Unreferenced blocks kept by the prefix index (reclaimable).
    pub blocks_cached: u32,
    pub blocks_free: u32,
    /// Bytes of used blocks.
    pub used_bytes: usize,
    /// Bytes of cached blocks.
    pub cached_bytes: usize,
    /// Positions stored in used blocks.
    pub tokens_stored: u64,
    /// Positions stored in cached blocks.
    pub cached_tokens_stored: u64,
    /// Used bytes not holding a stored position: `used_bytes − tokens_stored × bytes_per_token`
    /// (cached blocks are always full).
    pub waste_bytes: usize,
    /// Blocks referenced by more than one sequence.
    pub shared_blocks: u32,
    /// `(refcount, blocks)` for every refcount above 1, ascending.
    pub shared_refcounts: Vec<(u32, u32)>,
    /// Sum of all refcounts: the blocks the sequences would hold without any sharing.
    pub block_refs: u64,
    /// Bytes sharing saves: `(block_refs − blocks_used) × block_bytes`.
    pub shared_savings_bytes: usize,
    /// Blocks in the prefix index (used or cached).
    pub indexed_blocks: u32,
    /// Whether the pool's memory is pinned (see [`KvPool::notices`]).
    pub pinned: bool,
    pub counters: KvPoolCounters,
}

#[derive(Copy, Clone, Debug)]
struct BlockMeta {
    /// Sequences holding the block.
    refcount: u32,
    /// Positions written and committed in the block.
    tokens_stored: u32,
    /// Prefix-index node of the block, or `NO_NODE`.
    node: u32,
}

#[derive(Debug)]
struct PoolState {
    meta: Vec<BlockMeta>,
    /// Free blocks (refcount 0, not indexed), used as a stack.
    free: Vec<BlockId>,
    index: PrefixIndex,
    /// Logical clock for LRU order.
    tick: u64,
    counters: KvPoolCounters,
}

impl PoolState {
    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    /// Free plus reclaimable blocks.
    fn available(&self) -> usize {
        self.free.len() + self.index.cached_len()
    }

    /// A block with refcount 1 and nothing stored: from the free list, else the least recently
    /// used cached block.
    fn alloc(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let b = self.index.pop_lru()?;
                self.counters.reclaimed_blocks += 1;
                b
            }
        };
        let m = &mut self.meta[b.0 as usize];
        debug_assert_eq!(m.refcount, 0);
        *m = BlockMeta {
            refcount: 1,
            tokens_stored: 0,
            node: NO_NODE,
        };
        Some(b)
    }

    /// Take one more reference on a used or cached block.
    fn retain(&mut self, b: BlockId) {
        let m = &mut self.meta[b.0 as usize];
        m.refcount = m.refcount.checked_add(1).expect("refcount overflow");
        if m.refcount == 1 {
            assert_ne!(m.node, NO_NODE, "retained a free block");
            let (node, tick) = (NodeId(m.node), self.tick);
            self.index.set_cached(node, false, tick);
        }
    }

    /// Drop one reference; an unreferenced block becomes cached (if indexed) or free.
    fn release(&mut self, b: BlockId) {
        let tick = self.next_tick();
        let m = &mut self.meta[b.0 as usize];
        m.refcount = m
            .refcount
            .checked_sub(1)
            .expect("released a block with refcount 0");
        if m.refcount == 0 {
            if m.node == NO_NODE {
                m.tokens_stored = 0;
                self.free.push(b);
            } else {
                let node = NodeId(m.node);
                self.index.set_cached(node, true, tick);
            }
        }
    }
}

/// The block pool (see the module documentation). Shared as `Arc<KvPool>`; every
/// [`BlockTable`] keeps it alive.
#[derive(Debug)]
pub struct KvPool {
    /// Keeps the memory mapped; blocks are reached through `base`.
    _mapping: AnonMapping,
    /// Start of block 0, derived from the mapping with provenance over all of it.
    base: NonNull<u8>,
    config: KvPoolConfig,
    block_bytes: usize,
    blocks_total: u32,
    pinned: bool,
    notices: Vec<Notice>,
    state: Mutex<PoolState>,
    /// The mapping's share of the model pool, when charged; returned after the unmap.
    _charge: Option<PoolCharge>,
}

// SAFETY: `base` points into `_mapping`, which lives as long as the pool. Block bytes are only
// reached through `BlockTable`, whose exclusivity rules (module docs) keep a written block
// unaliased; all metadata sits behind the mutex. Nothing is tied to the creating thread.
unsafe impl Send for KvPool {}
// SAFETY: as for Send: shared access either locks the state or follows the block rules.
unsafe impl Sync for KvPool {}

impl KvPool {
    /// Map and pin a pool. Fails when the budget holds no block or the mapping cannot be made;
    /// refused pinning is a [`Notice`], not an error.
    pub fn new(config: KvPoolConfig) -> Result<Arc<KvPool>> {
        KvPool::create(config, None)
    }

    /// [`KvPool::new`], the mapping first charged to the model pool's account `account` as
    /// `label`: refused with [`ErrorKind::PoolFull`] (naming what holds the pool) when the
    /// account lacks the room; the charge is returned when the pool is dropped.
    pub fn new_charged(
        config: KvPoolConfig,
        account: &Arc<ModelPool>,
        label: &str,
    ) -> Result<Arc<KvPool>> {
        let bytes = KvPool::mapped_bytes(&config)?;
        let charge = account
            .charge(PoolUse::KvCache, bytes as u64, label)
            .map_err(|e| MemoryError::new(ErrorKind::PoolFull, e.to_string()))?;
        KvPool::create(config, Some(charge))
    }

    /// Bytes the pool of `config` maps: its whole blocks.
    pub fn mapped_bytes(config: &KvPoolConfig) -> Result<usize> {
        if config.tokens_per_block == 0 || config.bytes_per_token == 0 {
            return Err(MemoryError::new(
                ErrorKind::Config,
                "KV pool: tokens_per_block and bytes_per_token must be positive",
            ));
        }
        let block_bytes = config.block_bytes();
        let blocks = (config.pool_bytes / block_bytes).min(u32::MAX as usize - 1);
        if blocks == 0 {
            return Err(MemoryError::new(
                ErrorKind::Config,
                format!(
                    "KV pool: a budget of {} bytes holds no block of {block_bytes} bytes",
                    config.pool_bytes
                ),
            ));
        }
        Ok(blocks * block_bytes)
    }

    fn create(config: KvPoolConfig, charge: Option<PoolCharge>) -> Result<Arc<KvPool>> {
        let bytes = KvPool::mapped_bytes(&config)?;
        let block_bytes = config.block_bytes();
        let blocks = bytes / block_bytes;
        let blocks_total = blocks as u32;
        let huge_pages =
            config.huge_pages && sys::thp_usable() && sys::huge_page_size() > sys::page_size();
        let align = if huge_pages {
            sys::huge_page_size()
        } else {
            sys::page_size()
        };
        let mapping = AnonMapping::new(bytes, align).map_err(|e| {
            MemoryError::with_errno(
                ErrorKind::Map,
                format!("mapping a KV pool of {bytes} bytes"),
                e,
            )
        })?;
        // SAFETY: the mapping was just created, is writable, is not registered with a
        // userfaultfd, and nothing else references it; the slice only yields its base pointer.
        let base = NonNull::from(unsafe { mapping.as_mut_slice() }).cast::<u8>();
        let mut notices = Vec::new();
        if config.huge_pages {
            advise_huge_pages(&mapping, huge_pages, &mut notices);
        } else {
            // Base pages even where THP is `always` (a hint: nothing to report if refused).
            let _ = mapping.no_huge_pages();
        }
        let pinned = pin(&mapping, config.pin, &mut notices);
        Ok(Arc::new(KvPool {
            _mapping: mapping,
            base,
            block_bytes,
            blocks_total,
            pinned,
            notices,
            state: Mutex::new(PoolState {
                meta: vec![
                    BlockMeta {
                        refcount: 0,
                        tokens_stored: 0,
                        node: NO_NODE
                    };
                    blocks
                ],
                free: (0..blocks_total).rev().map(BlockId).collect(),
                index: PrefixIndex::new(config.tokens_per_block as usize),
                tick: 0,
                counters: KvPoolCounters::default(),
            }),
            config,
            _charge: charge,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        // A panic while the lock was held can only come from a failed internal assertion;
        // the state is still structurally valid, and `audit` can verify it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn config(&self) -> &KvPoolConfig {
        &self.config
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub fn tokens_per_block(&self) -> usize {
        self.config.tokens_per_block as usize
    }

    pub fn blocks_total(&self) -> u32 {
        self.blocks_total
    }

    /// Whether the memory is pinned.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// Degradations at creation (pinning refused).
    pub fn notices(&self) -> &[Notice] {
        &self.notices
    }

    /// A new, empty sequence. Its full blocks are indexed under `salt` once their token ids
    /// are known ([`BlockTable::extend_tokens`]).
    pub fn new_table(self: &Arc<Self>, salt: Option<&[u8]>) -> BlockTable {
        BlockTable {
            pool: Arc::clone(self),
            blocks: Vec::new(),
            len: 0,
            exclusive_from: 0,
            tokens: Vec::new(),
            salt: salt.map(Into::into),
            indexed: 0,
            cursor: None,
            indexing: true,
        }
    }

    /// A new sequence for `prompt` that starts with the longest prefix of `prompt` cached under
    /// `salt` — at most `prompt.len() − 1` positions, so at least one token is left to compute.
    /// Whole matching blocks are shared by reference; when the match ends inside a block, that
    /// block's matching rows are copied into a block of the new sequence. Returns the table
    /// (length = the cached positions; `prompt` declared as its tokens) and that length.
    /// Never fails: when no block is free for the copy, the partial block is left to compute.
    ///
    /// The caller must then compute exactly `prompt[len..]` into the sequence: the index trusts
    /// the declared tokens.
    pub fn new_table_with_prefix(
        self: &Arc<Self>,
        salt: Option<&[u8]>,
        prompt: &[u32],
    ) -> (BlockTable, usize) {
        let mut table = self.new_table(salt);
        table.tokens = prompt.to_vec();
        let tpb = self.tokens_per_block();
        let max_tokens = prompt.len().saturating_sub(1);
        let mut st = self.lock();
        st.counters.prefix_lookups += 1;
        let Some(root) = st.index.find_root(salt) else {
            return (table, 0);
        };
        let mut node = root;
        let mut path = Vec::new();
        while (path.len() + 1) * tpb <= max_tokens {
            let at = path.len() * tpb;
            match st.index.child(node, &prompt[at..at + tpb]) {
                Some(c) => {
                    path.push(c);
                    node = c;
                }
                None => break,
            }
        }
        let tick = st.next_tick();
        for &n in &path {
            let b = st.index.block(n);
            st.retain(b);
            st.index.touch(n, tick);
            table.blocks.push(b);
        }
        let shared = path.len() * tpb;
        let mut cached = shared;
        if let Some((src_node, rows)) =
            st.index
                .best_partial(node, &prompt[shared..], max_tokens - shared)
        {
            let src = st.index.block(src_node);
            st.retain(src); // keeps it from being reclaimed by the allocation below
            if let Some(dst) = st.alloc() {
                // SAFETY: `src` is indexed, hence immutable, and held by us; `dst` was just
                // allocated and nobody else references it; distinct blocks do not overlap.
                unsafe { self.copy_block(src, dst) };
                st.meta[dst.0 as usize].tokens_stored = rows as u32;
                table.blocks.push(dst);
                cached += rows;
                st.counters.prefix_copied_tokens += rows as u64;
            }
            st.index.touch(src_node, tick);
            st.release(src);
        }
        st.counters.prefix_hit_tokens += cached as u64;
        table.len = cached;
        table.exclusive_from = path.len();
        table.indexed = path.len();
        table.cursor = path.last().copied();
        (table, cached)
    }

    /// Positions of `tokens` the prefix index holds under `salt` as whole blocks — what
    /// [`KvPool::new_table_with_prefix`] would share by reference (at most `tokens.len() − 1`),
    /// without the partial block it may copy — found without taking or touching anything. A
    /// scheduler asks this to decide whether a request should wait for blocks another sequence
    /// is computing right now. O(blocks of the match).
    pub fn cached_prefix_len(&self, salt: Option<&[u8]>, tokens: &[u32]) -> usize {
        let tpb = self.tokens_per_block();
        let max_tokens = tokens.len().saturating_sub(1);
        let st = self.lock();
        let Some(mut node) = st.index.find_root(salt) else {
            return 0;
        };
        let mut blocks = 0;
        while (blocks + 1) * tpb <= max_tokens {
            match st
                .index
                .child(node, &tokens[blocks * tpb..(blocks + 1) * tpb])
            {
                Some(c) => {
                    node = c;
                    blocks += 1;
                }
                None => break,
            }
        }
        blocks * tpb
    }

    /// Return up to `max_blocks` cached blocks, least recently used first, to the free list.
    /// Returns how many were reclaimed.
    pub fn reclaim_cached(&self, max_blocks: usize) -> usize {
        let mut st = self.lock();
        let mut n = 0;
        while n < max_blocks {
            let Some(b) = st.index.pop_lru() else { break };
            let m = &mut st.meta[b.0 as usize];
            m.node = NO_NODE;
            m.tokens_stored = 0;
            st.free.push(b);
            st.counters.reclaimed_blocks += 1;
            n += 1;
        }
        n
    }

    /// The pool mapping's resident bytes and those on huge pages, from `/proc/self/smaps`
    /// (milliseconds: for statistics and tests, not hot paths); zeros where it cannot be read.
    pub fn residency(&self) -> KvPoolResidency {
        let start = self.base.as_ptr() as usize;
        let end = start + self.blocks_total as usize * self.block_bytes;
        let smaps = sys::smaps_totals(start, end).unwrap_or_default();
        KvPoolResidency {
            resident_bytes: smaps.rss,
            huge_page_bytes: smaps.huge,
        }
    }

    /// How many blocks would become available (free or cached) if the block references
    /// `dropped` were released: the distinct blocks whose every reference is among them. A
    /// block shared with a table that keeps it stays held. Lets an eviction policy know what
    /// evicting sessions frees before it evicts anyone. O(refs log refs).
    pub fn releasable_blocks(&self, dropped: impl IntoIterator<Item = BlockId>) -> u32 {
        let mut refs: Vec<BlockId> = dropped.into_iter().collect();
        refs.sort_unstable();
        let st = self.lock();
        let mut releasable = 0;
        for run in refs.chunk_by(|a, b| a == b) {
            let held = st
                .meta
                .get(run[0].0 as usize)
                .map_or(u32::MAX, |m| m.refcount);
            releasable += u32::from(held as usize == run.len());
        }
        releasable
    }

    /// The pool's accounting (scans every block).
    pub fn stats(&self) -> KvPoolStats {
        let st = self.lock();
        self.stats_locked(&st)
    }

    fn stats_locked(&self, st: &PoolState) -> KvPoolStats {
        let mut s = KvPoolStats {
            pool_bytes: self.config.pool_bytes,
            block_bytes: self.block_bytes,
            bytes_per_token: self.config.bytes_per_token,
            tokens_per_block: self.config.tokens_per_block,
            blocks_total: self.blocks_total,
            blocks_used: 0,
            blocks_cached: 0,
            blocks_free: st.free.len() as u32,
            used_bytes: 0,
            cached_bytes: 0,
            tokens_stored: 0,
            cached_tokens_stored: 0,
            waste_bytes: 0,
            shared_blocks: 0,
            shared_refcounts: Vec::new(),
            block_refs: 0,
            shared_savings_bytes: 0,
            indexed_blocks: st.index.len() as u32,
            pinned: self.pinned,
            counters: st.counters.clone(),
        };
        let mut histogram = std::collections::BTreeMap::<u32, u32>::new();
        for m in &st.meta {
            if m.refcount > 0 {
                s.blocks_used += 1;
                s.tokens_stored += u64::from(m.tokens_stored);
                s.block_refs += u64::from(m.refcount);
                if m.refcount > 1 {
                    s.shared_blocks += 1;
                    *histogram.entry(m.refcount).or_default() += 1;
                }
            } else if m.node != NO_NODE {
                s.blocks_cached += 1;
                s.cached_tokens_stored += u64::from(m.tokens_stored);
            }
        }
        s.shared_refcounts = histogram.into_iter().collect();
        s.used_bytes = s.blocks_used as usize * self.block_bytes;
        s.cached_bytes = s.blocks_cached as usize * self.block_bytes;
        s.waste_bytes = s.used_bytes - s.tokens_stored as usize * self.config.bytes_per_token;
        s.shared_savings_bytes =
            (s.block_refs - u64::from(s.blocks_used)) as usize * self.block_bytes;
        s
    }

    /// Verify every invariant of the pool and its index and return the stats: each block is
    /// exactly one of free / used / cached; the free list has no duplicates and holds only
    /// unreferenced, unindexed, empty blocks; indexed blocks are full and point at their node;
    /// a node's block has no more references than its parent's (so cached blocks have only
    /// cached descendants and are all reclaimable); the budget holds. For tests and debugging.
    pub fn audit(&self) -> std::result::Result<KvPoolStats, String> {
        let st = self.lock();
        let tpb = self.config.tokens_per_block;
        let mut on_free_list = vec![false; st.meta.len()];
        for b in &st.free {
            let i = b.0 as usize;
            if std::mem::replace(&mut on_free_list[i], true) {
                return Err(format!("block {i} is on the free list twice"));
            }
            let m = st.meta[i];
            if m.refcount != 0 || m.node != NO_NODE || m.tokens_stored != 0 {
                return Err(format!(
                    "free block {i} is referenced, indexed or not empty"
                ));
            }
        }
        for (i, m) in st.meta.iter().enumerate() {
            if m.tokens_stored > tpb {
                return Err(format!(
                    "block {i} stores {} > {tpb} positions",
                    m.tokens_stored
                ));
            }
            let free = on_free_list[i];
            let used = m.refcount > 0;
            let cached = m.refcount == 0 && m.node != NO_NODE;
            if usize::from(free) + usize::from(used) + usize::from(cached) != 1 {
                return Err(format!("block {i} is not exactly one of free/used/cached"));
            }
            if m.node != NO_NODE && m.tokens_stored != tpb {
                return Err(format!("indexed block {i} is not full"));
            }
        }
        st.index.audit()?;
        for n in st.index.nodes() {
            let m = st.meta[n.block.0 as usize];
            if m.node != n.id.0 {
                return Err(format!("node {:?} and block {:?} disagree", n.id, n.block));
            }
            if n.cached != (m.refcount == 0) {
                return Err(format!(
                    "node {:?}: cached flag disagrees with refcount",
                    n.id
                ));
            }
            if let Some(p) = n.parent {
                let pm = st.meta[st.index.block(p).0 as usize];
                if m.refcount > pm.refcount {
                    return Err(format!(
                        "node {:?} has more references than its parent",
                        n.id
                    ));
                }
            }
        }
        if self.blocks_total as usize * self.block_bytes > self.config.pool_bytes {
            return Err("the pool exceeds its budget".into());
        }
        let s = self.stats_locked(&st);
        if (s.blocks_used + s.blocks_cached + s.blocks_free) != self.blocks_total {
            return Err("blocks do not add up".into());
        }
        Ok(s)
    }

    fn block_ptr(&self, b: BlockId) -> *mut u8 {
        assert!(b.0 < self.blocks_total, "block {b:?} out of range");
        // In bounds of the mapping: b < blocks_total and the mapping spans
        // blocks_total × block_bytes bytes.
        self.base
            .as_ptr()
            .wrapping_add(b.0 as usize * self.block_bytes)
    }

    /// Copy all bytes of block `src` into block `dst`.
    ///
    /// # Safety
    /// `src` and `dst` must differ, nobody may write `src`, and nobody else may access `dst`.
    unsafe fn copy_block(&self, src: BlockId, dst: BlockId) {
        assert_ne!(src, dst);
        // SAFETY: both ranges lie inside the mapping (block_ptr checks the ids), distinct
        // blocks do not overlap, and the caller guarantees no concurrent writer of `src` and no
        // other accessor of `dst`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.block_ptr(src),
                self.block_ptr(dst),
                self.block_bytes,
            );
        }
    }
}

/// `MADV_HUGEPAGE` on the pool's mapping where THP is `usable`; a notice where it is not or
/// the kernel refuses (the pool then stays on base pages).
fn advise_huge_pages(mapping: &AnonMapping, usable: bool, notices: &mut Vec<Notice>) {
    let page_kib = sys::page_size() / 1024;
    let why = if !usable {
        "transparent huge pages are off or unavailable".to_string()
    } else {
        match mapping.advise_huge_pages() {
            Ok(()) => return,
            Err(e) => format!("madvise(MADV_HUGEPAGE) refused ({})", errno_name(e)),
        }
    };
    notices.push(Notice::new(
        NoticeKind::NoHugePages,
        format!("{why}: the KV pool uses {page_kib} KiB pages"),
    ));
}

fn pin(mapping: &AnonMapping, policy: PinPolicy, notices: &mut Vec<Notice>) -> bool {
    let on_fault = |notices: &mut Vec<Notice>, why: String| match mapping.lock_on_fault() {
        Ok(()) => {
            if !why.is_empty() {
                notices.push(Notice::new(
                    NoticeKind::PinnedOnFault,
                    format!("{why}: the KV pool is pinned with mlock2(MLOCK_ONFAULT)"),
                ));
            }
            true
        }
        Err(e) => {
            notices.push(Notice::new(
                NoticeKind::NotPinned,
                format!(
                    "{}mlock2(MLOCK_ONFAULT) refused ({}): the KV pool is not pinned (raise \
                     RLIMIT_MEMLOCK, e.g. ulimit -l)",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!("{why}, ")
                    },
                    errno_name(e)
                ),
            ));
            false
        }
    };
    match policy {
        PinPolicy::None => false,
        PinPolicy::OnFault => on_fault(notices, String::new()),
        PinPolicy::Populate => match mapping.lock() {
            Ok(()) => true,
            Err(e) => on_fault(notices, format!("mlock refused ({})", errno_name(e))),
        },
    }
}

/// One sequence's view of the pool: logical block `i` (positions `i × tokens_per_block ..`)
/// → [`BlockId`]. Grows on demand ([`reserve`](Self::reserve)), records stored positions
/// ([`commit`](Self::commit)), indexes its full blocks under its salt once their token ids are
/// known, and returns its references when dropped.
#[derive(Debug)]
pub struct BlockTable {
    pool: Arc<KvPool>,
    blocks: Vec<BlockId>,
    /// Committed positions.
    len: usize,
    /// Logical blocks at or above this index are held exclusively and may be written.
    exclusive_from: usize,
    /// Token ids of positions `0..tokens.len()` as declared by the caller.
    tokens: Vec<u32>,
    salt: Option<Box<[u8]>>,
    /// Leading blocks that lie on the prefix index's path (block `i` is node `i` of it).
    indexed: usize,
    /// Node of block `indexed − 1`.
    cursor: Option<NodeId>,
    /// False once another copy of one of our blocks turned out to be indexed.
    indexing: bool,
}

impl BlockTable {
    /// The pool the table allocates from.
    pub fn pool(&self) -> &Arc<KvPool> {
        &self.pool
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the held blocks can store.
    pub fn capacity(&self) -> usize {
        self.blocks.len() * self.pool.tokens_per_block()
    }

    /// The block table: logical block → block.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Bytes of the blocks this sequence holds, shared ones included (the pool's stats count
    /// each block once).
    pub fn allocated_bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes
    }

    /// Token ids declared so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Leading blocks shared through or published to the prefix index.
    pub fn indexed_blocks(&self) -> usize {
        self.indexed
    }

    /// Make positions up to `new_len` (exclusive) writable: allocate the missing blocks and,
    /// if the block holding position `len()` is shared or indexed, replace it by a private
    /// copy (copy-on-write). All or nothing: on [`PoolExhausted`] the table is unchanged.
    pub fn reserve(&mut self, new_len: usize) -> std::result::Result<(), PoolExhausted> {
        let tpb = self.pool.tokens_per_block();
        let last = self.len / tpb;
        let cow = !self.len.is_multiple_of(tpb) && last < self.exclusive_from && new_len > self.len;
        let missing = new_len.div_ceil(tpb).saturating_sub(self.blocks.len());
        if !cow && missing == 0 {
            return Ok(());
        }
        let pool = Arc::clone(&self.pool);
        let mut st = pool.lock();
        let old = self.blocks.get(last).copied();
        // A block we only think is shared may have lost its other holders: then it is ours.
        let copy = cow
            && old.is_some_and(|b| {
                let m = st.meta[b.0 as usize];
                m.refcount > 1 || m.node != NO_NODE
            });
        let needed = missing + usize::from(copy);
        if st.available() < needed {
            return Err(PoolExhausted {
                needed_blocks: needed as u32,
                available_blocks: st.available() as u32,
                blocks_total: pool.blocks_total,
                block_bytes: pool.block_bytes,
                pool_bytes: pool.config.pool_bytes,
            });
        }
        if let (true, Some(old)) = (cow, old) {
            if copy {
                let new = st.alloc().expect("availability checked");
                // SAFETY: `old` is shared or indexed, hence immutable, and we hold it; `new`
                // was just allocated and is referenced by nobody else.
                unsafe { pool.copy_block(old, new) };
                st.meta[new.0 as usize].tokens_stored = (self.len % tpb) as u32;
                st.release(old);
                st.counters.cow_copies += 1;
                self.blocks[last] = new;
            }
            self.exclusive_from = last;
        }
        for _ in 0..missing {
            let b = st.alloc().expect("availability checked");
            self.blocks.push(b);
        }
        Ok(())
    }

    /// Record that positions `0..len` are stored (every layer written), then index the blocks
    /// that became full if their token ids are declared. `len` must not shrink nor exceed the
    /// capacity.
    pub fn commit(&mut self, len: usize) {
        assert!(
            len >= self.len && len <= self.capacity(),
            "commit({len}) outside {}..={}",
            self.len,
            self.capacity()
        );
        if len == self.len {
            return;
        }
        let tpb = self.pool.tokens_per_block();
        let pool = Arc::clone(&self.pool);
        let mut st = pool.lock();
        for i in self.len / tpb..len.div_ceil(tpb) {
            debug_assert!(i >= self.exclusive_from, "committing into a shared block");
            let stored = (len - i * tpb).min(tpb) as u32;
            st.meta[self.blocks[i].0 as usize].tokens_stored = stored;
        }
        self.len = len;
        self.index_full_blocks(&mut st);
    }

    /// Forget the committed positions from `len` on (draft tokens a verification rejected),
    /// returning the blocks that no longer hold any position to the pool; returns the new
    /// length. Positions in shared or indexed blocks are immutable and never forgotten: the
    /// length does not go below them. Token ids declared for forgotten positions stay declared
    /// (the caller must compute exactly those tokens there again).
    pub fn truncate(&mut self, len: usize) -> usize {
        let tpb = self.pool.tokens_per_block();
        let floor = (self.exclusive_from.max(self.indexed) * tpb).min(self.len);
        let len = len.clamp(floor, self.len);
        if len == self.len {
            return len;
        }
        let keep_blocks = len.div_ceil(tpb);
        let pool = Arc::clone(&self.pool);
        let mut st = pool.lock();
        if !len.is_multiple_of(tpb) {
            st.meta[self.blocks[len / tpb].0 as usize].tokens_stored = (len % tpb) as u32;
        }
        // Blocks past the committed positions (reserved, never written) go too.
        for b in self.blocks.drain(keep_blocks..) {
            st.release(b);
        }
        self.len = len;
        len
    }

    /// Declare the token ids of the positions after those already declared (e.g. generated
    /// tokens), so that full blocks holding them can be indexed for reuse. The caller must
    /// compute exactly these tokens at those positions.
    pub fn extend_tokens(&mut self, ids: &[u32]) {
        self.tokens.extend_from_slice(ids);
        let tpb = self.pool.tokens_per_block();
        if self.indexing && self.len.min(self.tokens.len()) / tpb > self.indexed {
            let pool = Arc::clone(&self.pool);
            let mut st = pool.lock();
            self.index_full_blocks(&mut st);
        }
    }

    fn index_full_blocks(&mut self, st: &mut PoolState) {
        let tpb = self.pool.tokens_per_block();
        let full = self.len.min(self.tokens.len()) / tpb;
        while self.indexing && self.indexed < full {
            let i = self.indexed;
            let tokens = &self.tokens[i * tpb..(i + 1) * tpb];
            let block = self.blocks[i];
            let salt = self.salt.as_deref();
            let parent = self.cursor.or_else(|| st.index.find_root(salt));
            let tick = st.next_tick();
            if let Some(parent) = parent {
                if let Some(c) = st.index.child(parent, tokens) {
                    if st.index.block(c) == block {
                        st.index.touch(c, tick);
                        self.cursor = Some(c);
                        self.indexed += 1;
                        continue;
                    }
                    // Another copy of this prefix is indexed: ours stays private.
                    self.indexing = false;
                    break;
                }
                if !st.index.can_insert(parent, tokens) {
                    self.indexing = false;
                    break;
                }
            }
            let parent = parent.unwrap_or_else(|| st.index.root(salt));
            debug_assert_eq!(st.meta[block.0 as usize].node, NO_NODE);
            let node = st.index.insert(parent, tokens, block, tick);
            st.meta[block.0 as usize].node = node.0;
            self.cursor = Some(node);
            self.indexed += 1;
        }
        // Indexed blocks are immutable from now on.
        self.exclusive_from = self.exclusive_from.max(self.indexed);
    }

    /// A second sequence with the same contents, sharing every block that holds committed
    /// positions (copy-on-write on the next write into a shared partial block). Blocks reserved
    /// beyond `len()` stay with `self`.
    pub fn fork(&mut self) -> BlockTable {
        let tpb = self.pool.tokens_per_block();
        let n = self.len.div_ceil(tpb);
        let mut st = self.pool.lock();
        for &b in &self.blocks[..n] {
            st.retain(b);
        }
        drop(st);
        self.exclusive_from = self.exclusive_from.max(n);
        BlockTable {
            pool: Arc::clone(&self.pool),
            blocks: self.blocks[..n].to_vec(),
            len: self.len,
            exclusive_from: n,
            tokens: self.tokens[..self.len.min(self.tokens.len())].to_vec(),
            salt: self.salt.clone(),
            indexed: self.indexed,
            cursor: self.cursor,
            indexing: self.indexing,
        }
    }

    /// The bytes of logical block `i`, for reading.
    pub fn block(&self, i: usize) -> &[u8] {
        let b = self.blocks[i];
        // SAFETY: the table holds a reference on `b`, so it stays allocated to us while `self`
        // is borrowed. Its bytes are written only by a table holding it exclusively through
        // `block_mut` (`&mut`): if that is this table, the borrow checker excludes it while this
        // slice lives; no other table can hold it exclusively while we reference it, and the
        // pool copies only from immutable (shared or indexed) blocks.
        unsafe { std::slice::from_raw_parts(self.pool.block_ptr(b), self.pool.block_bytes) }
    }

    /// The bytes of logical block `i`, for writing. Panics unless the block is held exclusively
    /// (call [`reserve`](Self::reserve) for the positions first).
    pub fn block_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(
            i >= self.exclusive_from && i < self.blocks.len(),
            "logical block {i} is shared, indexed or not reserved (reserve first)"
        );
        let b = self.blocks[i];
        // SAFETY: blocks at or above `exclusive_from` were allocated or copied for this table
        // alone and have been neither shared (fork raises the watermark) nor indexed (indexing
        // raises it too), so no other table or the pool reads or writes them; `&mut self`
        // excludes this table's own readers.
        unsafe { std::slice::from_raw_parts_mut(self.pool.block_ptr(b), self.pool.block_bytes) }
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        for &b in &self.blocks {
            st.release(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(blocks: usize) -> Arc<KvPool> {
        let mut c = KvPoolConfig::new(blocks * 4 * 8, 8);
        c.tokens_per_block = 4;
        c.pin = PinPolicy::None;
        KvPool::new(c).unwrap()
    }

    #[test]
    fn a_budget_without_a_block_is_a_config_error() {
        let e = KvPool::new(KvPoolConfig::new(100, 8)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
    }

    #[test]
    fn tables_grow_on_demand_and_return_blocks() {
        let p = pool(4);
        let mut t = p.new_table(None);
        t.reserve(5).unwrap();
        assert_eq!(t.blocks().len(), 2);
        t.commit(5);
        let s = p.audit().unwrap();
        assert_eq!((s.blocks_used, s.tokens_stored), (2, 5));
        assert_eq!(s.waste_bytes, 3 * 8);
        drop(t);
        assert_eq!(p.audit().unwrap().blocks_free, 4);
    }

    #[test]
    fn exhaustion_is_typed_and_leaves_the_table_unchanged() {
        let p = pool(2);
        let mut t = p.new_table(None);
        t.reserve(8).unwrap();
        let e = t.reserve(9).unwrap_err();
        assert_eq!(
            (e.needed_blocks, e.available_blocks, e.blocks_total),
            (1, 0, 2)
        );
        assert_eq!(t.blocks().len(), 2);
        p.audit().unwrap();
    }
}
