//! airs-tokenizer
