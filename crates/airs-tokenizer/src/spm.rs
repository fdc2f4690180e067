//! SentencePiece BPE, as llama.cpp's `llm_tokenizer_spm_session` does it.
//!
//! SentencePiece "BPE" vocabularies (`tokenizer.ggml.model = llama`: Llama 2, TinyLlama,
//! Mistral v0.1, Phi-3, the stories models) ship no merge list; the merges are implied by
//! the vocabulary and its scores. The text (spaces already escaped to `▁` U+2581) starts as
//! one symbol per UTF-8 character; then, repeatedly, the adjacent pair whose concatenation
//! is a token with the highest score (ties to the leftmost pair) is merged. A final symbol
//! that is not a token (a character missing from the vocabulary) is emitted as byte tokens
//! `<0xXX>` (SentencePiece's byte fallback).
//!
//! Cost: O(n log n) for n characters (a binary heap of candidate pairs, stale entries
//! skipped), one vocabulary lookup of a slice of the input per candidate pair; no strings
//! are built.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::TokenId;
use crate::vocab::Vocab;

const NONE: usize = usize::MAX;

#[derive(Copy, Clone, Debug)]
struct Symbol {
    /// Byte range of the symbol in the (escaped) text; empty once merged into its left
    /// neighbour.
    start: usize,
    end: usize,
    /// The token whose text is this symbol, if any.
    id: Option<TokenId>,
    prev: usize,
    next: usize,
}

/// A candidate merge of `symbols[left]` and `symbols[right]` into `merged`.
#[derive(Copy, Clone, Debug)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    /// Bytes of the merged text, to recognise stale candidates.
    len: usize,
    merged: TokenId,
}

impl Ord for Candidate {
    /// The heap's maximum is the highest score, then the leftmost pair.
    fn cmp(&self, other: &Candidate) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
            // The rest only makes the order total (consistent with `Eq`).
            .then_with(|| other.right.cmp(&self.right))
            .then_with(|| other.len.cmp(&self.len))
            .then_with(|| other.merged.cmp(&self.merged))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Candidate) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Candidate) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// Buffers reused across fragments.
#[derive(Default)]
pub(crate) struct SpmScratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Candidate>,
}

/// Encode `text` (spaces already escaped), appending its tokens to `out`. `byte_tokens`
/// gives the token for each byte in the fallback; a byte without one is emitted as `unk`,
/// or dropped if there is none.
pub(crate) fn encode(
    vocab: &Vocab,
    byte_tokens: &[Option<TokenId>; 256],
    unk: Option<TokenId>,
    text: &str,
    out: &mut Vec<TokenId>,
    scratch: &mut SpmScratch,
) {
    if text.is_empty() {
        return;
    }
    let symbols = &mut scratch.symbols;
    symbols.clear();
    for (start, c) in text.char_indices() {
        let end = start + c.len_utf8();
        let index = symbols.len();
        symbols.push(Symbol {
            start,
            end,
            id: vocab.lookup(&text.as_bytes()[start..end]),
            prev: if index == 0 { NONE } else { index - 1 },
            next: if end == text.len() { NONE } else { index + 1 },
        });
    }
    let heap = &mut scratch.heap;
    heap.clear();
    for left in 0..symbols.len() - 1 {
        push_candidate(vocab, text, symbols, heap, left, left + 1);
    }
    while let Some(c) = heap.pop() {
        let (l, r) = (symbols[c.left], symbols[c.right]);
        let stale =
            l.start == l.end || r.start == r.end || l.next != c.right || r.end - l.start != c.len;
        if stale {
            continue;
        }
        symbols[c.left].end = r.end;
        symbols[c.left].id = Some(c.merged);
        symbols[c.left].next = r.next;
        symbols[c.right].end = r.start;
        if r.next != NONE {
            symbols[r.next].prev = c.left;
        }
        if l.prev != NONE {
            push_candidate(vocab, text, symbols, heap, l.prev, c.left);
        }
        if r.next != NONE {
            push_candidate(vocab, text, symbols, heap, c.left, r.next);
        }
    }
    let mut i = 0;
    while i != NONE {
        let s = symbols[i];
        match s.id {
            Some(id) => out.push(id),
            None => {
                for &b in &text.as_bytes()[s.start..s.end] {
                    if let Some(id) = byte_tokens[b as usize].or(unk) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

fn push_candidate(
    vocab: &Vocab,
    text: &str,
    symbols: &[Symbol],
    heap: &mut BinaryHeap<Candidate>,
    left: usize,
    right: usize,
) {
    let (start, end) = (symbols[left].start, symbols[right].end);
    if let Some(merged) = vocab.lookup(&text.as_bytes()[start..end]) {
        heap.push(Candidate {
            score: vocab.score(merged),
            left,
            right,
            len: end - start,
            merged,
        });
    }
}
