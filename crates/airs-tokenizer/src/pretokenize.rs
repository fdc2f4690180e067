//! Pre-tokenizers for byte-level BPE: regular expressions that cut text into words before
//! BPE runs on each word, chosen by `tokenizer.ggml.pre`.
//!
//! The patterns are the ones llama.cpp uses (src/llama-vocab.cpp, `llm_tokenizer_bpe`),
//! which come from each model's Hugging Face `tokenizer.json` with `(?i:...)` spelled out as
//! character classes. As in llama.cpp's `unicode_regex_split`, a pre-tokenizer is a list of
//! patterns applied in turn: each pattern splits every piece left by the previous one into
//! its matches *and* the unmatched gaps between them (nothing is dropped). llama.cpp runs
//! some patterns through hand-written scanners and others through `std::regex` on a
//! "collapsed" text where each non-ASCII code point is replaced by a byte naming its Unicode
//! category; both mean the same as running the pattern with Unicode classes, which is what
//! fancy-regex does here (it is needed for the `\s+(?!\S)` look-ahead).
//!
//! Cost: one regex scan per pattern over the text, linear in practice (these patterns have
//! no nested quantifiers, so backtracking is bounded by the length of a whitespace run).

use std::ops::Range;

use fancy_regex::Regex;

use crate::error::{TokenizerError, TokenizerErrorKind};

/// GPT-2's pattern (also the second pass of `default`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's pattern (`(?i:'s|...)` spelled out; digits in runs of up to three).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's `default` list, used for BPE files without `tokenizer.ggml.pre`.
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// Which pre-tokenizer a byte-level BPE vocabulary uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback for files that do not say (`default`, or no key at all).
    Default,
    /// GPT-2 and its descendants (`gpt-2`, `phi-2`, `mpt`, `olmo`, ...).
    Gpt2,
    /// Llama 3 (`llama-bpe`, `llama3`, `llama-v3`, `falcon3`, ...). Also whole words that are
    /// already tokens skip BPE (`ignore_merges`), and BOS is added by default.
    Llama3,
    /// Qwen2 / Qwen2.5 (`qwen2`, `deepseek-r1-qwen`, `megrez`, `stablelm2`, ...).
    Qwen2,
}

impl PreTokenizerKind {
    /// The `tokenizer.ggml.pre` names accepted, for error messages.
    pub const SUPPORTED_NAMES: &'static str = "default, gpt-2 (and phi-2, mpt, olmo, ...), \
         llama-bpe/llama3 (and falcon3, ...), qwen2 (and deepseek-r1-qwen, stablelm2, ...)";

    /// The kind a `tokenizer.ggml.pre` value names, following llama.cpp's table; `None` for
    /// names airs does not implement.
    pub fn from_name(name: &str) -> Option<PreTokenizerKind> {
        Some(match name {
            "default" => PreTokenizerKind::Default,
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "mpt" | "olmo"
            | "jais" | "trillion" | "granite-docling" => PreTokenizerKind::Gpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => PreTokenizerKind::Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => PreTokenizerKind::Qwen2,
            _ => return None,
        })
    }

    /// A canonical name for this kind.
    pub fn name(self) -> &'static str {
        match self {
            PreTokenizerKind::Default => "default",
            PreTokenizerKind::Gpt2 => "gpt-2",
            PreTokenizerKind::Llama3 => "llama-bpe",
            PreTokenizerKind::Qwen2 => "qwen2",
        }
    }

    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Default => DEFAULT,
            PreTokenizerKind::Gpt2 => &[GPT2],
            PreTokenizerKind::Llama3 => &[LLAMA3],
            PreTokenizerKind::Qwen2 => &[QWEN2],
        }
    }

    /// Whether a word that is itself a token is emitted whole, without running merges
    /// (llama.cpp's `ignore_merges`, Hugging Face's `ignore_merges: true`).
    pub(crate) fn ignore_merges(self) -> bool {
        self == PreTokenizerKind::Llama3
    }

    /// Whether models with this pre-tokenizer add BOS when the file does not say.
    pub(crate) fn adds_bos_by_default(self) -> bool {
        self == PreTokenizerKind::Llama3
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    kind: PreTokenizerKind,
    regexes: Vec<Regex>,
}

impl PreTokenizer {
    pub fn new(kind: PreTokenizerKind) -> Result<PreTokenizer, TokenizerError> {
        let regexes = kind
            .patterns()
            .iter()
            .map(|p| Regex::new(p).map_err(|e| TokenizerErrorKind::BadPattern(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { kind, regexes })
    }

    pub fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Split `text` into words, as byte ranges that cover it in order. `scratch` is reused
    /// between calls.
    pub fn split(
        &self,
        text: &str,
        words: &mut Vec<Range<usize>>,
        scratch: &mut Vec<Range<usize>>,
    ) {
        words.clear();
        if text.is_empty() {
            return;
        }
        words.push(0..text.len());
        for regex in &self.regexes {
            scratch.clear();
            for piece in words.iter() {
                split_piece(regex, text, piece.clone(), scratch);
            }
            std::mem::swap(words, scratch);
        }
    }
}

/// Append the matches of `regex` in `text[piece]` and the gaps between them to `out`.
fn split_piece(regex: &Regex, text: &str, piece: Range<usize>, out: &mut Vec<Range<usize>>) {
    let base = piece.start;
    let sub = &text[piece];
    let mut done = 0;
    for found in regex.find_iter(sub) {
        // An error means the backtracking limit was hit, which these patterns cannot do on
        // any input; should it happen, the rest of the piece stays one word.
        let Ok(m) = found else { break };
        if m.start() > done {
            out.push(base + done..base + m.start());
        }
        if m.end() > m.start() {
            out.push(base + m.start()..base + m.end());
        }
        done = m.end();
    }
    if done < sub.len() {
        out.push(base + done..base + sub.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(kind).unwrap();
        let (mut w, mut s) = (Vec::new(), Vec::new());
        pre.split(text, &mut w, &mut s);
        w.into_iter().map(|r| text[r].to_string()).collect()
    }

    #[test]
    fn gpt2_splits_like_the_reference() {
        assert_eq!(
            words(PreTokenizerKind::Gpt2, "Hello world's   end\n\tx"),
            ["Hello", " world", "'s", "  ", " end", "\n", "\t", "x"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three_and_qwen2_by_one() {
        assert_eq!(words(PreTokenizerKind::Llama3, "12345"), ["123", "45"]);
        assert_eq!(words(PreTokenizerKind::Qwen2, "123"), ["1", "2", "3"]);
        assert_eq!(
            words(PreTokenizerKind::Llama3, "a  \n\n b"),
            ["a", "  \n\n", " b"]
        );
    }

    #[test]
    fn every_name_round_trips() {
        for kind in [
            PreTokenizerKind::Default,
            PreTokenizerKind::Gpt2,
            PreTokenizerKind::Llama3,
            PreTokenizerKind::Qwen2,
        ] {
            assert_eq!(PreTokenizerKind::from_name(kind.name()), Some(kind));
            PreTokenizer::new(kind).unwrap();
        }
        assert_eq!(PreTokenizerKind::from_name("tekken"), None);
    }
}
