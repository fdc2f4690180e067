//! The vocabulary: every token's text, score and attributes, and a text → id index.
//!
//! Texts live in one byte arena (`text`, with `ends[i]` the end of token `i`), so loading a
//! 152k-token vocabulary makes one allocation for the strings instead of one per token, and
//! the text → id index is an open-addressing table of ids that compares against the arena
//! (no second copy of the strings). Lookup costs one hash of the key and, on average, a
//! little over one comparison at the table's load factor of at most one half.

use crate::TokenId;
use crate::error::{TokenizerError, TokenizerErrorKind};

/// Token attributes, from `tokenizer.ggml.token_type` plus what airs derives (strip flags).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TokenAttrs(u8);

impl TokenAttrs {
    pub const NORMAL: TokenAttrs = TokenAttrs(1);
    pub const UNKNOWN: TokenAttrs = TokenAttrs(1 << 1);
    pub const CONTROL: TokenAttrs = TokenAttrs(1 << 2);
    pub const USER_DEFINED: TokenAttrs = TokenAttrs(1 << 3);
    pub const UNUSED: TokenAttrs = TokenAttrs(1 << 4);
    pub const BYTE: TokenAttrs = TokenAttrs(1 << 5);
    /// Whitespace to the left of this special token is dropped when it is parsed from text.
    pub const LSTRIP: TokenAttrs = TokenAttrs(1 << 6);
    /// Whitespace to the right of this special token is dropped when it is parsed from text.
    pub const RSTRIP: TokenAttrs = TokenAttrs(1 << 7);

    /// The attributes of a GGUF token type (llama.cpp's `llama_token_type`: 1 normal,
    /// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; anything else is undefined,
    /// which decodes to nothing).
    pub fn from_token_type(ty: i64) -> TokenAttrs {
        match ty {
            1 => TokenAttrs::NORMAL,
            2 => TokenAttrs::UNKNOWN,
            3 => TokenAttrs::CONTROL,
            4 => TokenAttrs::USER_DEFINED,
            5 => TokenAttrs::UNUSED,
            6 => TokenAttrs::BYTE,
            _ => TokenAttrs(0),
        }
    }

    pub fn contains(self, other: TokenAttrs) -> bool {
        self.0 & other.0 != 0
    }

    pub fn set(&mut self, other: TokenAttrs, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }

    pub fn union(self, other: TokenAttrs) -> TokenAttrs {
        TokenAttrs(self.0 | other.0)
    }
}

/// The vocabulary of one model.
#[derive(Debug)]
pub(crate) struct Vocab {
    /// All token texts, concatenated.
    text: Vec<u8>,
    /// `ends[i]`: end of token `i` in `text` (its start is `ends[i - 1]`, or 0).
    ends: Vec<u32>,
    /// Open-addressing hash table of `id + 1` (0 = empty slot), linear probing.
    slots: Vec<u32>,
    /// `log2(slots.len())`.
    slot_bits: u32,
    scores: Vec<f32>,
    attrs: Vec<TokenAttrs>,
}

