//! Streaming detokenization: turning token ids into text one at a time without ever
//! emitting half a character.
//!
//! A token does not always end on a character boundary: SentencePiece byte-fallback tokens
//! (`<0xF0>` `<0x9F>` `<0xA6>` `<0x99>` for 🦙) and byte-level BPE tokens both can split a
//! multi-byte UTF-8 sequence. [`StreamDecoder`] keeps the bytes of an incomplete sequence
//! until the tokens that complete it arrive, and emits only complete UTF-8 text; a sequence
//! that can never become valid is emitted as U+FFFD, exactly where
//! `String::from_utf8_lossy` on the whole byte stream would put it, so the concatenation of
//! everything a decoder emits equals [`Tokenizer::decode`] of all the ids.
//!
//! Cost: O(bytes of the token) per push; at most three bytes are held back.

use crate::{TokenId, Tokenizer};

/// Decodes token ids one at a time into complete UTF-8 text.
///
/// Holds no reference to the tokenizer (pass it to each [`StreamDecoder::push`]), so it can
/// live next to a shared tokenizer in a generation loop.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    /// Bytes decoded but not yet emitted (an incomplete UTF-8 sequence).
    pending: Vec<u8>,
    /// The text returned by the last call.
    emitted: String,
    /// Whether a SentencePiece prefix space is still to be removed from the first text.
    strip_leading_space: bool,
}

impl StreamDecoder {
    /// A decoder for tokens that continue existing text (generated tokens after a prompt):
    /// every piece is emitted as is, including a leading space.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// A decoder for a sequence from its start, matching [`Tokenizer::decode`]: for a
    /// SentencePiece vocabulary the space that encoding prefixed is removed from the first
    /// token that produces text.
    pub fn at_sequence_start() -> StreamDecoder {
        StreamDecoder {
            strip_leading_space: true,
            ..StreamDecoder::default()
        }
    }

    /// Decode one more token, returning the text that is now complete (often empty while a
    /// character is split across tokens). Control tokens produce nothing; ids outside the
    /// vocabulary are skipped.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: TokenId) -> &str {
        let start = self.pending.len();
        tokenizer.append_token_bytes(id, false, &mut self.pending);
        if self.strip_leading_space && self.pending.len() > start {
            if tokenizer.add_space_prefix() && self.pending[start] == b' ' {
                self.pending.remove(start);
            }
            self.strip_leading_space = false;
        }
        self.drain(false)
    }

    /// Emit whatever is held back (an incomplete sequence at the end of the stream becomes
    /// U+FFFD) and reset the decoder for a continuation.
    pub fn finish(&mut self) -> &str {
        self.drain(true)
    }

    /// Bytes currently held back waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn drain(&mut self, flush: bool) -> &str {
        self.emitted.clear();
        let mut done = 0;
        while done < self.pending.len() {
            match std::str::from_utf8(&self.pending[done..]) {
                Ok(text) => {
                    self.emitted.push_str(text);
                    done = self.pending.len();
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix is valid UTF-8 by definition of `valid_up_to`.
                    if let Ok(text) = std::str::from_utf8(&self.pending[done..done + valid]) {
                        self.emitted.push_str(text);
                    }
                    done += valid;
                    match e.error_len() {
                        Some(bad) => {
                            self.emitted.push(char::REPLACEMENT_CHARACTER);
                            done += bad;
                        }
                        None if flush => {
                            self.emitted.push(char::REPLACEMENT_CHARACTER);
                            done = self.pending.len();
                        }
                        None => break, // incomplete sequence at the end: wait for more
                    }
                }
            }
        }
        self.pending.drain(..done);
        &self.emitted
    }
}
