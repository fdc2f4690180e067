//! Real vocabularies for synthetic models: every `tokenizer.*` metadata entry of one of
//! llama.cpp's vocabulary-only GGUF files (testdata/tokenizer/ggml-vocab-*.gguf), copied
//! verbatim so the generated model tokenizes exactly as a real model with that vocabulary.

use std::path::{Path, PathBuf};

use airs_gguf::writer::MetaValue;
use airs_gguf::{Gguf, Value};

use crate::{Shape, SynthError};

/// Metadata prefix of everything a tokenizer reads (`tokenizer.ggml.*`, `tokenizer.chat_template`).
const TOKENIZER_PREFIX: &str = "tokenizer.";
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// The `tokenizer.*` metadata of a vocabulary file, ready to be written.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocabulary {
    entries: Vec<(String, MetaValue)>,
    token_count: usize,
}

/// The directory holding llama.cpp's vocabulary files in this repository
/// (`testdata/tokenizer`), as located when airs-synth was built.
pub fn default_vocab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/tokenizer")
}

impl Vocabulary {
    /// Copy the `tokenizer.*` entries of a parsed GGUF file, in file order.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<Vocabulary, SynthError> {
        let mut entries = Vec::new();
        let mut token_count = None;
        for (key, value) in gguf.metadata() {
            if !key.starts_with(TOKENIZER_PREFIX) {
                continue;
            }
            if *key == TOKENS_KEY {
                token_count = value.as_array().map(|a| a.len());
            }
            entries.push((key.to_string(), owned_value(key, *value)?));
        }
        let token_count = token_count.ok_or_else(|| SynthError::VocabValue {
            key: TOKENS_KEY.into(),
            reason: "missing or not an array".into(),
        })?;
        Ok(Vocabulary {
            entries,
            token_count,
        })
    }

    /// Read the vocabulary of the GGUF file at `path`.
    pub fn load(path: &Path) -> Result<Vocabulary, SynthError> {
        let image = std::fs::read(path).map_err(|source| SynthError::VocabRead {
            path: path.into(),
            source,
        })?;
        let gguf = Gguf::parse(&image).map_err(|source| SynthError::VocabParse {
            path: path.into(),
            source,
        })?;
        Vocabulary::from_gguf(&gguf).map_err(|e| match e {
            SynthError::VocabValue { key, .. } if key == TOKENS_KEY => {
                SynthError::VocabMissingTokens { path: path.into() }
            }
            other => other,
        })
    }

    /// Read the vocabulary `shape` uses from `dir` and check its size.
    pub fn for_shape(shape: Shape, dir: &Path) -> Result<Vocabulary, SynthError> {
        let vocab = Vocabulary::load(&dir.join(shape.hparams().vocab_file))?;
        vocab.check_size(shape)?;
        Ok(vocab)
    }

    /// An error unless the vocabulary has exactly as many tokens as `shape`'s embedding rows.
    pub fn check_size(&self, shape: Shape) -> Result<(), SynthError> {
        let expected = shape.hparams().vocab_len;
        if self.token_count != expected {
            return Err(SynthError::VocabSize {
                shape: shape.name(),
                expected,
                actual: self.token_count,
            });
        }
        Ok(())
    }

    /// The `tokenizer.*` entries, in the source file's order.
    pub fn entries(&self) -> &[(String, MetaValue)] {
        &self.entries
    }

    pub fn token_count(&self) -> usize {
        self.token_count
    }
}

/// An owned copy of a metadata value. The writer's strings are `String`s, so a value holding
/// bytes that are not UTF-8 cannot be copied and is reported.
fn owned_value(key: &str, value: Value<'_>) -> Result<MetaValue, SynthError> {
    Ok(match value {
        Value::U8(v) => MetaValue::U8(v),
        Value::I8(v) => MetaValue::I8(v),
        Value::U16(v) => MetaValue::U16(v),
        Value::I16(v) => MetaValue::I16(v),
        Value::U32(v) => MetaValue::U32(v),
        Value::I32(v) => MetaValue::I32(v),
        Value::F32(v) => MetaValue::F32(v),
        Value::Bool(v) => MetaValue::Bool(v),
        Value::U64(v) => MetaValue::U64(v),
        Value::I64(v) => MetaValue::I64(v),
        Value::F64(v) => MetaValue::F64(v),
        Value::String(bytes) => match std::str::from_utf8(bytes) {
            Ok(s) => MetaValue::String(s.to_owned()),
            Err(_) => {
                return Err(SynthError::VocabValue {
                    key: key.into(),
                    reason: format!("string {bytes:?} is not UTF-8"),
                });
            }
        },
        Value::Array(array) => MetaValue::Array(
            array.elem_type(),
            array
                .iter()
                .map(|item| owned_value(key, item))
                .collect::<Result<_, _>>()?,
        ),
    })
}
