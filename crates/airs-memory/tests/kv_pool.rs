//! The KV block pool under random interleavings of sequence operations — new sequences with
//! prefix lookup, appends, forks, frees, reclaims and truncations — checked against a model after every step:
//! refcounts never underflow (the pool panics if they would), no block is both free and
//! referenced, every byte and every stored position is accounted for, the budget holds, and every
//! sequence reads back exactly the rows it (or the sequence it shares them with) wrote.
//!
//! Rows are 8 bytes: the value stored for position `p` is a hash of the token ids `0..=p`, so a
//! row found through the prefix index must equal the row the sequence would have computed.

use std::collections::HashMap;
use std::sync::Arc;

use airs_memory::{
    BlockTable, KvPool, KvPoolConfig, NoticeKind, PinPolicy, ThpMode, huge_page_size, page_size,
    thp_mode,
};
use proptest::prelude::*;

const ROW: usize = 8;

fn row_value(tokens: &[u32]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h & !(1 << 63)
}

struct Seq {
    table: BlockTable,
    /// Expected value of every committed position.
    rows: Vec<u64>,
    /// Positions were appended without declaring their tokens: rows are unique values.
    undeclared: bool,
}

fn salt(s: u8) -> Option<&'static [u8]> {
    match s {
        0 => None,
        1 => Some(b"tenant-a"),
        _ => Some(b"tenant-b"),
    }
}

/// Write rows `from..to` of `seq` (already reserved) and commit them.
fn write_rows(seq: &mut Seq, from: usize, to: usize, unique: &mut u64) {
    let tpb = seq.table.pool().tokens_per_block();
    for p in from..to {
        let value = if seq.undeclared {
            *unique += 1;
            (1 << 63) | *unique
        } else {
            row_value(&seq.table.tokens()[..=p])
        };
        let at = (p % tpb) * ROW;
        seq.table.block_mut(p / tpb)[at..at + ROW].copy_from_slice(&value.to_le_bytes());
        seq.rows.push(value);
    }
    seq.table.commit(to);
}

fn tpb_of(table: &BlockTable) -> usize {
    table.pool().tokens_per_block()
}

fn read_row(table: &BlockTable, p: usize) -> u64 {
    let tpb = table.pool().tokens_per_block();
    let at = (p % tpb) * ROW;
    u64::from_le_bytes(table.block(p / tpb)[at..at + ROW].try_into().unwrap())
}

