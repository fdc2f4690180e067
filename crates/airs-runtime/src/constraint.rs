//! Generation constrained to JSON (OpenAI's `response_format`: `{"type": "json_object"}`, or
//! `{"type": "json_schema", ...}`): at each step only tokens whose bytes continue the text as
//! [`JsonSyntax`] (any object) or [`SchemaSyntax`] (a value of the schema) accepts are drawn,
//! and the choice ends as soon as the top-level object closes.
//!
//! How a token is drawn: the sampler draws from the model's logits as it would unconstrained;
//! if the checker accepts the token's bytes, that is the draw (the common case once a
//! model writes JSON, and free). Otherwise every token that cannot continue the text gets
//! logit −∞ and the sampler draws again from what is left, with the same settings (the
//! candidates' order and filters, penalties and seed stream as unconstrained; only the
//! redraw consumes one more random number). This is llama.cpp's grammar sampler's order
//! ("sample, then check, then apply the grammar to all candidates and resample"), which keeps
//! the constraint's cost off the draws that need none.
//!
//! The mask: tokens are bucketed by their first byte ([`VocabBytes`]); a bucket whose first
//! byte cannot come next is skipped whole, so after a `:` or `,` only a few thousand tokens
//! are checked. Inside a string, the tokens of whole UTF-8 characters without `"`, `\` or
//! control characters (145,453 of Qwen2.5's 151,936) continue it whatever it holds, so they
//! are let through unchecked and only the others are checked. End-of-generation tokens and
//! tokens that decode to no bytes (control tokens) are never drawn: the constraint ends the
//! choice itself when the object is complete.
//!
//! Cost: building [`VocabBytes`] once per model (a pass over the vocabulary: ~3 MB and 6-11
//! ms for Qwen2.5's 151,936 tokens); per draw one check of the drawn token's bytes (10-110
//! ns); per redraw a mask over the allowed buckets (each check O(bytes of the token)) and a
//! copy of the logits: 0.2-0.3 ms inside a string, 0.4-0.9 ms elsewhere on Qwen2.5, single
//! thread (`cargo bench -p airs-runtime --bench constraint`). Redraws are rare once a model
//! writes JSON: 3-4 in 128 tokens of Qwen2.5 at temperature 1 continuing "Once upon a time".

use std::sync::Arc;

use airs_tokenizer::{TokenId, Tokenizer};

use crate::json_schema::Schema;
use crate::json_syntax::JsonSyntax;
use crate::schema_syntax::SchemaSyntax;

/// Every token's bytes as it decodes in generated text, and the tokens by first byte.
#[derive(Debug)]
pub struct VocabBytes {
    bytes: Vec<u8>,
    /// Token `id`'s bytes are `bytes[starts[id]..starts[id + 1]]`.
    starts: Vec<u32>,
    /// The tokens that decode to bytes and do not end generation, by their first byte.
    by_first_byte: Vec<Vec<u32>>,
    /// Of those, the tokens of whole UTF-8 characters without `"`, `\` or control characters
    /// (they continue any string without changing what may follow), and the others by their
    /// first byte.
    plain: Vec<u32>,
    other_by_first_byte: Vec<Vec<u32>>,
}

impl VocabBytes {
    /// The table for `tokenizer`'s vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> VocabBytes {
        let vocab = tokenizer.vocab_len();
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(vocab + 1);
        let mut by_first_byte = vec![Vec::new(); 256];
        let mut other_by_first_byte = vec![Vec::new(); 256];
        let mut plain = Vec::new();
        for id in 0..vocab as u32 {
            let start = bytes.len();
            starts.push(start as u32);
            if tokenizer.is_end_of_generation(TokenId(id)) {
                continue;
            }
            tokenizer.append_token_bytes(TokenId(id), false, &mut bytes);
            let token = &bytes[start..];
            if let Some(&first) = token.first() {
                by_first_byte[usize::from(first)].push(id);
                let in_any_string = std::str::from_utf8(token)
                    .is_ok_and(|t| t.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\'));
                if in_any_string {
                    plain.push(id);
                } else {
                    other_by_first_byte[usize::from(first)].push(id);
                }
            }
        }
        starts.push(bytes.len() as u32);
        VocabBytes {
            bytes,
            starts,
            by_first_byte,
            plain,
            other_by_first_byte,
        }
    }

