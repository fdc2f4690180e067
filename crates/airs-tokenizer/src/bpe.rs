//! Byte-level BPE (GPT-2 style), as llama.cpp's `llm_tokenizer_bpe_session` does it.
//!
//! Each pre-tokenized word starts as one symbol per byte (the token of that byte's
//! byte-level character); then the adjacent pair with the lowest merge rank (earliest line
//! of `tokenizer.ggml.merges`; ties to the leftmost pair) is merged, repeatedly, until no
//! adjacent pair has a merge rule. Symbols are token ids and merges are keyed by the two
//! ids, so merging never builds strings. With `ignore_merges` (Llama 3), a word that is
//! itself a token is emitted whole.
//!
//! Cost: O(n log n) per word of n bytes (a binary heap of candidate pairs, stale entries
//! skipped when popped), one hash lookup per candidate pair.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::TokenId;
use crate::bytelevel;
use crate::error::{TokenizerError, TokenizerErrorKind};
use crate::vocab::{Vocab, mix64};

/// A merge rule's outcome: its rank (priority, lower first) and the merged token.
#[derive(Copy, Clone, Debug)]
struct Merge {
    rank: u32,
    merged: TokenId,
}

/// Hasher for the `(left, right)` id pair packed in a u64.
#[derive(Default)]
struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        mix64(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

fn pair_key(left: TokenId, right: TokenId) -> u64 {
    (u64::from(left.0) << 32) | u64::from(right.0)
}

/// The merge table and per-byte start tokens of a byte-level BPE vocabulary.
#[derive(Debug)]
pub(crate) struct BpeMerges {
    merges: HashMap<u64, Merge, BuildHasherDefault<PairHasher>>,
    /// The token of each byte's byte-level character (`None` if the vocabulary lacks it).
    byte_tokens: Box<[Option<TokenId>; 256]>,
    /// Merge rules whose result is not a token and which were therefore left out.
    skipped: usize,
}

impl std::fmt::Debug for PairHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PairHasher")
    }
}

impl BpeMerges {
    /// Parse merge rules `"LEFT RIGHT"` (split at the first space after the first byte, as
    /// llama.cpp does, so a rule may merge a leading space-like character). Both parts must
    /// be tokens. A rule whose concatenation is not a token can never produce a token and is
    /// skipped (llama.cpp would merge and then fall back to bytes; no known vocabulary has
    /// such rules). The first rule for a pair wins.
    pub fn build<'a>(
        vocab: &Vocab,
        rules: impl Iterator<Item = &'a [u8]>,
        count: usize,
    ) -> Result<BpeMerges, TokenizerError> {
        let mut merges: HashMap<u64, Merge, BuildHasherDefault<PairHasher>> =
            HashMap::with_capacity_and_hasher(count, Default::default());
        let mut skipped = 0;
        let mut joined = Vec::new();
        for (rank, rule) in rules.enumerate() {
            let split = rule
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|p| p + 1)
                .filter(|&p| p + 1 < rule.len());
            let Some(split) = split else {
                return Err(TokenizerErrorKind::MalformedMerge {
                    rank,
                    text: String::from_utf8_lossy(rule).into_owned(),
                }
                .into());
            };
            let (left, right) = (&rule[..split], &rule[split + 1..]);
            let part_id = |part: &[u8]| {
                vocab.lookup(part).ok_or_else(|| {
                    TokenizerError::from(TokenizerErrorKind::MergeUnknownToken {
                        rank,
                        text: String::from_utf8_lossy(rule).into_owned(),
                        part: String::from_utf8_lossy(part).into_owned(),
                    })
                })
            };
            let (left_id, right_id) = (part_id(left)?, part_id(right)?);
            joined.clear();
            joined.extend_from_slice(left);
            joined.extend_from_slice(right);
            let Some(merged) = vocab.lookup(&joined) else {
                skipped += 1;
                continue;
            };
            merges.entry(pair_key(left_id, right_id)).or_insert(Merge {
                rank: rank as u32,
                merged,
            });
        }
        let mut byte_tokens = Box::new([None; 256]);
        let mut buf = [0u8; 4];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let c = bytelevel::BYTE_TO_CHAR[b];
            *slot = vocab.lookup(c.encode_utf8(&mut buf).as_bytes());
        }
        Ok(BpeMerges {
            merges,
            byte_tokens,
            skipped,
        })
    }

    pub fn len(&self) -> usize {
        self.merges.len()
    }

    pub fn skipped(&self) -> usize {
        self.skipped
    }

    fn merge(&self, left: TokenId, right: TokenId) -> Option<Merge> {
        self.merges.get(&pair_key(left, right)).copied()
    }

    /// The rank and result of merging `left` and `right`, if a rule does.
    #[cfg(test)]
    pub fn rank_of(&self, left: TokenId, right: TokenId) -> Option<(u32, TokenId)> {
        self.merge(left, right).map(|m| (m.rank, m.merged))
    }
}

