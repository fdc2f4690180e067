//! Splitting text at special tokens before the model's tokenizer sees it, as llama.cpp's
//! `tokenizer_st_partition` does.
//!
//! Special tokens are the control (type 3), user-defined (type 4) and unknown (type 2)
//! tokens. They are searched for longest first, each one splitting every text fragment left
//! by the longer ones. User-defined tokens are always split out (Hugging Face's "added
//! tokens" behave so); control and unknown tokens only when the caller asks to parse
//! special tokens, since text from a user must not be able to forge `<|im_end|>`. A token
//! marked LSTRIP/RSTRIP swallows the ASCII whitespace on that side.
//!
//! Cost: O(special tokens × text length) substring searches (Two-Way, linear each); for the
//! 290 user-defined tokens of Qwen2 and a 4 KiB prompt that is about a megabyte scanned.

use std::ops::Range;

use crate::TokenId;
use crate::vocab::{TokenAttrs, Vocab};

/// A piece of the input: text still to be tokenized, or a special token found in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(TokenId),
}

/// C's `isspace` in the "C" locale, which llama.cpp uses for LSTRIP/RSTRIP.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Split `text` at the special tokens in `specials` (sorted longest first).
pub(crate) fn partition(
    vocab: &Vocab,
    specials: &[TokenId],
    text: &str,
    parse_special: bool,
) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text(0..text.len()));
    let mut next = Vec::new();
    for &special in specials {
        let attrs = vocab.attrs(special);
        if !parse_special && attrs.contains(TokenAttrs::CONTROL.union(TokenAttrs::UNKNOWN)) {
            continue;
        }
        let needle = vocab.text(special);
        let occurs = fragments.iter().any(|f| match f {
            Fragment::Text(r) => text[r.clone()].contains(needle),
            Fragment::Token(_) => false,
        });
        if !occurs {
            continue;
        }
        next.clear();
        for fragment in fragments.drain(..) {
            match fragment {
                Fragment::Text(r) => split_at(text, r, needle, special, attrs, &mut next),
                token => next.push(token),
            }
        }
        std::mem::swap(&mut fragments, &mut next);
    }
    fragments
}

fn split_at(
    text: &str,
    range: Range<usize>,
    needle: &str,
    special: TokenId,
    attrs: TokenAttrs,
    out: &mut Vec<Fragment>,
) {
    let bytes = text.as_bytes();
    let (mut start, end) = (range.start, range.end);
    while let Some(pos) = text[start..end].find(needle) {
        let found = start + pos;
        let mut left_end = found;
        if attrs.contains(TokenAttrs::LSTRIP) {
            while left_end > start && is_c_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > start {
            out.push(Fragment::Text(start..left_end));
        }
        out.push(Fragment::Token(special));
        start = found + needle.len();
        if attrs.contains(TokenAttrs::RSTRIP) {
            while start < end && is_c_space(bytes[start]) {
                start += 1;
            }
        }
    }
    if start < end {
        out.push(Fragment::Text(start..end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, TokenAttrs)]) -> Vocab {
        Vocab::build(
            tokens.iter().map(|(t, _)| t.as_bytes()),
            tokens.len(),
            vec![0.0; tokens.len()],
            tokens.iter().map(|&(_, a)| a).collect(),
        )
        .unwrap()
    }

    #[test]
    fn longest_first_user_defined_always_control_only_when_asked() {
        let control = TokenAttrs::CONTROL;
        let user = TokenAttrs::USER_DEFINED;
        let v = vocab(&[
            ("<a>", control),
            ("<a><a>", user),
            ("[x]", user),
            ("z", TokenAttrs::NORMAL),
        ]);
        let specials = [TokenId(1), TokenId(0), TokenId(2)];
        let text = "q<a><a><a>r[x]";
        assert_eq!(
            partition(&v, &specials, text, true),
            [
                Fragment::Text(0..1),
                Fragment::Token(TokenId(1)),
                Fragment::Token(TokenId(0)),
                Fragment::Text(10..11),
                Fragment::Token(TokenId(2)),
            ]
        );
        assert_eq!(
            partition(&v, &specials, text, false),
            [
                Fragment::Text(0..1),
                Fragment::Token(TokenId(1)),
                Fragment::Text(7..11),
                Fragment::Token(TokenId(2)),
            ]
        );
        assert!(partition(&v, &specials, "", true).is_empty());
    }

    #[test]
    fn strip_flags_swallow_adjacent_whitespace() {
        let attrs = TokenAttrs::USER_DEFINED
            .union(TokenAttrs::LSTRIP)
            .union(TokenAttrs::RSTRIP);
        let v = vocab(&[("<m>", attrs)]);
        assert_eq!(
            partition(&v, &[TokenId(0)], "a \t<m>\n b", false),
            [
                Fragment::Text(0..1),
                Fragment::Token(TokenId(0)),
                Fragment::Text(8..9)
            ]
        );
        assert_eq!(
            partition(&v, &[TokenId(0)], "  <m>  ", false),
            [Fragment::Token(TokenId(0))]
        );
    }
}
