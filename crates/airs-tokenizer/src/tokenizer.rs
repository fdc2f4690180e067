//! The [`Tokenizer`]: encoding text to token ids and decoding ids to bytes, over either a
//! SentencePiece BPE or a byte-level BPE vocabulary. Building one from GGUF metadata is in
//! `load.rs`.

use crate::bpe::{self, BpeMerges, BpeScratch};
use crate::bytelevel;
use crate::pretokenize::{PreTokenizer, PreTokenizerKind};
use crate::special::{self, Fragment};
use crate::spm::{self, SpmScratch};
use crate::vocab::{TokenAttrs, Vocab};
use crate::{StreamDecoder, TokenId};

/// Which tokenization algorithm a vocabulary uses (`tokenizer.ggml.model`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ModelKind {
    /// `llama`: SentencePiece BPE with merges implied by the token scores, `▁` for spaces and
    /// `<0xXX>` byte fallback.
    SentencePiece,
    /// `gpt2`: byte-level BPE with an explicit merge list and a regex pre-tokenizer.
    ByteLevelBpe,
}

/// How to encode a piece of text.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Prepend the BOS token (nothing is prepended if the vocabulary has none). Pass
    /// [`Tokenizer::add_bos`] to do what the model expects at the start of a sequence.
    pub add_bos: bool,
    /// Recognise control tokens written as text (`<|im_start|>`, `<s>`, ...). Leave off for
    /// untrusted text. User-defined tokens are recognised either way.
    pub parse_special: bool,
}

impl EncodeOptions {
    /// The options for a whole prompt built by the program (e.g. a rendered chat template):
    /// BOS as the model wants it, special tokens parsed. This is how the reference token ids
    /// in testdata/reference were produced.
    pub fn prompt(tokenizer: &Tokenizer) -> EncodeOptions {
        EncodeOptions {
            add_bos: tokenizer.add_bos(),
            parse_special: true,
        }
    }
}

/// The model-specific part of a tokenizer.
#[derive(Debug)]
pub(crate) enum Model {
    SentencePiece {
        /// The token for each byte in the byte fallback (`<0xXX>`, or the one-byte token).
        byte_tokens: Box<[Option<TokenId>; 256]>,
    },
    ByteLevelBpe {
        merges: BpeMerges,
        pre: PreTokenizer,
    },
}

/// A tokenizer built from a model's vocabulary. Immutable and `Sync`: share one between
/// threads; encoding allocates its own scratch space.
pub struct Tokenizer {
    pub(crate) vocab: Vocab,
    pub(crate) model: Model,
    pub(crate) bos: Option<TokenId>,
    pub(crate) eos: Option<TokenId>,
    pub(crate) eot: Option<TokenId>,
    pub(crate) unk: Option<TokenId>,
    /// Tokens that end generation, sorted.
    pub(crate) end_of_generation: Vec<TokenId>,
    pub(crate) add_bos: bool,
    pub(crate) add_space_prefix: bool,
    /// Whether [`Tokenizer::decode`] cleans up tokenization spaces (llama.cpp's
    /// `clean_spaces`: BPE vocabularies but those whose pre-tokenizer opts out, e.g. qwen2).
    pub(crate) clean_spaces: bool,
    /// Control, user-defined and unknown tokens, longest text first.
    pub(crate) specials: Vec<TokenId>,
}