impl Vocab {
    /// Build from the token texts (in id order), scores and attributes (same length, checked
    /// by the caller). Rejects empty, non-UTF-8 and duplicate texts.
    pub fn build<'a>(
        texts: impl Iterator<Item = &'a [u8]>,
        count: usize,
        scores: Vec<f32>,
        attrs: Vec<TokenAttrs>,
    ) -> Result<Vocab, TokenizerError> {
        debug_assert!(scores.len() == count && attrs.len() == count);
        let slot_count = (count * 2).next_power_of_two().max(16);
        let mut vocab = Vocab {
            text: Vec::new(),
            ends: Vec::with_capacity(count),
            slots: vec![0; slot_count],
            slot_bits: slot_count.trailing_zeros(),
            scores,
            attrs,
        };
        for (i, piece) in texts.enumerate().take(count) {
            let id = i as u32;
            if piece.is_empty() || std::str::from_utf8(piece).is_err() {
                return Err(TokenizerErrorKind::InvalidTokenText { id }.into());
            }
            vocab.text.extend_from_slice(piece);
            let end = u32::try_from(vocab.text.len()).map_err(|_| TokenizerErrorKind::TooMany {
                what: "the vocabulary's text (bytes)",
                count: vocab.text.len(),
                limit: u32::MAX as usize,
            })?;
            vocab.ends.push(end);
            vocab.insert(id)?;
        }
        if vocab.ends.len() != count {
            return Err(TokenizerErrorKind::LengthMismatch {
                key: "tokenizer.ggml.tokens",
                len: vocab.ends.len(),
                vocab_len: count,
            }
            .into());
        }
        Ok(vocab)
    }

    fn insert(&mut self, id: u32) -> Result<(), TokenizerError> {
        let key = self.bytes(TokenId(id));
        let mask = self.slots.len() - 1;
        let mut slot = self.home_slot(key);
        loop {
            match self.slots[slot] {
                0 => {
                    self.slots[slot] = id + 1;
                    return Ok(());
                }
                other => {
                    let existing = other - 1;
                    if self.bytes(TokenId(existing)) == key {
                        return Err(TokenizerErrorKind::DuplicateToken {
                            text: String::from_utf8_lossy(key).into_owned(),
                            first: existing,
                            second: id,
                        }
                        .into());
                    }
                }
            }
            slot = (slot + 1) & mask;
        }
    }

    fn home_slot(&self, key: &[u8]) -> usize {
        (hash_bytes(key) >> (64 - self.slot_bits)) as usize
    }

    /// The id of the token whose text is exactly `key`.
    pub fn lookup(&self, key: &[u8]) -> Option<TokenId> {
        let mask = self.slots.len() - 1;
        let mut slot = self.home_slot(key);
        loop {
            match self.slots[slot] {
                0 => return None,
                other => {
                    let id = TokenId(other - 1);
                    if self.bytes(id) == key {
                        return Some(id);
                    }
                }
            }
            slot = (slot + 1) & mask;
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn contains(&self, id: TokenId) -> bool {
        id.index() < self.len()
    }

    /// The text of `id` as bytes. `id` must be in range.
    pub fn bytes(&self, id: TokenId) -> &[u8] {
        let i = id.index();
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.text[start..self.ends[i] as usize]
    }

    /// The text of `id` (validated UTF-8 at load). `id` must be in range.
    pub fn text(&self, id: TokenId) -> &str {
        // Every token's bytes were checked to be UTF-8 when the vocabulary was built, and
        // they sit at their own boundaries in the arena; the fallback never happens.
        std::str::from_utf8(self.bytes(id)).unwrap_or("")
    }

    pub fn score(&self, id: TokenId) -> f32 {
        self.scores[id.index()]
    }

    pub fn attrs(&self, id: TokenId) -> TokenAttrs {
        self.attrs[id.index()]
    }

    pub fn attrs_mut(&mut self, id: TokenId) -> &mut TokenAttrs {
        &mut self.attrs[id.index()]
    }

    /// All ids, in order.
    pub fn ids(&self) -> impl Iterator<Item = TokenId> + use<> {
        (0..self.len() as u32).map(TokenId)
    }
}

/// A fast non-cryptographic hash (FxHash-style word mixing with a SplitMix64 finish, so the
/// high bits used for the slot index depend on every input byte). Vocabularies come from
/// the model file, not from an adversary choosing collisions at run time.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(word)).wrapping_mul(K);
    }
    mix64(h)
}

/// SplitMix64's finaliser.
pub(crate) fn mix64(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(words: &[&str]) -> Result<Vocab, TokenizerError> {
        let n = words.len();
        Vocab::build(
            words.iter().map(|w| w.as_bytes()),
            n,
            vec![0.0; n],
            vec![TokenAttrs::NORMAL; n],
        )
    }

    #[test]
    fn lookup_finds_every_token_and_nothing_else() {
        let words: Vec<String> = (0..1000).map(|i| format!("w{i}")).collect();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let v = vocab(&refs).unwrap();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(v.lookup(w.as_bytes()), Some(TokenId(i as u32)));
            assert_eq!(v.text(TokenId(i as u32)), w);
        }
        assert_eq!(v.lookup(b"w1000"), None);
        assert_eq!(v.lookup(b""), None);
    }

    #[test]
    fn duplicates_and_empty_texts_are_errors() {
        assert!(matches!(
            vocab(&["a", "b", "a"]).unwrap_err().kind(),
            TokenizerErrorKind::DuplicateToken {
                first: 0,
                second: 2,
                ..
            }
        ));
        assert!(matches!(
            vocab(&["a", ""]).unwrap_err().kind(),
            TokenizerErrorKind::InvalidTokenText { id: 1 }
        ));
    }
}
