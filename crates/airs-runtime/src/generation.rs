//! The one decode loop, as a state machine per sequence: given the logits of a sequence's last
//! position, sample the next token, turn it into text that is final, and decide whether the
//! choice ends — on an end-of-generation token, a stop string, `max_tokens`, or a full
//! context. The scheduler drives it once per step for every sequence whose logits the step
//! produced — the draws ([`Generation::draw`], the O(vocab) part) of all of them on the
//! engine's threads, then the rest in order; nothing else in airs samples.
//!
//! A request for JSON ([`crate::request::OutputFormat`]: any object, or one of a schema) draws
//! only tokens that continue it and ends when the object closes ([`crate::constraint`]).
//!
//! Stop strings are matched on the decoded text; text that could still grow into a stop string
//! is held back until it cannot, so a stop string never reaches the caller. Incomplete UTF-8
//! characters are held back by the streaming decoder. What is still held when the choice ends
//! is released as its tail ([`crate::request::ChoiceEnd::tail`]).
//!
//! Cost: O(vocab) per token for sampling (plus the log-softmax when log-probabilities are
//! asked for); stop matching is linear in the text since the last emitted byte times the
//! number of stop strings.

use airs_engine::Sampler;
use airs_engine::sampler::logprobs;
use airs_tokenizer::{StreamDecoder, TokenId, Tokenizer};

use crate::constraint::JsonConstraint;
use crate::model::LoadedModel;
use crate::request::{FinishReason, GenerationParams, OutputFormat, TokenLogprobs};

/// Holds back streamed text that might be the start of a stop string.
#[derive(Debug)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    /// All text so far (after a hit: up to the stop string).
    text: String,
    emitted: usize,
}

impl StopMatcher {
    pub(crate) fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Append `piece`; returns the text now safe to emit and whether a stop string was hit.
    pub(crate) fn push(&mut self, piece: &str) -> (&str, bool) {
        let search_from = self.emitted;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| {
                self.text[search_from..]
                    .find(s.as_str())
                    .map(|i| search_from + i)
            })
            .min();
        if let Some(at) = hit {
            self.text.truncate(at);
            let out = &self.text[self.emitted..];
            self.emitted = self.text.len();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (len, _) in s.char_indices().skip(1) {
                if len > keep && self.text[self.emitted..].ends_with(&s[..len]) {
                    keep = len;
                }
            }
        }
        let until = self.text.len() - keep;
        let out = &self.text[self.emitted..until];
        self.emitted = until;
        (out, false)
    }

    /// Release everything held back.
    pub(crate) fn finish(&mut self) -> &str {
        let out = &self.text[self.emitted..];
        self.emitted = self.text.len();
        out
    }

    pub(crate) fn text(&self) -> &str {
        &self.text
    }
}

/// What one accepted token produced.
#[derive(Debug)]
pub(crate) struct Accepted {
    /// The sampled token, unless it ended generation (an end-of-generation token is not part
    /// of the sequence).
    pub token: Option<u32>,
    /// Text that became final with it.
    pub text: String,
    pub logprobs: Option<TokenLogprobs>,
    /// Set when the choice ends here, with the tail text released at the end.
    pub finish: Option<(FinishReason, String)>,
}

/// A token drawn from a position's logits ([`Generation::draw`]), not yet accepted.
#[derive(Debug)]
pub(crate) struct Draw {
    pub(crate) token: u32,
    logprobs: Option<TokenLogprobs>,
    /// The output format's constraint allowed no token at all (the choice ends).
    blocked: bool,
    /// The first draw broke the output format's constraint and the token was drawn again
    /// from the allowed ones.
    pub(crate) redrawn: bool,
}

/// One choice's decode state (see the module documentation).
#[derive(Debug)]
pub(crate) struct Generation {
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopMatcher,
    max_tokens: usize,
    logprobs: Option<usize>,
    ignore_eos: bool,
    json: Option<JsonConstraint>,
    pub generated: Vec<u32>,
}

impl Generation {
    /// Choice `choice` of a request with `params` (its sampler seed offset by `choice`) to
    /// `model`.
    pub(crate) fn new(params: &GenerationParams, choice: usize, model: &LoadedModel) -> Generation {
        let mut sampler = params.sampler.clone();
        sampler.seed = sampler.seed.wrapping_add(choice as u64);
        Generation {
            sampler: Sampler::new(sampler),
            decoder: StreamDecoder::new(),
            stops: StopMatcher::new(params.stop.clone()),
            max_tokens: params.max_tokens,
            logprobs: params.logprobs,
            ignore_eos: params.ignore_eos,
            json: match &params.format {
                OutputFormat::Text => None,
                OutputFormat::JsonObject => Some(JsonConstraint::new(model.vocab_bytes(), None)),
                OutputFormat::JsonSchema(schema) => Some(JsonConstraint::new(
                    model.vocab_bytes(),
                    Some(std::sync::Arc::clone(schema)),
                )),
            },
            generated: Vec::new(),
        }
    }