    /// How many tokens continue any string unchanged (whole UTF-8 characters, no `"`, `\` or
    /// control character).
    pub fn string_tokens(&self) -> usize {
        self.plain.len()
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

/// The text so far, as one of the two checkers reads it. Unboxed on purpose: a candidate is
/// checked on a copy, which a box would turn into an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Copy, Clone, Debug)]
enum Syntax {
    Object(JsonSyntax),
    Schema(SchemaSyntax),
}

/// One choice's JSON constraint: the syntax so far and a buffer for masked logits.
#[derive(Debug)]
pub struct JsonConstraint {
    vocab: Arc<VocabBytes>,
    schema: Option<Arc<Schema>>,
    syntax: Syntax,
    masked: Vec<f32>,
}

impl JsonConstraint {
    /// Any JSON object (`schema` `None`), or a value of `schema`.
    pub fn new(vocab: Arc<VocabBytes>, schema: Option<Arc<Schema>>) -> JsonConstraint {
        let syntax = match &schema {
            None => Syntax::Object(JsonSyntax::new()),
            Some(s) => Syntax::Schema(SchemaSyntax::new(s)),
        };
        JsonConstraint {
            vocab,
            schema,
            syntax,
            masked: Vec::new(),
        }
    }

    fn after(&self, syntax: Syntax, bytes: &[u8]) -> Option<Syntax> {
        match (syntax, &self.schema) {
            (Syntax::Object(s), _) => s.after(bytes).map(Syntax::Object),
            (Syntax::Schema(s), Some(schema)) => s.after(schema, bytes).map(Syntax::Schema),
            (Syntax::Schema(_), None) => unreachable!("a schema syntax has its schema"),
        }
    }

    /// Whether `token` may come next.
    pub fn allows(&self, token: u32) -> bool {
        let bytes = self.vocab.token(token);
        !bytes.is_empty() && self.after(self.syntax, bytes).is_some()
    }

    /// `logits` with every token that may not come next at −∞, or `None` if no token may.
    pub fn mask(&mut self, logits: &[f32]) -> Option<&[f32]> {
        let mut masked = std::mem::take(&mut self.masked);
        masked.clear();
        masked.resize(logits.len(), f32::NEG_INFINITY);
        let mut allowed = 0usize;
        let in_string = match self.syntax {
            Syntax::Object(s) => s.in_plain_string(),
            Syntax::Schema(s) => s.in_plain_string(),
        };
        let buckets = if in_string {
            for &id in &self.vocab.plain {
                if let Some(&logit) = logits.get(id as usize) {
                    masked[id as usize] = logit;
                    allowed += 1;
                }
            }
            &self.vocab.other_by_first_byte
        } else {
            &self.vocab.by_first_byte
        };
        for (first, bucket) in buckets.iter().enumerate() {
            let Some(after_first) = self.after(self.syntax, &[first as u8]) else {
                continue;
            };
            for &id in bucket {
                let Some(&logit) = logits.get(id as usize) else {
                    continue;
                };
                if self
                    .after(after_first, &self.vocab.token(id)[1..])
                    .is_some()
                {
                    masked[id as usize] = logit;
                    allowed += 1;
                }
            }
        }
        self.masked = masked;
        (allowed > 0).then_some(&self.masked[..])
    }

    /// Take `token` (one [`JsonConstraint::allows`]); true when the value is now complete.
    pub fn accept(&mut self, token: u32) -> bool {
        if let Some(next) = self.after(self.syntax, self.vocab.token(token)) {
            self.syntax = next;
        }
        match self.syntax {
            Syntax::Object(s) => s.is_complete(),
            Syntax::Schema(s) => s.is_complete(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_schema::SchemaValue;

    fn tokenizer(file: &str) -> Tokenizer {
        let path = airs_testdata::repo_path(&format!("testdata/tokenizer/{file}"));
        let bytes = std::fs::read(path).unwrap();
        Tokenizer::from_gguf(&airs_gguf::Gguf::parse(&bytes).unwrap()).unwrap()
    }

    /// The mask's shortcuts (buckets by first byte, string tokens let through) allow exactly
    /// the tokens that checking every token's bytes allows, at every kind of position, on real
    /// vocabularies (byte-level BPE and SentencePiece).
    #[test]
    fn the_mask_allows_exactly_the_tokens_a_full_check_allows() {
        let schema: SchemaValue = serde_json::from_str(
            r#"{"type": "object", "properties": {"name": {"type": "string"},
                "n": {"type": "integer"}, "k": {"enum": ["a b", "\u00e9t\u00e9"]}}}"#,
        )
        .unwrap();
        let schema = Arc::new(Schema::compile(&schema).unwrap());
        for file in ["ggml-vocab-qwen2.gguf", "ggml-vocab-llama-spm.gguf"] {
            let tok = tokenizer(file);
            let vocab = Arc::new(VocabBytes::new(&tok));
            assert!(vocab.string_tokens() > tok.vocab_len() / 2, "{file}");
            let logits: Vec<f32> = (0..tok.vocab_len()).map(|i| (i % 13) as f32).collect();
            for (schema, texts) in [
                (
                    None,
                    &[
                        "",
                        "{",
                        "{\"a",
                        "{\"a\\",
                        "{\"a\": \"x\u{e9}",
                        "{\"a\": 1",
                        "{\"a\": [tr",
                    ][..],
                ),
                (
                    Some(&schema),
                    &[
                        "",
                        "{",
                        "{\"na",
                        "{\"name\": \"x",
                        "{\"n\": 12",
                        "{\"k\": \"\u{e9}",
                    ][..],
                ),
            ] {
                for text in texts {
                    let mut c = JsonConstraint::new(Arc::clone(&vocab), schema.cloned());
                    c.syntax = c.after(c.syntax, text.as_bytes()).expect("a viable prefix");
                    let expected: Vec<bool> =
                        (0..tok.vocab_len() as u32).map(|id| c.allows(id)).collect();
                    let masked = c.mask(&logits).expect("some token continues").to_vec();
                    let got: Vec<bool> = masked.iter().map(|l| l.is_finite()).collect();
                    assert_eq!(got, expected, "{file} {text:?}");
                    assert!(expected.iter().any(|&a| a));
                }
            }
        }
    }
}
