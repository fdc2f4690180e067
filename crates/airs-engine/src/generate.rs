//! Text generation: prefill the prompt in batches, then decode one token at a time, streaming
//! complete UTF-8 text as it is produced and stopping on an end-of-generation token, a stop
//! string, the token limit, or a full context.
//!
//! Stop strings are matched on the decoded text; text that could still grow into a stop string
//! is held back from the stream until it cannot, so a stop string never reaches the caller.
//! Cost: one forward pass per decoded token plus `ceil(prompt / batch)` prefill passes.

use std::time::{Duration, Instant};

use airs_tokenizer::{StreamDecoder, TokenId, Tokenizer};

use crate::error::EngineError;
use crate::forward::{Logits, Runtime};
use crate::kv::KvCache;
use crate::model::Model;
use crate::sampler::{Sampler, SamplerConfig};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateConfig {
    /// Most tokens to generate.
    pub max_tokens: usize,
    pub stop_strings: Vec<String>,
    pub sampler: SamplerConfig,
    /// Most prompt tokens per prefill pass.
    pub prefill_batch: usize,
}

impl Default for GenerateConfig {
    fn default() -> GenerateConfig {
        GenerateConfig {
            max_tokens: 128,
            stop_strings: Vec::new(),
            sampler: SamplerConfig::default(),
            prefill_batch: 512,
        }
    }
}

/// Why generation stopped.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// The text reached one of the stop strings.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
}

impl StopReason {
    pub fn name(self) -> &'static str {
        match self {
            StopReason::EndOfGeneration => "eos",
            StopReason::StopString => "stop_string",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
        }
    }
}

/// The outcome of a generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub generated: Vec<u32>,
    /// The generated text, without any stop string.
    pub text: String,
    pub stop_reason: StopReason,
    /// Prompt tokens processed (those not already in the KV cache).
    pub prefill_tokens: usize,
    pub prefill_time: Duration,
    /// From the start of the call to the first generated token.
    pub time_to_first_token: Duration,
    /// Tokens decoded after the first, and the time they took.
    pub decode_tokens: usize,
    pub decode_time: Duration,
}

impl Generation {
    pub fn prefill_tokens_per_s(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_time)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        rate(self.decode_tokens, self.decode_time)
    }
}

fn rate(tokens: usize, time: Duration) -> f64 {
    if time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}

/// Holds back streamed text that might be the start of a stop string.
struct StopMatcher<'a> {
    stops: &'a [String],
    text: String,
    emitted: usize,
}

impl StopMatcher<'_> {
    /// Append `piece`; returns the text now safe to emit and whether a stop string was hit.
    fn push(&mut self, piece: &str) -> (&str, bool) {
        let search_from = self.emitted;
        self.text.push_str(piece);
        let hit = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
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
        for s in self.stops {
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

    fn finish(&mut self) -> &str {
        let out = &self.text[self.emitted..];
        self.emitted = self.text.len();
        out
    }
}

/// Generate a continuation of `prompt` (whose first `kv.len()` tokens are already cached),
/// calling `on_text` with each piece of text as it becomes final.
pub fn generate(
    model: &Model,
    rt: &Runtime,
    tokenizer: &Tokenizer,
    kv: &mut dyn KvCache,
    prompt: &[u32],
    config: &GenerateConfig,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, EngineError> {
    let start = Instant::now();
    let cached = kv.len().min(prompt.len());
    let todo = &prompt[cached..];
    if todo.is_empty() {
        return Err(EngineError::invalid(
            "nothing to compute: the prompt is empty or already fully cached",
        ));
    }
    let mut logits = model.prefill(rt, kv, todo, config.prefill_batch)?;
    let prefill_time = start.elapsed();

    let mut sampler = Sampler::new(config.sampler.clone());
    let mut history: Vec<u32> = prompt.to_vec();
    let mut generated = Vec::new();
    let mut decoder = StreamDecoder::new();
    let mut stops = StopMatcher {
        stops: &config.stop_strings,
        text: String::new(),
        emitted: 0,
    };
    let mut time_to_first_token = Duration::ZERO;
    let mut decode_started = None;
    let capacity_hit = |kv: &mut dyn KvCache| kv.reserve(kv.len() + 1).is_err();
    let stop_reason = loop {
        if generated.len() >= config.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits, &history);
        if generated.is_empty() {
            time_to_first_token = start.elapsed();
            decode_started = Some(Instant::now());
        }
        if tokenizer.is_end_of_generation(TokenId(next)) {
            break StopReason::EndOfGeneration;
        }
        generated.push(next);
        history.push(next);
        let piece = decoder.push(tokenizer, TokenId(next)).to_owned();
        let (out, hit) = stops.push(&piece);
        if !out.is_empty() {
            on_text(out);
        }
        if hit {
            break StopReason::StopString;
        }
        if generated.len() >= config.max_tokens {
            break StopReason::MaxTokens;
        }
        if capacity_hit(kv) {
            break StopReason::ContextFull;
        }
        logits = model.forward(rt, kv, &[next], Logits::Last)?;
    };
    if stop_reason != StopReason::StopString {
        let tail = decoder.finish().to_owned();
        let (out, _) = stops.push(&tail);
        let mut rest = out.to_owned();
        rest.push_str(stops.finish());
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    let decode_time = decode_started.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(Generation {
        decode_tokens: generated.len().saturating_sub(1),
        generated,
        text: stops.text,
        stop_reason,
        prefill_tokens: todo.len(),
        prefill_time,
        time_to_first_token,
        decode_time,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher {
            stops: &stops,
            text: String::new(),
            emitted: 0,
        };
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
    }
}
