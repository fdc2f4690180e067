//! Generation constrained to JSON (OpenAI's `response_format: {"type": "json_object"}`): at
//! each step only tokens whose bytes continue the text as [`JsonSyntax`] accepts are drawn,
//! and the choice ends as soon as the top-level object closes.
//!
//! How a token is drawn: the sampler draws from the model's logits as it would unconstrained;
//! if [`JsonSyntax`] accepts the token's bytes, that is the draw (the common case once a
//! model writes JSON, and free). Otherwise every token that cannot continue the text gets
//! logit −∞ and the sampler draws again from what is left, with the same settings (the
//! candidates' order and filters, penalties and seed stream as unconstrained; only the
//! redraw consumes one more random number). This is llama.cpp's grammar sampler's order
//! ("sample, then check, then apply the grammar to all candidates and resample"), which keeps
//! the constraint's cost off the draws that need none.
//!
//! The mask: tokens are bucketed by their first byte ([`VocabBytes`]); a bucket whose first
//! byte cannot come next is skipped whole, so after a `:` or `,` only a few thousand tokens
//! are checked; inside a string most of the vocabulary is. End-of-generation tokens and tokens
//! that decode to no bytes (control tokens) are never drawn: the constraint ends the choice
//! itself when the object is complete.
//!
//! Cost: building [`VocabBytes`] once per model (a pass over the vocabulary: ~1 MB for
//! Qwen2.5's 151,936 tokens); per draw one check of the drawn token's bytes; per redraw a
//! mask over the allowed buckets (each check O(bytes of the token)) and a copy of the logits.

use std::sync::Arc;

use airs_tokenizer::{TokenId, Tokenizer};

use crate::json_syntax::JsonSyntax;

/// Every token's bytes as it decodes in generated text, and the tokens by first byte.
#[derive(Debug)]
pub struct VocabBytes {
    bytes: Vec<u8>,
    /// Token `id`'s bytes are `bytes[starts[id]..starts[id + 1]]`.
    starts: Vec<u32>,
    /// The tokens that decode to bytes and do not end generation, by their first byte.
    by_first_byte: Vec<Vec<u32>>,
}

impl VocabBytes {
    /// The table for `tokenizer`'s vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> VocabBytes {
        let vocab = tokenizer.vocab_len();
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(vocab + 1);
        let mut by_first_byte = vec![Vec::new(); 256];
        for id in 0..vocab as u32 {
            let start = bytes.len();
            starts.push(start as u32);
            if tokenizer.is_end_of_generation(TokenId(id)) {
                continue;
            }
            tokenizer.append_token_bytes(TokenId(id), false, &mut bytes);
            if let Some(&first) = bytes.get(start) {
                by_first_byte[usize::from(first)].push(id);
            }
        }
        starts.push(bytes.len() as u32);
        VocabBytes {
            bytes,
            starts,
            by_first_byte,
        }
    }

    /// Token `id`'s bytes (empty for an end-of-generation, control or unknown id).
    pub fn token(&self, id: u32) -> &[u8] {
        let id = id as usize;
        if id + 1 >= self.starts.len() {
            return &[];
        }
        &self.bytes[self.starts[id] as usize..self.starts[id + 1] as usize]
    }
}

/// One choice's JSON constraint: the syntax so far and a buffer for masked logits.
#[derive(Debug)]
pub struct JsonConstraint {
    vocab: Arc<VocabBytes>,
    syntax: JsonSyntax,
    masked: Vec<f32>,
}

impl JsonConstraint {
    pub fn new(vocab: Arc<VocabBytes>) -> JsonConstraint {
        JsonConstraint {
            vocab,
            syntax: JsonSyntax::new(),
            masked: Vec::new(),
        }
    }

    /// Whether `token` may come next.
    pub fn allows(&self, token: u32) -> bool {
        let bytes = self.vocab.token(token);
        !bytes.is_empty() && self.syntax.after(bytes).is_some()
    }

    /// `logits` with every token that may not come next at −∞, or `None` if no token may.
    pub fn mask(&mut self, logits: &[f32]) -> Option<&[f32]> {
        self.masked.clear();
        self.masked.resize(logits.len(), f32::NEG_INFINITY);
        let mut allowed = 0usize;
        for (first, bucket) in self.vocab.by_first_byte.iter().enumerate() {
            let Some(after_first) = self.syntax.after(&[first as u8]) else {
                continue;
            };
            for &id in bucket {
                let Some(&logit) = logits.get(id as usize) else {
                    continue;
                };
                if after_first.after(&self.vocab.token(id)[1..]).is_some() {
                    self.masked[id as usize] = logit;
                    allowed += 1;
                }
            }
        }
        (allowed > 0).then_some(&self.masked[..])
    }

    /// Take `token` (one [`JsonConstraint::allows`]); true when the object is now complete.
    pub fn accept(&mut self, token: u32) -> bool {
        if let Some(next) = self.syntax.after(self.vocab.token(token)) {
            self.syntax = next;
        }
        self.syntax.is_complete()
    }
}
