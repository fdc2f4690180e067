//! airs-synth: synthetic GGUF models of realistic size, for benchmarks and tests that need a
//! model of a real shape without downloading one.
//!
//! A [`Recipe`] — a named [`Shape`] (`tiny`, `qwen2-tiny`, `qwen3-tiny`, `llama3-tiny`, `phi3-tiny`, `tinyllama-1.1b`), a [`QuantMix`]
//! (`f32`, `f16`, `q8_0`, `q4_k_m`, `q5_k_m`, `q4_1`, `q5_1`) and a seed — determines a file
//! byte for byte:
//!
//! - **Tensors** ([`plan`]): the names, ggml-order shapes and tensor order llama.cpp writes
//!   for `llama`/`qwen2` models (`token_embd.weight [n_embd, n_vocab]`, `blk.N.attn_q.weight
//!   [n_embd, n_embd]`, ..., `output.weight [n_embd, n_vocab]`, qwen2's q/k/v biases).
//! - **Types** ([`QuantMix::tensor_type`]): the `q4_k_m` mix is llama.cpp's Q4_K_M as chosen
//!   by `llama_tensor_get_type` in `src/llama-quant.cpp`: Q4_K matrices (including
//!   `token_embd`), Q6_K for `output.weight`, and Q6_K for `attn_v` and `ffn_down` in the
//!   layers where `use_more_bits(i_layer, n_layers)` holds; norms and biases stay F32. The
//!   `q5_k_m` mix is llama.cpp's Q5_K_M, the same choices with Q5_K in place of Q4_K; `q4_1`
//!   and `q5_1` are all Q4_1/Q5_1 but for a Q6_K `output.weight`, as llama.cpp writes them.
//! - **Metadata** ([`metadata`]): `general.*` (with `file_type` as llama.cpp's `llama_ftype`
//!   and `alignment` 32), the `{arch}.*` hyperparameters, and every `tokenizer.*` entry of a
//!   real vocabulary file from llama.cpp's tokenizer tests ([`Vocabulary`]), so the model
//!   tokenizes like a real llama-spm or qwen2 model.
//! - **Weights** (module [`weights`]): seeded splitmix64, gaussian-ish values with std 0.02
//!   (norm weights 1.0 ± 0.02), drawn per row from `(seed, tensor name, row)` — so every thread
//!   count gives the same bytes and every mix of one seed encodes the same underlying weights —
//!   and encoded with ggml's reference quantizers from airs-kernels.
//!
//! Cost: [`plan`], [`metadata`] and [`Recipe::file_size`] are instant (no weights). Writing
//! streams one tensor at a time through `airs_gguf::writer::write_gguf`, so memory is one
//! tensor's encoded bytes (at most the output matrix: 54 MB for tinyllama-1.1b q4_k_m or
//! q5_k_m) plus a row of f32 per worker (65 MB peak RSS for tinyllama-1.1b q4_k_m, 68 MB for
//! q5_k_m). Time is dominated by the reference k-quant quantizers of airs-kernels, roughly
//! 15–25 M values/s per core for Q4_K, Q5_K and Q6_K against hundreds of M/s for Q8_0 and
//! F16: tinyllama-1.1b (1.1 G values) costs about 60 CPU-seconds in q4_k_m or q5_k_m
//! (≈ 30 s on two idle cores; 62 s for q5_k_m on one thread) and about 4 CPU-seconds plus
//! the 1.2 GB write in q8_0.

mod error;
mod generate;
mod mix;
mod plan;
mod shape;
mod vocab;
pub mod weights;

pub use error::SynthError;
pub use generate::{Recipe, WrittenModel};
pub use mix::{QuantMix, TensorRole, use_more_bits};
pub use plan::{ALIGNMENT, PlannedTensor, metadata, plan, plan_tensors};
pub use shape::{Hyperparameters, RopeScaling, Shape};
pub use vocab::{Vocabulary, default_vocab_dir};
