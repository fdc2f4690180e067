//! Building a [`Tokenizer`] from GGUF metadata (the `tokenizer.ggml.*` keys), following
//! llama.cpp's `llama_vocab::impl::load` for defaults and special tokens, but rejecting
//! malformed metadata with a typed error where llama.cpp would warn, guess or crash.
//!
//! Cost: one pass over the token list (texts copied once into an arena and indexed), one
//! over the merges (two lookups and one of the joined text per rule). The 151,936-token,
//! 151,387-merge Qwen2 vocabulary loads in tens of milliseconds in release builds.

use airs_gguf::{Array, Gguf, Value, ValueType};

use crate::bpe::BpeMerges;
use crate::error::{TokenizerError, TokenizerErrorKind};
use crate::pretokenize::{PreTokenizer, PreTokenizerKind};
use crate::tokenizer::Model;
use crate::vocab::{TokenAttrs, Vocab};
use crate::{TokenId, Tokenizer};

/// Most tokens a vocabulary may have (the largest real ones have about 262k).
pub const MAX_VOCAB_LEN: usize = 1 << 21;
/// Most merge rules a vocabulary may have (Llama 3 has 280k).
pub const MAX_MERGES: usize = 1 << 22;

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
const KEY_UNK: &str = "tokenizer.ggml.unknown_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

/// Texts of tokens that end a turn, in the order `eot_id` prefers them.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
];

/// Further texts of tokens that end generation (llama.cpp's EOM and FIM pad/repo/file-sep).
const OTHER_END_TEXTS: &[&str] = &[
    "<|eom_id|>",
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<reponame>",
    "<|file_sep|>",
];

fn err<T>(kind: TokenizerErrorKind) -> Result<T, TokenizerError> {
    Err(TokenizerError::new(kind))
}

fn wrong_type<T>(key: &'static str, expected: &'static str) -> Result<T, TokenizerError> {
    err(TokenizerErrorKind::WrongType { key, expected })
}

/// An optional array of `elem` type (`elem = None`: any element type).
fn opt_array<'a>(
    g: &Gguf<'a>,
    key: &'static str,
    expected: &'static str,
    elem: Option<ValueType>,
) -> Result<Option<Array<'a>>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) if elem.is_none_or(|t| a.elem_type() == t) => Ok(Some(a)),
        Some(_) => wrong_type(key, expected),
    }
}

fn opt_str<'a>(g: &Gguf<'a>, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(v) => match v.as_str() {
            Some(text) => Ok(Some(text)),
            None => wrong_type(key, "a UTF-8 string"),
        },
    }
}

fn opt_bool(g: &Gguf<'_>, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(_) => wrong_type(key, "a bool"),
    }
}

/// A special-token id: absent → `Ok(None)`; -1 or u32::MAX (how converters write "none")
/// → `Ok(Some(None))`; in range → `Ok(Some(Some(id)))`; anything else is an error.
fn special_id(
    g: &Gguf<'_>,
    key: &'static str,
    vocab_len: usize,
) -> Result<Option<Option<TokenId>>, TokenizerError> {
    let Some(value) = g.get(key) else {
        return Ok(None);
    };
    let Some(id) = value.as_i64() else {
        return match value.as_u64() {
            Some(id) => err(TokenizerErrorKind::SpecialIdOutOfRange {
                key,
                id: id as i64,
                vocab_len,
            }),
            None => wrong_type(key, "an integer token id"),
        };
    };
    if id == -1 || id == i64::from(u32::MAX) {
        return Ok(Some(None));
    }
    if id < 0 || id as u64 >= vocab_len as u64 {
        return err(TokenizerErrorKind::SpecialIdOutOfRange { key, id, vocab_len });
    }
    Ok(Some(Some(TokenId(id as u32))))
}

fn check_len(key: &'static str, len: usize, vocab_len: usize) -> Result<(), TokenizerError> {
    if len != vocab_len {
        return err(TokenizerErrorKind::LengthMismatch {
            key,
            len,
            vocab_len,
        });
    }
    Ok(())
}