impl std::fmt::Debug for Tokenizer {
    /// A summary (the vocabulary itself would be megabytes of output).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("model", &self.model_kind())
            .field("pre", &self.pre_kind())
            .field("vocab_len", &self.vocab_len())
            .field("merges", &self.merge_count())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eot", &self.eot)
            .field("add_bos", &self.add_bos)
            .field("add_space_prefix", &self.add_space_prefix)
            .field("clean_spaces", &self.clean_spaces)
            .field("end_of_generation", &self.end_of_generation)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Encode `text` to token ids.
    ///
    /// Special tokens are split out first (see [`EncodeOptions::parse_special`]); each text
    /// fragment between them is then tokenized on its own. For SentencePiece vocabularies a
    /// space is prefixed to the first fragment and to every fragment that follows a special
    /// token (when `add_space_prefix` is on, the default), exactly as llama.cpp does. EOS is
    /// never appended.
    pub fn encode(&self, text: &str, options: EncodeOptions) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if options.add_bos {
            out.extend(self.bos);
        }
        let fragments =
            special::partition(&self.vocab, &self.specials, text, options.parse_special);
        match &self.model {
            Model::SentencePiece { byte_tokens } => {
                let mut scratch = SpmScratch::default();
                let mut escaped = String::new();
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                        Fragment::Text(range) => {
                            escaped.clear();
                            if self.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            for c in text[range].chars() {
                                escaped.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::encode(
                                &self.vocab,
                                byte_tokens,
                                self.unk,
                                &escaped,
                                &mut out,
                                &mut scratch,
                            );
                            after_special = false;
                        }
                    }
                }
            }
            Model::ByteLevelBpe { merges, pre } => {
                let mut scratch = BpeScratch::default();
                let (mut words, mut split_scratch) = (Vec::new(), Vec::new());
                let ignore_merges = pre.kind().ignore_merges();
                for fragment in fragments {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(range) => {
                            let fragment_text = &text[range];
                            pre.split(fragment_text, &mut words, &mut split_scratch);
                            for word in &words {
                                bpe::encode_word(
                                    &self.vocab,
                                    merges,
                                    ignore_merges,
                                    &fragment_text.as_bytes()[word.clone()],
                                    &mut out,
                                    &mut scratch,
                                );
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// Decode token ids to text, as one would print them: control tokens (BOS, EOS,
    /// `<|im_end|>`, ...) and unknown tokens produce nothing, user-defined tokens their text,
    /// byte tokens their byte; bytes that do not form valid UTF-8 become U+FFFD. For
    /// SentencePiece the space that [`Tokenizer::encode`] prefixes is removed from the first
    /// piece of text, so `decode(encode(x)) == x` for plain text. Ids outside the vocabulary
    /// are skipped. The same as feeding the ids to [`StreamDecoder::at_sequence_start`].
    ///
    /// Where the vocabulary asks for it ([`Tokenizer::cleans_spaces`]), the text then gets
    /// llama.cpp's "clean up tokenization spaces" passes, as `llama_detokenize` makes them:
    /// the space before `?`, `!`, `.` and `,` is removed, a lone `'` between spaces loses both,
    /// and the space before `'s`, `'m`, `'re` and `'ve` goes. Streaming ([`StreamDecoder`])
    /// emits the pieces as they are, as llama.cpp's `token_to_piece` does, so only whole-text
    /// decoding differs from streaming, and only for such vocabularies.
    pub fn decode(&self, ids: &[TokenId]) -> String {
        let mut decoder = StreamDecoder::at_sequence_start();
        let mut text = String::new();
        for &id in ids {
            text.push_str(decoder.push(self, id));
        }
        text.push_str(decoder.finish());
        if self.clean_spaces {
            clean_up_tokenization_spaces(&text)
        } else {
            text
        }
    }

    /// Whether [`Tokenizer::decode`] cleans up tokenization spaces: BPE vocabularies except
    /// those whose pre-tokenizer llama.cpp exempts (qwen2, deepseek, command-r, smollm, ...);
    /// never SentencePiece.
    pub fn cleans_spaces(&self) -> bool {
        self.clean_spaces
    }

    /// Append the bytes token `id` stands for to `out` (see [`Tokenizer::decode`]); with
    /// `render_special`, control and unknown tokens append their text instead of nothing.
    /// Returns false (appending nothing) for an id outside the vocabulary.
    pub fn append_token_bytes(&self, id: TokenId, render_special: bool, out: &mut Vec<u8>) -> bool {
        if !self.vocab.contains(id) {
            return false;
        }
        let attrs = self.vocab.attrs(id);
        let text = self.vocab.text(id);
        if attrs.contains(TokenAttrs::CONTROL.union(TokenAttrs::UNKNOWN)) {
            if render_special {
                out.extend_from_slice(text.as_bytes());
            }
        } else if attrs.contains(TokenAttrs::USER_DEFINED) {
            out.extend_from_slice(text.as_bytes());
        } else if attrs.contains(TokenAttrs::NORMAL) {
            match self.model {
                Model::SentencePiece { .. } => {
                    for (i, part) in text.split('\u{2581}').enumerate() {
                        if i > 0 {
                            out.push(b' ');
                        }
                        out.extend_from_slice(part.as_bytes());
                    }
                }
                Model::ByteLevelBpe { .. } => bytelevel::decode_into(text, out),
            }
        } else if attrs.contains(TokenAttrs::BYTE) {
            match parse_byte_token(text) {
                Some(b) => out.push(b),
                None => out.extend_from_slice(text.as_bytes()),
            }
        }
        // Unused and undefined tokens decode to nothing, as in llama.cpp.
        true
    }

    /// The raw text of token `id` as stored in the vocabulary (`▁Hello`, `ĠHello`, `<0x0A>`,
    /// `<|im_end|>`), for display and debugging; `None` outside the vocabulary.
    pub fn token_piece(&self, id: TokenId) -> Option<&str> {
        self.vocab.contains(id).then(|| self.vocab.text(id))
    }

    /// The token whose raw text is exactly `piece` (e.g. `"<|im_end|>"`).
    pub fn token_id(&self, piece: &str) -> Option<TokenId> {
        self.vocab.lookup(piece.as_bytes())
    }

    /// Whether `id` is a control token (BOS, EOS, `<|im_start|>`, ...), which decodes to
    /// nothing.
    pub fn is_control(&self, id: TokenId) -> bool {
        self.vocab.contains(id) && self.vocab.attrs(id).contains(TokenAttrs::CONTROL)
    }

    /// Whether `id` is a special token: control, user-defined or unknown (the tokens that
    /// [`EncodeOptions::parse_special`] recognises in text).
    pub fn is_special(&self, id: TokenId) -> bool {
        self.vocab.contains(id)
            && self.vocab.attrs(id).contains(
                TokenAttrs::CONTROL
                    .union(TokenAttrs::USER_DEFINED)
                    .union(TokenAttrs::UNKNOWN),
            )
    }

    /// The beginning-of-sequence token, if the vocabulary has one.
    pub fn bos_id(&self) -> Option<TokenId> {
        self.bos
    }

    /// The end-of-sequence token, if the vocabulary has one.
    pub fn eos_id(&self) -> Option<TokenId> {
        self.eos
    }

    /// The end-of-turn token: `tokenizer.ggml.eot_token_id`, or else the first present of
    /// `<|eot_id|>`, `<|im_end|>`, `<|end|>`, `<end_of_turn>`, `<|endoftext|>`, ...
    pub fn eot_id(&self) -> Option<TokenId> {
        self.eot
    }

    /// The unknown token, if the vocabulary has one.
    pub fn unk_id(&self) -> Option<TokenId> {
        self.unk
    }

    /// Every token that ends generation (sorted): EOS, the EOT/EOM ids from the file, and
    /// the control or user-defined tokens named `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`,
    /// `<|eom_id|>`, `<|end|>`, `<end_of_turn>`, `<|end_of_text|>`, `<EOT>`, and the FIM
    /// padding/repo/file-separator tokens, as llama.cpp does.
    pub fn end_of_generation_ids(&self) -> &[TokenId] {
        &self.end_of_generation
    }

    /// Whether generating `id` should end generation.
    pub fn is_end_of_generation(&self, id: TokenId) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_len(&self) -> usize {
        self.vocab.len()
    }

    /// Whether the model expects BOS at the start of a sequence
    /// (`tokenizer.ggml.add_bos_token`; when absent: true for SentencePiece and Llama 3,
    /// false for other byte-level BPE models).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether SentencePiece encoding prefixes a space (`tokenizer.ggml.add_space_prefix`,
    /// default true; always false for byte-level BPE).
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    pub fn model_kind(&self) -> ModelKind {
        match self.model {
            Model::SentencePiece { .. } => ModelKind::SentencePiece,
            Model::ByteLevelBpe { .. } => ModelKind::ByteLevelBpe,
        }
    }

    /// The pre-tokenizer of a byte-level BPE vocabulary (`None` for SentencePiece, which has
    /// none).
    pub fn pre_kind(&self) -> Option<PreTokenizerKind> {
        match &self.model {
            Model::SentencePiece { .. } => None,
            Model::ByteLevelBpe { pre, .. } => Some(pre.kind()),
        }
    }

    /// Number of merge rules in use (0 for SentencePiece).
    pub fn merge_count(&self) -> usize {
        match &self.model {
            Model::SentencePiece { .. } => 0,
            Model::ByteLevelBpe { merges, .. } => merges.len(),
        }
    }

    /// Number of merge rules left out because their result is not a token (0 for every
    /// known vocabulary).
    pub fn skipped_merge_count(&self) -> usize {
        match &self.model {
            Model::SentencePiece { .. } => 0,
            Model::ByteLevelBpe { merges, .. } => merges.skipped(),
        }
    }
}

/// The byte of a `<0xXX>` token.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's three clean-up passes over decoded text (`llama_vocab::impl::detokenize`),
/// translated literally: each pass compacts the buffer in place, reading `text[i - 1]` of the
/// buffer as it stands (the second pass blanks the space it skips). Every byte the passes look
/// at or remove is ASCII, so UTF-8 stays intact.
pub fn clean_up_tokenization_spaces(decoded: &str) -> String {
    let mut text = decoded.as_bytes().to_vec();
    let mut total = text.len();
    // First pass: " ?", " !", " .", " ," lose the space.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Second pass: " ' " becomes "'".
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Third pass: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it).
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let contraction = matches!(x1, b's' | b'm')
                || (i + 2 < n && matches!((x1, text[i + 2]), (b'r', b'e') | (b'v', b'e')));
            if contraction {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
    String::from_utf8(text).expect("only ASCII bytes were removed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_clean_up_follows_llama_cpp() {
        for (raw, clean) in [
            ("Hello , world ! Is it ? Yes .", "Hello, world! Is it? Yes."),
            ("it ' s", "it's"),
            (
                "I 'm sure they 're here , we 've seen it 's",
                "I'm sure they're here, we've seen it's",
            ),
            ("don 't , I 'd , we 'll", "don 't, I 'd, we 'll"),
            (" . leading", ". leading"),
            ("a ' ' b", "a'' b"),
            ("", ""),
            ("é , ü ?", "é, ü?"),
        ] {
            assert_eq!(clean_up_tokenization_spaces(raw), clean, "{raw:?}");
        }
    }

    #[test]
    fn tokenizers_and_templates_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
        shareable::<crate::chat::ChatTemplate>();
        shareable::<StreamDecoder>();
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xff>"), Some(255));
        assert_eq!(parse_byte_token("<0x0A"), None);
        assert_eq!(parse_byte_token("<0x123>"), None);
        assert_eq!(parse_byte_token("a"), None);
    }
}

/// Differential tests: the heap-based merge loops against the obvious quadratic ones.
#[cfg(test)]
mod differential {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use proptest::prelude::*;

    use super::*;

    fn load(name: &str) -> Tokenizer {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/tokenizer")
            .join(name);
        let bytes = std::fs::read(path).unwrap();
        Tokenizer::from_gguf(&airs_gguf::Gguf::parse(&bytes).unwrap()).unwrap()
    }

    fn spm() -> &'static Tokenizer {
        static T: OnceLock<Tokenizer> = OnceLock::new();
        T.get_or_init(|| load("ggml-vocab-llama-spm.gguf"))
    }

    fn gpt2() -> &'static Tokenizer {
        static T: OnceLock<Tokenizer> = OnceLock::new();
        T.get_or_init(|| load("ggml-vocab-gpt-2.gguf"))
    }

    /// SentencePiece merging by rescanning all pairs after every merge.
    fn naive_spm(t: &Tokenizer, escaped: &str) -> Vec<TokenId> {
        let Model::SentencePiece { byte_tokens } = &t.model else {
            unreachable!()
        };
        let mut symbols: Vec<&str> = escaped
            .char_indices()
            .map(|(i, c)| &escaped[i..i + c.len_utf8()])
            .collect();
        loop {
            let mut best: Option<(f32, usize, TokenId)> = None;
            for i in 0..symbols.len().saturating_sub(1) {
                let joined = format!("{}{}", symbols[i], symbols[i + 1]);
                if let Some(id) = t.vocab.lookup(joined.as_bytes()) {
                    let score = t.vocab.score(id);
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            let start = symbols[i].as_ptr() as usize - escaped.as_ptr() as usize;
            let end = start + t.vocab.bytes(id).len();
            symbols[i] = &escaped[start..end];
            symbols.remove(i + 1);
        }
        let mut out = Vec::new();
        for s in symbols {
            match t.vocab.lookup(s.as_bytes()) {
                Some(id) => out.push(id),
                None => out.extend(s.bytes().filter_map(|b| byte_tokens[b as usize])),
            }
        }
        out
    }

    /// Byte-level BPE by rescanning all pairs for the lowest rank after every merge.
    fn naive_bpe_word(t: &Tokenizer, word: &[u8]) -> Vec<TokenId> {
        let mut symbols: Vec<TokenId> = word
            .iter()
            .map(|&b| {
                let mut s = String::new();
                bytelevel::encode_into(&[b], &mut s);
                t.vocab.lookup(s.as_bytes()).unwrap()
            })
            .collect();
        let Model::ByteLevelBpe { merges, .. } = &t.model else {
            unreachable!()
        };
        loop {
            let mut best: Option<(u32, usize, TokenId)> = None;
            for i in 0..symbols.len().saturating_sub(1) {
                if let Some(m) = merges.rank_of(symbols[i], symbols[i + 1])
                    && best.is_none_or(|(r, _, _)| m.0 < r)
                {
                    best = Some((m.0, i, m.1));
                }
            }
            let Some((_, i, merged)) = best else { break };
            symbols[i] = merged;
            symbols.remove(i + 1);
        }
        symbols
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn spm_heap_matches_naive(text in "[a-z A-Zéüß0-9.,'\\n🦙中文▁]{0,40}") {
            let t = spm();
            let mut escaped = String::from("\u{2581}");
            escaped.extend(text.chars().map(|c| if c == ' ' { '\u{2581}' } else { c }));
            let mut fast = Vec::new();
            let Model::SentencePiece { byte_tokens } = &t.model else { unreachable!() };
            spm::encode(&t.vocab, byte_tokens, t.unk, &escaped, &mut fast, &mut SpmScratch::default());
            prop_assert_eq!(fast, naive_spm(t, &escaped));
        }

        #[test]
        fn bpe_heap_matches_naive(word in "[a-z A-Z0-9éü'🦙]{1,24}") {
            let t = gpt2();
            let Model::ByteLevelBpe { merges, .. } = &t.model else { unreachable!() };
            let mut fast = Vec::new();
            bpe::encode_word(&t.vocab, merges, false, word.as_bytes(), &mut fast, &mut BpeScratch::default());
            prop_assert_eq!(fast, naive_bpe_word(t, word.as_bytes()));
        }

        #[test]
        fn byte_level_round_trips_any_text(text in "\\PC{0,40}") {
            // GPT-2's vocabulary asks for llama.cpp's space clean-up on decoding.
            let t = gpt2();
            let ids = t.encode(&text, EncodeOptions::default());
            prop_assert!(t.cleans_spaces());
            prop_assert_eq!(t.decode(&ids), clean_up_tokenization_spaces(&text));
        }

        #[test]
        fn sentencepiece_round_trips_text_without_markup(text in "[^<>\u{2581}]{0,40}") {
            let t = spm();
            let ids = t.encode(&text, EncodeOptions { add_bos: true, parse_special: false });
            prop_assert_eq!(t.decode(&ids), text);
        }
    }
}
