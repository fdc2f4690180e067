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
//! The mask: tokens are grouped by their first two bytes ([`VocabBytes`]); a group whose
//! opening cannot come next is skipped whole, so after a `:` or `,` only a few hundred tokens
//! are checked. Inside a string, the tokens of whole UTF-8 characters without `"`, `\` or
//! control characters (145,453 of Qwen2.5's 151,936) continue it whatever it holds, so they
//! are let through unchecked and only the others are checked. End-of-generation tokens and
//! tokens that decode to no bytes (control tokens) are never drawn: the constraint ends the
//! choice itself when the object is complete.
//!
//! Cost: building [`VocabBytes`] once per model (a pass over the vocabulary: 3.3 MB and
//! ~12.5 ms for Qwen2.5's 151,936 tokens); per draw one check of the drawn token's bytes
//! (10-110 ns); per redraw a mask and a copy of the logits into a buffer of the choice's own
//! (a vocabulary of f32, kept from its first redraw): 20-60 µs after structure (`{`, `:`, a
//! number), 0.2-0.4 ms inside a string, on Qwen2.5, single thread (`cargo bench -p
//! airs-runtime --bench constraint`, which prints the table's bytes too). Redraws are rare
//! once a model writes JSON: 3-4 in 128 tokens of Qwen2.5 at temperature 1 continuing "Once
//! upon a time".

use std::sync::Arc;

use airs_tokenizer::{TokenId, Tokenizer};

use crate::json_schema::Schema;
use crate::json_syntax::JsonSyntax;
use crate::schema_syntax::SchemaSyntax;

/// Token ids grouped by their first two bytes, so that a mask skips every group whose opening
/// the text cannot take (after `{`, the tens of thousands of tokens that open with a space
/// and a letter, in one check).
#[derive(Debug)]
struct ByPrefix {
    ids: Vec<u32>,
    /// Group `258·b` holds the one-byte token `b`, group `258·b + 1 + c` the tokens that open
    /// with `b c`: `ids[starts[g]..starts[g + 1]]`.
    starts: Vec<u32>,
}

impl ByPrefix {
    const GROUPS: usize = 256 * 258;

    fn group_of(token: &[u8]) -> usize {
        258 * usize::from(token[0]) + token.get(1).map_or(0, |&c| 1 + usize::from(c))
    }

    /// Group `tokens` (id and non-empty bytes), by a counting sort.
    fn new<'a>(tokens: impl Iterator<Item = (u32, &'a [u8])> + Clone) -> ByPrefix {
        let mut starts = vec![0u32; ByPrefix::GROUPS + 1];
        for (_, t) in tokens.clone() {
            starts[ByPrefix::group_of(t) + 1] += 1;
        }
        for g in 0..ByPrefix::GROUPS {
            starts[g + 1] += starts[g];
        }
        let mut at = starts.clone();
        let mut ids = vec![0; starts[ByPrefix::GROUPS] as usize];
        for (id, t) in tokens {
            let g = ByPrefix::group_of(t);
            ids[at[g] as usize] = id;
            at[g] += 1;
        }
        ByPrefix { ids, starts }
    }

    fn group(&self, g: usize) -> &[u32] {
        &self.ids[self.starts[g] as usize..self.starts[g + 1] as usize]
    }
}

/// Every token's bytes as it decodes in generated text, and the tokens grouped for masks.
#[derive(Debug)]
pub struct VocabBytes {
    bytes: Vec<u8>,
    /// Token `id`'s bytes are `bytes[starts[id]..starts[id + 1]]`.
    starts: Vec<u32>,
    /// The tokens that decode to bytes and do not end generation.
    all: ByPrefix,
    /// Of those, the tokens of whole UTF-8 characters without `"`, `\` or control characters
    /// (they continue any string without changing what may follow), and the others.
    string: Vec<u32>,
    others: ByPrefix,
}

impl VocabBytes {
    /// The table for `tokenizer`'s vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> VocabBytes {
        let vocab = tokenizer.vocab_len();
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(vocab + 1);
        for id in 0..vocab as u32 {
            starts.push(bytes.len() as u32);
            if !tokenizer.is_end_of_generation(TokenId(id)) {
                tokenizer.append_token_bytes(TokenId(id), false, &mut bytes);
            }
        }
        starts.push(bytes.len() as u32);
        let token =
            |id: u32| &bytes[starts[id as usize] as usize..starts[id as usize + 1] as usize];
        let in_any_string = |t: &[u8]| {
            std::str::from_utf8(t)
                .is_ok_and(|t| t.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\'))
        };
        let string_safe: Vec<bool> = (0..vocab as u32)
            .map(|id| in_any_string(token(id)))
            .collect();
        let texts = (0..vocab as u32)
            .map(|id| (id, token(id)))
            .filter(|(_, t)| !t.is_empty());
        let all = ByPrefix::new(texts.clone());
        let others = ByPrefix::new(texts.clone().filter(|&(id, _)| !string_safe[id as usize]));
        let string = texts
            .filter(|&(id, _)| string_safe[id as usize])
            .map(|(id, _)| id)
            .collect();
        VocabBytes {
            bytes,
            starts,
            all,
            string,
            others,
        }
    }

    /// Bytes the table holds on the heap.
    pub fn heap_bytes(&self) -> usize {
        let ids = |p: &ByPrefix| 4 * (p.ids.len() + p.starts.len());
        self.bytes.len()
            + 4 * (self.starts.len() + self.string.len())
            + ids(&self.all)
            + ids(&self.others)
    }

    /// How many tokens continue any string unchanged (whole UTF-8 characters, no `"`, `\` or
    /// control character).
    pub fn string_tokens(&self) -> usize {
        self.string.len()
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
        let groups = if in_string {
            for &id in &self.vocab.string {
                if let Some(&logit) = logits.get(id as usize) {
                    masked[id as usize] = logit;
                    allowed += 1;
                }
            }
            &self.vocab.others
        } else {
            &self.vocab.all
        };
        let mut allow = |id: u32| {
            if let Some(&logit) = logits.get(id as usize) {
                masked[id as usize] = logit;
                allowed += 1;
            }
        };
        for first in 0..=255u8 {
            let Some(after_first) = self.after(self.syntax, &[first]) else {
                continue;
            };
            let base = 258 * usize::from(first);
            groups.group(base).iter().for_each(|&id| allow(id));
            if groups.starts[base + 1] == groups.starts[base + 257] {
                continue;
            }
            for second in 0..=255u8 {
                let group = groups.group(base + 1 + usize::from(second));
                if group.is_empty() {
                    continue;
                }
                let Some(after_second) = self.after(after_first, &[second]) else {
                    continue;
                };
                for &id in group {
                    if self
                        .after(after_second, &self.vocab.token(id)[2..])
                        .is_some()
                    {
                        allow(id);
                    }
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