const NO_TOKEN: u32 = u32::MAX;
const NONE: usize = usize::MAX;

#[derive(Copy, Clone, Debug)]
struct Symbol {
    /// Token id, or `NO_TOKEN` for a byte whose character is not in the vocabulary.
    id: u32,
    prev: usize,
    next: usize,
    alive: bool,
}

/// A candidate merge of `symbols[left]` and `symbols[right]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    left_id: u32,
    right_id: u32,
    merged: TokenId,
}

impl Ord for Candidate {
    /// The heap's maximum is the lowest rank, then the leftmost pair.
    fn cmp(&self, other: &Candidate) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
            // The rest only makes the order total (consistent with `Eq`).
            .then_with(|| other.right.cmp(&self.right))
            .then_with(|| (other.left_id, other.right_id).cmp(&(self.left_id, self.right_id)))
            .then_with(|| other.merged.cmp(&self.merged))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Candidate) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Buffers reused across words.
#[derive(Default)]
pub(crate) struct BpeScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Candidate>,
    encoded: String,
}

/// Encode one word (raw bytes, before byte-level mapping), appending its tokens to `out`.
pub(crate) fn encode_word(
    vocab: &Vocab,
    merges: &BpeMerges,
    ignore_merges: bool,
    word: &[u8],
    out: &mut Vec<TokenId>,
    scratch: &mut BpeScratch,
) {
    if word.is_empty() {
        return;
    }
    if ignore_merges || word.len() == 1 {
        scratch.encoded.clear();
        bytelevel::encode_into(word, &mut scratch.encoded);
        if let Some(id) = vocab.lookup(scratch.encoded.as_bytes()) {
            out.push(id);
            return;
        }
    }
    let symbols = &mut scratch.symbols;
    symbols.clear();
    symbols.extend(word.iter().enumerate().map(|(i, &b)| Symbol {
        id: merges.byte_tokens[b as usize].map_or(NO_TOKEN, |t| t.0),
        prev: if i == 0 { NONE } else { i - 1 },
        next: if i + 1 == word.len() { NONE } else { i + 1 },
        alive: true,
    }));
    let heap = &mut scratch.heap;
    heap.clear();
    for left in 0..symbols.len() - 1 {
        push_candidate(merges, symbols, heap, left, left + 1);
    }
    while let Some(c) = heap.pop() {
        let (l, r) = (symbols[c.left], symbols[c.right]);
        if !l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id {
            continue; // stale: one side was merged since this candidate was pushed
        }
        symbols[c.left].id = c.merged.0;
        symbols[c.left].next = r.next;
        symbols[c.right].alive = false;
        if r.next != NONE {
            symbols[r.next].prev = c.left;
        }
        if l.prev != NONE {
            push_candidate(merges, symbols, heap, l.prev, c.left);
        }
        if r.next != NONE {
            push_candidate(merges, symbols, heap, c.left, r.next);
        }
    }
    let mut i = 0;
    while i != NONE {
        let s = symbols[i];
        if s.id != NO_TOKEN {
            out.push(TokenId(s.id));
        }
        i = s.next;
    }
}

fn push_candidate(
    merges: &BpeMerges,
    symbols: &[Symbol],
    heap: &mut BinaryHeap<Candidate>,
    left: usize,
    right: usize,
) {
    let (left_id, right_id) = (symbols[left].id, symbols[right].id);
    if left_id == NO_TOKEN || right_id == NO_TOKEN {
        return;
    }
    if let Some(m) = merges.merge(TokenId(left_id), TokenId(right_id)) {
        heap.push(Candidate {
            rank: m.rank,
            left,
            right,
            left_id,
            right_id,
            merged: m.merged,
        });
    }
}