#[derive(Clone, Debug)]
enum Op {
    New {
        salt: u8,
        prompt: Vec<u32>,
    },
    Append {
        seq: usize,
        tokens: Vec<u32>,
        declare: bool,
    },
    Fork {
        seq: usize,
    },
    Free {
        seq: usize,
    },
    Reclaim {
        blocks: usize,
    },
    /// Forget the last `drop` positions (rejected draft tokens).
    Truncate {
        seq: usize,
        drop: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    // A 3-token alphabet makes shared prefixes (and partial-block matches) common.
    let tokens = |max| prop::collection::vec(0u32..3, 0..max);
    prop_oneof![
        3 => (0u8..3, tokens(24)).prop_map(|(salt, prompt)| Op::New { salt, prompt }),
        4 => (0usize..8, tokens(10), prop::bool::weighted(0.9))
            .prop_map(|(seq, tokens, declare)| Op::Append { seq, tokens, declare }),
        2 => (0usize..8).prop_map(|seq| Op::Fork { seq }),
        2 => (0usize..8).prop_map(|seq| Op::Free { seq }),
        1 => (0usize..4).prop_map(|blocks| Op::Reclaim { blocks }),
        2 => (0usize..8, 0usize..10).prop_map(|(seq, drop)| Op::Truncate { seq, drop }),
    ]
}

fn check(pool: &Arc<KvPool>, seqs: &[Seq]) -> Result<(), TestCaseError> {
    let stats = pool.audit().map_err(TestCaseError::fail)?;
    let tpb = pool.tokens_per_block();
    // Every sequence reads back its rows.
    for (i, s) in seqs.iter().enumerate() {
        prop_assert_eq!(s.table.len(), s.rows.len());
        for (p, &want) in s.rows.iter().enumerate() {
            prop_assert_eq!(read_row(&s.table, p), want, "sequence {} position {}", i, p);
        }
    }
    // References and stored positions, from the sequences' side.
    let mut refs: HashMap<u32, u32> = HashMap::new();
    let mut stored: HashMap<u32, usize> = HashMap::new();
    for s in seqs {
        for (i, b) in s.table.blocks().iter().enumerate() {
            *refs.entry(b.0).or_default() += 1;
            let rows = s.table.len().saturating_sub(i * tpb).min(tpb);
            let prev = stored.insert(b.0, rows);
            prop_assert!(
                prev.is_none() || prev == Some(rows),
                "holders disagree on block {}",
                b.0
            );
        }
    }
    prop_assert_eq!(stats.blocks_used as usize, refs.len());
    prop_assert_eq!(
        stats.block_refs,
        refs.values().map(|&r| u64::from(r)).sum::<u64>()
    );
    prop_assert_eq!(stats.tokens_stored as usize, stored.values().sum::<usize>());
    let shared = refs.values().filter(|&&r| r > 1).count();
    prop_assert_eq!(stats.shared_blocks as usize, shared);
    // Every byte: used + cached + free = the pool, within the budget; waste is exact.
    let block = stats.block_bytes;
    prop_assert_eq!(
        stats.used_bytes + stats.cached_bytes + stats.blocks_free as usize * block,
        stats.blocks_total as usize * block
    );
    prop_assert!(stats.blocks_total as usize * block <= stats.pool_bytes);
    prop_assert_eq!(
        stats.waste_bytes,
        stats.used_bytes - stats.tokens_stored as usize * stats.bytes_per_token
    );
    prop_assert!(stats.waste_bytes < seqs.len().max(1) * block || seqs.is_empty());
    Ok(())
}

fn run(ops: Vec<Op>, tokens_per_block: u32, blocks: usize) -> Result<(), TestCaseError> {
    let pool = KvPool::new(KvPoolConfig {
        pool_bytes: blocks * tokens_per_block as usize * ROW + ROW - 1,
        bytes_per_token: ROW,
        tokens_per_block,
        pin: PinPolicy::None,
        huge_pages: false,
    })
    .unwrap();
    let mut seqs: Vec<Seq> = Vec::new();
    let mut unique = 0u64;
    for op in ops {
        match op {
            Op::New { salt: s, prompt } => {
                let (table, cached) = pool.new_table_with_prefix(salt(s), &prompt);
                prop_assert!(cached < prompt.len().max(1));
                let mut seq = Seq {
                    rows: (0..cached).map(|p| row_value(&prompt[..=p])).collect(),
                    table,
                    undeclared: false,
                };
                // Compute the rest of the prompt, if the pool lets us.
                let before = seq.table.blocks().to_vec();
                match seq.table.reserve(prompt.len()) {
                    Ok(()) => write_rows(&mut seq, cached, prompt.len(), &mut unique),
                    Err(e) => {
                        prop_assert!(e.needed_blocks > e.available_blocks);
                        prop_assert_eq!(seq.table.blocks(), &before[..]);
                    }
                }
                seqs.push(seq);
            }
            Op::Append {
                seq,
                tokens,
                declare,
            } => {
                let Some(n) = seqs.len().checked_sub(1).map(|last| seq.min(last)) else {
                    continue;
                };
                let s = &mut seqs[n];
                let len = s.table.len();
                // Positions whose tokens were declared (a prompt not computed yet) come first.
                let declared_ahead = s.table.tokens().len().saturating_sub(len);
                let count = tokens.len().max(declared_ahead.min(1));
                if !declare && declared_ahead == 0 {
                    s.undeclared = true;
                }
                if !s.undeclared && count > declared_ahead {
                    s.table.extend_tokens(&tokens[declared_ahead..count]);
                }
                let before = s.table.blocks().to_vec();
                match s.table.reserve(len + count) {
                    Ok(()) => write_rows(s, len, len + count, &mut unique),
                    Err(e) => {
                        let stats = pool.stats();
                        prop_assert_eq!(
                            e.available_blocks,
                            stats.blocks_free + stats.blocks_cached
                        );
                        prop_assert_eq!(s.table.blocks(), &before[..]);
                    }
                }
            }
            Op::Fork { seq } => {
                if let Some(last) = seqs.len().checked_sub(1) {
                    let parent = &mut seqs[seq.min(last)];
                    let table = parent.table.fork();
                    let child = Seq {
                        rows: parent.rows.clone(),
                        table,
                        undeclared: parent.undeclared,
                    };
                    seqs.push(child);
                }
            }
            Op::Free { seq } => {
                if let Some(last) = seqs.len().checked_sub(1) {
                    seqs.remove(seq.min(last));
                }
            }
            Op::Reclaim { blocks } => {
                let cached = pool.stats().blocks_cached as usize;
                prop_assert_eq!(pool.reclaim_cached(blocks), blocks.min(cached));
            }
            Op::Truncate { seq, drop } => {
                if let Some(last) = seqs.len().checked_sub(1) {
                    let s = &mut seqs[seq.min(last)];
                    let (len, tpb) = (s.table.len(), tpb_of(&s.table));
                    let want = len.saturating_sub(drop);
                    let got = s.table.truncate(want);
                    // Only positions in shared or indexed blocks are kept against the request.
                    prop_assert!(got >= want && got <= len);
                    prop_assert!(got == want || got == len || got.is_multiple_of(tpb));
                    if got < len {
                        prop_assert_eq!(s.table.blocks().len(), got.div_ceil(tpb));
                    }
                    s.rows.truncate(got);
                }
            }
        }
        check(&pool, &seqs)?;
    }
    drop(seqs);
    let stats = pool.audit().map_err(TestCaseError::fail)?;
    prop_assert_eq!(stats.blocks_used, 0);
    prop_assert_eq!(stats.blocks_free + stats.blocks_cached, stats.blocks_total);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn random_interleavings_keep_every_invariant(
        ops in prop::collection::vec(op(), 1..60),
        tokens_per_block in prop::sample::select(vec![1u32, 2, 4]),
        blocks in 6usize..24,
    ) {
        run(ops, tokens_per_block, blocks)?;
    }
}

/// An unpinned pool of 8 blocks of 4 positions.
fn eight_blocks_of_four() -> Arc<KvPool> {
    KvPool::new(KvPoolConfig {
        pool_bytes: 8 * 4 * ROW,
        bytes_per_token: ROW,
        tokens_per_block: 4,
        pin: PinPolicy::None,
        huge_pages: false,
    })
    .unwrap()
}

/// A sequence with nothing stored, without a salt.
fn empty_seq(pool: &Arc<KvPool>) -> Seq {
    Seq {
        table: pool.new_table(None),
        rows: Vec::new(),
        undeclared: false,
    }
}

#[test]
fn a_fork_then_writes_on_both_sides_copy_the_shared_block_once() {
    let pool = eight_blocks_of_four();
    let mut unique = 0;
    let mut a = empty_seq(&pool);
    a.table.extend_tokens(&[1, 2, 3, 4, 5, 6]);
    a.table.reserve(6).unwrap();
    write_rows(&mut a, 0, 6, &mut unique);
    let mut b = Seq {
        table: a.table.fork(),
        rows: a.rows.clone(),
        undeclared: false,
    };
    for s in [&mut a, &mut b] {
        let len = s.table.len();
        s.table.extend_tokens(&[9]);
        s.table.reserve(len + 1).unwrap();
        write_rows(s, len, len + 1, &mut unique);
    }
    let stats = pool.audit().unwrap();
    assert_eq!(stats.counters.cow_copies, 1);
    assert_eq!(stats.shared_refcounts, vec![(2, 1)]); // the first, full block
    assert_eq!(stats.indexed_blocks, 1);
    check(&pool, &[a, b]).unwrap();
}

#[test]
fn releasable_blocks_counts_shared_blocks_only_when_every_holder_lets_go() {
    let pool = eight_blocks_of_four();
    let mut a = pool.new_table(None);
    a.extend_tokens(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    a.reserve(9).unwrap();
    a.commit(9);
    // b shares a's first two blocks and adds one of its own.
    let mut b = a.fork();
    b.extend_tokens(&[10]);
    b.reserve(10).unwrap();
    assert_eq!((a.blocks().len(), b.blocks().len()), (3, 3));
    let shared = a.blocks()[..2].to_vec();
    assert_eq!(b.blocks()[..2], shared[..]);
    // Dropping b frees only the block it does not share (the copy of the partial one).
    assert_eq!(pool.releasable_blocks(b.blocks().iter().copied()), 1);
    // Dropping both frees all four distinct blocks.
    let both = a.blocks().iter().chain(b.blocks()).copied();
    assert_eq!(pool.releasable_blocks(both), 4);
    // Truncating a to one block while b lets go of everything: block 1 is released only if a
    // drops it too; block 0 stays.
    let dropped = a.blocks()[1..].iter().chain(b.blocks()).copied();
    assert_eq!(pool.releasable_blocks(dropped), 3);
    drop(b);
    assert_eq!(pool.stats().blocks_used, 3);
}

#[test]
fn pinning_is_done_or_reported() {
    for pin in [PinPolicy::Populate, PinPolicy::OnFault] {
        let pool = KvPool::new(KvPoolConfig {
            pool_bytes: 64 << 20,
            bytes_per_token: 4096,
            tokens_per_block: 16,
            pin,
            huge_pages: true,
        })
        .unwrap();
        assert!(pool.pinned() || !pool.notices().is_empty(), "{pin:?}");
        assert_eq!(pool.blocks_total(), 1024);
    }
}

#[test]
fn the_pool_is_on_huge_pages_where_the_kernel_allows_and_says_why_not_elsewhere() {
    let usable =
        matches!(thp_mode(), ThpMode::Always | ThpMode::Madvise) && huge_page_size() > page_size();
    for huge_pages in [true, false] {
        let pool = KvPool::new(KvPoolConfig {
            pool_bytes: 16 << 20,
            bytes_per_token: 4096,
            tokens_per_block: 16,
            pin: PinPolicy::None,
            huge_pages,
        })
        .unwrap();
        // 8 MiB written through a table, block by block.
        let mut table = pool.new_table(None);
        table.reserve(2048).unwrap();
        for b in 0..table.blocks().len() {
            table.block_mut(b).fill(b as u8 | 1);
        }
        table.commit(2048);
        let residency = pool.residency();
        let said = pool
            .notices()
            .iter()
            .any(|n| n.kind == NoticeKind::NoHugePages);
        if huge_pages && usable {
            // Faults in a MADV_HUGEPAGE range take huge pages while the kernel has them.
            assert!(
                residency.huge_page_bytes >= 4 << 20 && !said,
                "{residency:?} {:?}",
                pool.notices()
            );
        } else if huge_pages {
            assert!(said, "no notice without huge pages: {:?}", pool.notices());
        } else {
            assert_eq!(residency.huge_page_bytes, 0, "{residency:?}");
        }
        assert!(residency.resident_bytes >= 8 << 20, "{residency:?}");
        drop(table);
    }
}

#[test]
fn truncating_rejected_drafts_frees_their_blocks_but_never_an_indexed_one() {
    let pool = eight_blocks_of_four();
    let mut unique = 0;
    let mut a = empty_seq(&pool);
    // Five declared positions (the first block is indexed), then six undeclared drafts.
    a.table.extend_tokens(&[1, 2, 3, 4, 5]);
    a.table.reserve(5).unwrap();
    write_rows(&mut a, 0, 5, &mut unique);
    a.table.reserve(11).unwrap();
    let tpb = 4;
    for p in 5..11 {
        let at = (p % tpb) * ROW;
        a.table.block_mut(p / tpb)[at..at + ROW].copy_from_slice(&(p as u64).to_le_bytes());
    }
    a.table.commit(11);
    assert_eq!(pool.stats().blocks_used, 3);
    assert_eq!(a.table.truncate(6), 6);
    assert_eq!(a.table.blocks().len(), 2);
    let stats = pool.audit().unwrap();
    assert_eq!((stats.blocks_used, stats.tokens_stored), (2, 6));
    // The indexed first block stays whole whatever is asked.
    assert_eq!(a.table.truncate(2), 4);
    assert_eq!(a.table.indexed_blocks(), 1);
    a.rows.truncate(4);
    check(&pool, &[a]).unwrap();
}