impl Tokenizer {
    /// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    ///
    /// Reads the model (`llama` or `gpt2`), pre-tokenizer (`tokenizer.ggml.pre`: see
    /// [`PreTokenizerKind::from_name`]; absent means `default`, an unknown name is an
    /// error), tokens, scores, token types, merges, the BOS/EOS/EOT/EOM/UNK ids and the
    /// `add_bos_token`/`add_space_prefix` flags. Defaults follow llama.cpp: SentencePiece
    /// has BOS 1, EOS 2, UNK 0 and adds BOS; byte-level BPE has no default special ids and
    /// adds BOS only for Llama 3-style pre-tokenizers. Errors (never panics) on missing or
    /// mistyped keys, per-token arrays whose length differs from the token list, empty,
    /// non-UTF-8 or duplicate token texts, special ids outside the vocabulary (other than
    /// -1/u32::MAX, meaning none), malformed merges or merges naming unknown tokens, and
    /// more than [`MAX_VOCAB_LEN`] tokens or [`MAX_MERGES`] merges.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<Tokenizer, TokenizerError> {
        let model_name = opt_str(g, KEY_MODEL)?.ok_or(TokenizerErrorKind::MissingKey(KEY_MODEL))?;
        let is_spm = match model_name {
            "llama" => true,
            "gpt2" => false,
            other => return err(TokenizerErrorKind::UnsupportedModel(other.to_owned())),
        };

        let tokens = opt_array(
            g,
            KEY_TOKENS,
            "an array of strings",
            Some(ValueType::String),
        )?
        .ok_or(TokenizerErrorKind::MissingKey(KEY_TOKENS))?;
        let n = tokens.len();
        if n == 0 {
            return err(TokenizerErrorKind::EmptyVocabulary);
        }
        if n > MAX_VOCAB_LEN {
            return err(TokenizerErrorKind::TooMany {
                what: KEY_TOKENS,
                count: n,
                limit: MAX_VOCAB_LEN,
            });
        }

        let scores: Vec<f32> = match opt_array(g, KEY_SCORES, "an array of f32 or integers", None)?
        {
            None => vec![0.0; n],
            Some(a) => {
                check_len(KEY_SCORES, a.len(), n)?;
                if let Some(floats) = a.f32s() {
                    floats.collect()
                } else if let Some(ints) = a.ints() {
                    ints.map(|v| v as f32).collect()
                } else {
                    return wrong_type(KEY_SCORES, "an array of f32 or integers");
                }
            }
        };
        let mut attrs: Vec<TokenAttrs> =
            match opt_array(g, KEY_TOKEN_TYPE, "an array of integers", None)? {
                None => vec![TokenAttrs::NORMAL; n],
                Some(a) => {
                    check_len(KEY_TOKEN_TYPE, a.len(), n)?;
                    match a.ints() {
                        Some(ints) => ints.map(TokenAttrs::from_token_type).collect(),
                        None => return wrong_type(KEY_TOKEN_TYPE, "an array of integers"),
                    }
                }
            };
        let texts = tokens.strings().ok_or(TokenizerErrorKind::WrongType {
            key: KEY_TOKENS,
            expected: "an array of strings",
        })?;

        // Strip flags (llama.cpp's per-model attribute table): Phi-3 special tokens swallow
        // the whitespace to their right, except <unk>, <s> and <|endoftext|>.
        let general_name = g
            .get("general.name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let is_phi3 = general_name.contains("phi-3") || general_name.contains("phi3");
        if is_phi3 {
            let special = TokenAttrs::CONTROL
                .union(TokenAttrs::USER_DEFINED)
                .union(TokenAttrs::UNKNOWN);
            for a in attrs.iter_mut().filter(|a| a.contains(special)) {
                a.set(TokenAttrs::RSTRIP, true);
            }
        }
        let mut vocab = Vocab::build(texts, n, scores, attrs)?;
        if is_phi3 {
            for (text, rstrip) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(id) = vocab.lookup(text.as_bytes()) {
                    vocab.attrs_mut(id).set(TokenAttrs::RSTRIP, rstrip);
                }
            }
        }

        let pre_name = if is_spm { None } else { opt_str(g, KEY_PRE)? };
        let pre_kind = if is_spm {
            None
        } else {
            Some(match pre_name {
                None => PreTokenizerKind::Default,
                Some(name) => PreTokenizerKind::from_name(name)
                    .ok_or_else(|| TokenizerErrorKind::UnknownPreTokenizer(name.to_owned()))?,
            })
        };
        // llama.cpp: BPE vocabularies clean up tokenization spaces unless their pre-tokenizer
        // is one of these.
        const KEEP_SPACES: &[&str] = &[
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "youtu",
            "command-r",
            "cohere2_moe",
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "openpangu",
            "f2llmv2",
            "qwen35",
            "poro-chat",
            "viking",
            "tekken",
            "smollm",
            "chameleon",
            "gpt-4o",
            "llama4",
            "kanana2",
            "tiny_aya",
            "superbpe",
            "trillion",
            "granite-docling",
            "bailingmoe",
            "bailingmoe2",
            "llada-moe",
            "seed-coder",
            "hunyuan",
            "hunyuan-dense",
        ];
        let clean_spaces = !is_spm && !pre_name.is_some_and(|n| KEEP_SPACES.contains(&n));