    /// Tokens it may still generate before `max_tokens`.
    pub(crate) fn remaining_tokens(&self) -> usize {
        self.max_tokens.saturating_sub(self.generated.len())
    }

    /// The text generated so far (stop string excluded).
    pub(crate) fn text(&self) -> &str {
        self.stops.text()
    }

    /// Sample the token after `sequence` (every token so far: prompt and generated) from the
    /// logits of its last position, with the log-probabilities if the request asked for them
    /// (computed even for an end-of-generation token, which then drops them): the part of
    /// accepting a token that reads the vocabulary's logits. Touches only this choice's
    /// sampler, so the scheduler runs the draws of a step's sequences on the engine's threads;
    /// [`Generation::accept_draw`] does the rest. Under an output format's constraint a token it
    /// does not allow is drawn again from the allowed ones ([`crate::constraint`]); the
    /// log-probabilities are the model's, before the constraint.
    pub(crate) fn draw(&mut self, logits: &[f32], sequence: &[u32]) -> Draw {
        let mut token = self.sampler.sample(logits, sequence);
        let (mut blocked, mut redrawn) = (false, false);
        if let Some(json) = &mut self.json
            && !json.allows(token)
        {
            redrawn = true;
            match json.mask(logits) {
                Some(allowed) => token = self.sampler.sample(allowed, sequence),
                None => blocked = true,
            }
        }
        let logprobs = self.logprobs.map(|top| {
            let (logprob, top) = logprobs(logits, token, top);
            TokenLogprobs { logprob, top }
        });
        Draw {
            token,
            logprobs,
            blocked,
            redrawn,
        }
    }

    /// Accept the token [`Generation::draw`] drew after a sequence of `sequence_len` tokens:
    /// end-of-generation, the text it makes final, stop strings, the token limit and the
    /// context (`context_len`: the most positions the sequence may hold).
    pub(crate) fn accept_draw(
        &mut self,
        tokenizer: &Tokenizer,
        draw: Draw,
        sequence_len: usize,
        context_len: usize,
    ) -> Accepted {
        let next = draw.token;
        if draw.blocked || !self.ignore_eos && tokenizer.is_end_of_generation(TokenId(next)) {
            let tail = self.release_tail();
            return Accepted {
                token: None,
                text: String::new(),
                logprobs: None,
                finish: Some((FinishReason::EndOfGeneration, tail)),
            };
        }
        let logprobs = draw.logprobs;
        self.generated.push(next);
        let complete = self.json.as_mut().is_some_and(|json| json.accept(next));
        let piece = self.decoder.push(tokenizer, TokenId(next)).to_owned();
        let (out, hit) = self.stops.push(&piece);
        let text = out.to_owned();
        let finish = if hit {
            Some((FinishReason::StopString, String::new()))
        } else if complete {
            // The JSON object closed: nothing may follow it.
            Some((FinishReason::EndOfGeneration, self.release_tail()))
        } else if self.generated.len() >= self.max_tokens {
            Some((FinishReason::MaxTokens, self.release_tail()))
        } else if sequence_len >= context_len {
            // The next step would compute this token at position `sequence.len()`, which the
            // context does not have.
            Some((FinishReason::ContextFull, self.release_tail()))
        } else {
            None
        };
        Accepted {
            token: Some(next),
            text,
            logprobs,
            finish,
        }
    }

    fn release_tail(&mut self) -> String {
        let tail = self.decoder.finish().to_owned();
        let (out, _) = self.stops.push(&tail);
        let mut rest = out.to_owned();
        rest.push_str(self.stops.finish());
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (o, hit) = m.push(p);
            out.push_str(o);
            if hit {
                return (out, true);
            }
        }
        out.push_str(m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_never_streamed() {
        assert_eq!(run(&["\n\n"], &["a", "b\n", "\nc"]), ("ab".into(), true));
        assert_eq!(run(&["END"], &["x E", "N", "D y"]), ("x ".into(), true));
    }

    #[test]
    fn a_partial_match_that_does_not_complete_is_released() {
        assert_eq!(run(&["END"], &["x E", "N", "d"]), ("x ENd".into(), false));
        assert_eq!(run(&[], &["plain ", "text"]), ("plain text".into(), false));
        assert_eq!(
            run(&[""], &["empty ", "stop"]),
            ("empty stop".into(), false)
        );
    }
}