        let model = match pre_kind {
            None => {
                let mut byte_tokens = Box::new([None; 256]);
                for (b, slot) in byte_tokens.iter_mut().enumerate() {
                    *slot = vocab.lookup(format!("<0x{b:02X}>").as_bytes()).or_else(|| {
                        // Fall back to the one-byte token, as llama.cpp's byte_to_token does.
                        (b < 0x80).then(|| vocab.lookup(&[b as u8])).flatten()
                    });
                }
                Model::SentencePiece { byte_tokens }
            }
            Some(kind) => {
                let rules = opt_array(
                    g,
                    KEY_MERGES,
                    "an array of strings",
                    Some(ValueType::String),
                )?
                .ok_or(TokenizerErrorKind::MissingKey(KEY_MERGES))?;
                if rules.len() > MAX_MERGES {
                    return err(TokenizerErrorKind::TooMany {
                        what: KEY_MERGES,
                        count: rules.len(),
                        limit: MAX_MERGES,
                    });
                }
                let strings = rules.strings().ok_or(TokenizerErrorKind::WrongType {
                    key: KEY_MERGES,
                    expected: "an array of strings",
                })?;
                Model::ByteLevelBpe {
                    merges: BpeMerges::build(&vocab, strings, rules.len())?,
                    pre: PreTokenizer::new(kind)?,
                }
            }
        };

        // Special ids: llama.cpp's defaults (SentencePiece: <unk>=0, <s>=1, </s>=2), then
        // the file's keys.
        let default_id = |id: u32| (is_spm && (id as usize) < n).then_some(TokenId(id));
        let bos = special_id(g, KEY_BOS, n)?.unwrap_or(default_id(1));
        let eos = special_id(g, KEY_EOS, n)?.unwrap_or(default_id(2));
        let unk = special_id(g, KEY_UNK, n)?.unwrap_or(default_id(0));
        let eot_key = special_id(g, KEY_EOT, n)?.flatten();
        let eom = special_id(g, KEY_EOM, n)?.flatten();

        let add_bos = opt_bool(g, KEY_ADD_BOS)?
            .unwrap_or(is_spm || pre_kind.is_some_and(PreTokenizerKind::adds_bos_by_default));
        if add_bos && bos.is_none() {
            return err(TokenizerErrorKind::MissingBos);
        }
        let add_space_prefix = is_spm && opt_bool(g, KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);

        // End of generation: EOS, EOT, EOM and the special tokens with end-of-turn texts.
        let special_text = |text: &str| {
            vocab.lookup(text.as_bytes()).filter(|&id| {
                vocab
                    .attrs(id)
                    .contains(TokenAttrs::CONTROL.union(TokenAttrs::USER_DEFINED))
            })
        };
        let eot = eot_key.or_else(|| END_OF_TURN_TEXTS.iter().find_map(|t| special_text(t)));
        let mut end_of_generation: Vec<TokenId> = [eos, eot, eom]
            .into_iter()
            .flatten()
            .chain(
                END_OF_TURN_TEXTS
                    .iter()
                    .chain(OTHER_END_TEXTS)
                    .filter_map(|t| special_text(t)),
            )
            .collect();
        end_of_generation.sort_unstable();
        end_of_generation.dedup();

        let special_attrs = TokenAttrs::CONTROL
            .union(TokenAttrs::USER_DEFINED)
            .union(TokenAttrs::UNKNOWN);
        let mut specials: Vec<TokenId> = vocab
            .ids()
            .filter(|&id| vocab.attrs(id).contains(special_attrs))
            .collect();
        specials.sort_by_key(|&id| (std::cmp::Reverse(vocab.bytes(id).len()), id));

        Ok(Tokenizer {
            vocab,
            model,
            bos,
            eos,
            eot,
            unk,
            end_of_generation,
            add_bos,
            add_space_prefix,
            clean_spaces,
            specials,
        })
    }
}
