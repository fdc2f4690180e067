//! Memory admission: the device's model pool (the design's budget rule, or an explicit size),
//! and what a model with a scheduler takes from it — the one estimate `airs fit` predicts with
//! and the [`crate::Scheduler`] charges before it allocates, so fit never accepts what the
//! runtime then refuses.
//!
//! Design: §6.1 (pools per device tier, [`airs_memory::budget`]) and §6.3 (paged KV) of
//! `shared/design/model-memory.md`. What is inside the model pool:
//! - **weights**: the whole GGUF file rounded up to the base page, header included — the model
//!   region is a byte-for-byte image of the file (§6.2) and is what the model registry charges;
//! - **KV pool**: whole blocks of `tokens_per_block` positions, each position 2 × layers ×
//!   kv_heads × the bytes of one head row ([`KvShape::bytes_per_token`], the engine's one rule:
//!   f32 4 × head_dim, f16 2 × head_dim, q8_0 34 per 32 values);
//! - **scratch**: the activation buffers of one batched step ([`Scratch::for_batch`]).
//!
//! Outside the model pool but in the process's resident set (what `airs fit` adds to predict
//! the peak RSS of `airs run`): the runtime base ([`RUNTIME_BASE_BYTES`], measured), one stack
//! per worker thread ([`THREAD_BYTES`]), the tokenizer tables (measured by building them), and
//! the lazy loader's chunk buffers while it loads ([`loader_buffer_bytes`]).
//!
//! Cost: arithmetic; [`PoolPolicy::budget`] reads `/proc/meminfo` once when the RAM size is not
//! given.

use std::sync::Arc;

use airs_engine::footprint::{ModelShape, Scratch};
use airs_engine::{KvShape, KvType};
use airs_memory::{KvPool, KvPoolConfig, LoaderKind, ModelRegistry, PoolBudget};

use crate::error::{Result, RuntimeError};
use crate::scheduler::SchedulerConfig;

const KIB: u64 = 1 << 10;

/// The runtime's base resident memory: the `airs` binary's code and data, libc, libm, libgcc_s
/// and the dynamic loader as resident while `airs run` generates, the allocator's initial heap
/// and the main thread's stack. Measured on x86-64 Linux with `/proc/PID/smaps` at the end of
/// `airs run --json` on stories260K, where nothing else is large, and as the peak of
/// `airs run --loader eager` on it minus its region, KV cache, scratch and tokenizer:
/// - builds with debug assertions (the `test` profile, which `cargo test` runs): 7.0 MiB — the
///   `airs` mappings 4.5–4.9 MiB (how much of the binary the kernel maps around the pages
///   touched varies from run to run), shared libraries 2.1–2.3 MiB, heap and stack 0.2 MiB;
/// - release builds: 6.25 MiB (the `airs` mappings 3.9–4.0 MiB);
/// - plus 0.75 MiB since the binary links SQLite (the session store), measured the same way;
/// - plus 1.45 MiB (test profile) and 0.75 MiB (release) since it links the server (axum,
///   tokio, reqwest with rustls): more of a larger binary is mapped even when `airs run` never
///   starts it;
/// - plus 680 KiB (test profile) and 780 KiB (release) as the kernels grew (2026-12-03): the
///   peak of `airs run --loader eager --json` on stories260K, 10 runs, was 11,136-11,420 KiB
///   (test profile) and 9,820-10,000 KiB (release) against predictions of 10,588 and 9,118;
///   `/proc/PID/smaps` then showed the `airs` mappings at 7.3-7.5 MiB (test) and 5.9-6.0 MiB
///   (release), shared libraries 2.1-2.4 MiB;
/// - plus 470 KiB (test profile) and 300 KiB (release) as constrained output and function
///   calling grew the binary (2026-12-04): the same peak, 10 runs, was 11,548-11,900 KiB
///   (test profile, median 11,736) and 10,144-10,340 KiB (release, median 10,216) against
///   predictions of 11,268 and 9,898 KiB;
/// - plus 420 KiB (test profile) and 220 KiB (release) as the AMX tile kernels grew the binary
///   (2026-12-07): the same peak, 30 runs (test profile) and 50 (release), was 11,852-12,388
///   KiB (median 12,164) and 10,172-10,564 KiB (median 10,426) against predictions of 11,746
///   and 10,206 KiB; the largest test-profile run was 5.5 % above its prediction.
///
/// Other targets (aarch64) differ by their code size; re-measure there with
/// `airs run --loader eager --json` on stories260K.
pub const RUNTIME_BASE_BYTES: u64 = if cfg!(debug_assertions) {
    10_810 * KIB
} else {
    9_070 * KIB
};
/// Resident memory per worker thread besides its scratch: stack pages touched and thread
/// control block (measured: 20–40 KiB; rounded up).
pub const THREAD_BYTES: u64 = 64 * KIB;

/// Parses a size: a number with an optional binary unit (K, M, G, T, with or without `B` or
/// `iB`, any case): `4G`, `4096M`, `8GiB`, `1.5G`, `512mb`, `1048576`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "unknown unit {other:?} in size {s:?} (use K, M, G or T, e.g. 4G or 4096M)"
            ));
        }
    };
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 4G, 4096M, 8GiB)"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// Where a command's model pool comes from: the device's RAM (given, or this machine's) by the
/// design's rule, optionally overridden by an explicit model-pool size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolPolicy {
    /// Total RAM of the device [default: this machine's MemTotal rounded up to whole GiB].
    pub device_ram: Option<u64>,
    /// The model pool's size, overriding the rule (the user pool takes up the difference).
    pub model_pool: Option<u64>,
}

impl PoolPolicy {
    /// The device budget and where its RAM size came from (`--device-ram` or this machine).
    pub fn budget(&self) -> Result<(PoolBudget, &'static str)> {
        let (mut budget, source) = match self.device_ram {
            Some(bytes) => (PoolBudget::for_total_ram(bytes), "--device-ram"),
            None => (
                PoolBudget::for_this_device().map_err(|e| {
                    RuntimeError::invalid(format!("reading this machine's RAM size: {e}"))
                })?,
                "this machine",
            ),
        };
        if let Some(pool) = self.model_pool {
            budget = budget
                .with_model_pool(pool)
                .map_err(|e| RuntimeError::invalid(e.to_string()))?;
        }
        Ok((budget, source))
    }

    /// Whether this device serves models locally (a 2 GB device has no model pool: the design
    /// sends its inference to a remote endpoint).
    pub fn has_model_pool(&self) -> Result<bool> {
        Ok(self.budget()?.0.model_pool_bytes > 0)
    }

    /// An empty model registry over a new account of the budget's model pool. A device without
    /// a model pool is an error here, before anything is loaded.
    pub fn registry(&self) -> Result<Arc<ModelRegistry>> {
        let (budget, source) = self.budget()?;
        if budget.model_pool_bytes == 0 {
            return Err(RuntimeError::invalid(format!(
                "a device with {} MiB of RAM ({source}) has no model pool: the design routes its \
                 inference to a remote endpoint (give --model-pool SIZE to run locally anyway)",
                budget.total_bytes >> 20
            )));
        }
        Ok(Arc::new(ModelRegistry::for_budget(&budget)))
    }
}

/// The KV geometry of a model shape.
pub fn kv_shape(shape: &ModelShape) -> KvShape {
    KvShape {
        layers: shape.layers as usize,
        kv_heads: shape.kv_heads as usize,
        head_dim: shape.head_dim as usize,
    }
}

/// Bytes one position of a `ty` KV cache takes for `shape`, or why it cannot be held.
pub fn kv_bytes_per_token(shape: &ModelShape, ty: KvType) -> Result<usize> {
    kv_shape(shape).bytes_per_token(ty).ok_or_else(|| {
        RuntimeError::invalid(format!(
            "a {} KV cache cannot hold heads of {} values (q8_0 needs a multiple of 32; at most \
             {})",
            ty.name(),
            shape.head_dim,
            airs_engine::kv::MAX_HEAD_DIM
        ))
    })
}

/// What a scheduler charges to the model pool besides the weights.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerCharges {
    pub kv_bytes_per_token: usize,
    /// The KV pool's mapping: its whole blocks.
    pub kv_bytes: u64,
    /// Positions the KV pool holds.
    pub kv_tokens: u64,
    pub scratch: Scratch,
}

/// What a scheduler of `config` for a model of `shape` on `threads` threads charges, exactly
/// as [`crate::Scheduler::new`] charges it.
pub fn scheduler_charges(
    shape: &ModelShape,
    config: &SchedulerConfig,
    threads: u64,
) -> Result<SchedulerCharges> {
    let per_token = kv_bytes_per_token(shape, config.kv_type)?;
    let pool_config = KvPoolConfig {
        pool_bytes: config.kv_pool_bytes,
        bytes_per_token: per_token,
        tokens_per_block: config.tokens_per_block,
        pin: config.pin,
        huge_pages: config.kv_huge_pages,
    };
    let kv_bytes =
        KvPool::mapped_bytes(&pool_config).map_err(|e| RuntimeError::invalid(e.to_string()))?;
    let kv_tokens = (kv_bytes / per_token) as u64;
    // No sequence holds more positions than the pool or the context: the attention buffers'
    // length.
    let context = kv_tokens.clamp(1, shape.context_len.max(1));
    let scratch = Scratch::for_batch(
        shape,
        context,
        threads,
        config.step_tokens as u64,
        config.max_running as u64,
    );
    // A step with drafts wants the logits of every row it computes.
    let draft = &config.draft;
    let logit_rows = if draft.enabled() {
        draft.step_rows().max(config.max_running)
    } else {
        config.max_running
    };
    let scratch = scratch.with_logit_rows(shape, logit_rows.min(config.step_tokens) as u64);
    Ok(SchedulerCharges {
        kv_bytes_per_token: per_token,
        kv_bytes: kv_bytes as u64,
        kv_tokens,
        scratch,
    })
}

/// The scheduler `airs run` (one sequence of up to `capacity` positions) and `airs fit`'s
/// estimate for one session use: a KV pool of exactly the blocks `capacity` needs, one running
/// sequence, steps no longer than the sequence.
pub fn single_sequence_config(
    shape: &ModelShape,
    capacity: usize,
    kv_type: KvType,
) -> Result<SchedulerConfig> {
    sessions_config(shape, 1, capacity, kv_type)
}

/// The scheduler for `sessions` sequences of up to `context` positions each.
pub fn sessions_config(
    shape: &ModelShape,
    sessions: usize,
    context: usize,
    kv_type: KvType,
) -> Result<SchedulerConfig> {
    let per_token = kv_bytes_per_token(shape, kv_type)?;
    let tpb = airs_memory::DEFAULT_TOKENS_PER_BLOCK as usize;
    let mut config =
        SchedulerConfig::new(sessions * context.max(1).next_multiple_of(tpb) * per_token);
    config.kv_type = kv_type;
    config.max_running = sessions.max(1);
    config.step_tokens = context
        .clamp(1, airs_engine::footprint::PREFILL_BATCH as usize)
        .max(config.max_running + 1);
    Ok(config)
}

/// What `airs fit` was asked: sessions of a context with a KV type, on a number of threads,
/// with speculative decoding as `airs run` and `airs serve` will do it (its drafts' logits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitRequest {
    pub sessions: u64,
    pub context: u64,
    pub kv: KvType,
    pub threads: u64,
    pub draft: crate::DraftConfig,
}

/// The verdict for the model pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Fits,
    /// Fits only with fewer sessions (`max_sessions` of the requested context) or a shorter
    /// context (`max_context` tokens for each of the requested sessions); either may be 0.
    FitsWithLimits {
        max_sessions: u64,
        max_context: u64,
    },
    DoesNotFit,
}

/// The estimate for one model and request against one budget.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    pub weights: u64,
    pub kv_per_token: u64,
    /// Each session's context rounded up to whole KV blocks.
    pub tokens_per_session: u64,
    pub kv: u64,
    pub scratch: Scratch,
    pub verdict: Verdict,
}

impl Estimate {
    pub fn new(
        shape: &ModelShape,
        request: FitRequest,
        pool_bytes: u64,
        page_bytes: u64,
    ) -> Result<Estimate> {
        let tpb = u64::from(airs_memory::DEFAULT_TOKENS_PER_BLOCK);
        let mut config = sessions_config(
            shape,
            request.sessions as usize,
            request.context as usize,
            request.kv,
        )?;
        config.draft = request.draft;
        let charges = scheduler_charges(shape, &config, request.threads)?;
        let kv_per_token = charges.kv_bytes_per_token as u64;
        let weights = shape.file_bytes.div_ceil(page_bytes) * page_bytes;
        let tokens_per_session = request.context.next_multiple_of(tpb);
        let kv = charges.kv_bytes;
        let scratch = charges.scratch;
        let fixed = weights + scratch.total();
        let verdict = if fixed + kv <= pool_bytes {
            Verdict::Fits
        } else if fixed + tpb * kv_per_token > pool_bytes {
            Verdict::DoesNotFit
        } else {
            let room = pool_bytes - fixed;
            let block = tpb * kv_per_token;
            Verdict::FitsWithLimits {
                max_sessions: room / (tokens_per_session * kv_per_token).max(1),
                max_context: room / request.sessions.max(1) / block * tpb,
            }
        };
        Ok(Estimate {
            weights,
            kv_per_token,
            tokens_per_session,
            kv,
            scratch,
            verdict,
        })
    }

    /// Weights + KV + scratch: what the model takes from the model pool.
    pub fn model_pool_use(&self) -> u64 {
        self.weights + self.kv + self.scratch.total()
    }
}

/// The runtime overhead outside the model pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overhead {
    pub base: u64,
    pub threads: u64,
    pub tokenizer: u64,
    pub loader: LoaderKind,
    /// The loader's chunk buffers while the load runs.
    pub loader_buffers: u64,
}

impl Overhead {
    pub fn total(&self) -> u64 {
        self.base + self.threads + self.tokenizer + self.loader_buffers
    }
}

/// Bytes of the chunk buffers `loader` holds while loading a `file_bytes` file: the lazy
/// loader's [`airs_memory::LAZY_CHUNK_BUFFERS`] (its background thread's reads in flight and
/// the fault handler's; never more than the file has chunks), and every chunk in flight,
/// eager or lazy, may carry a repacking transform's context, up to
/// [`airs_memory::max_context_bytes`] on either side.
pub fn loader_buffer_bytes(
    loader: LoaderKind,
    file_bytes: u64,
    chunk_bytes: u64,
    page_bytes: u64,
) -> u64 {
    let chunks = file_bytes.div_ceil(chunk_bytes);
    let context = match chunks {
        0 | 1 => 0,
        _ => 2 * airs_memory::max_context_bytes(chunk_bytes),
    };
    match loader {
        LoaderKind::Lazy => {
            let buffer = chunk_bytes.min(file_bytes).next_multiple_of(page_bytes);
            chunks.min(airs_memory::LAZY_CHUNK_BUFFERS as u64) * (buffer + context)
        }
        LoaderKind::Eager => context,
        LoaderKind::Mmap => 0,
    }
}

/// Anonymous resident memory of this process (`RssAnon`), in bytes.
pub fn rss_anon() -> Option<u64> {
    proc_status_kib("RssAnon:")
}

/// Peak resident set size of this process (`VmHWM`), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:")
}

fn proc_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * KIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loader_buffers_count_each_chunk_in_flight_and_its_context() {
        const MIB: u64 = 1 << 20;
        let (chunk, page) = (2 * MIB, 4096);
        // Three chunks in flight (two reads of the filler, one of the fault handler), each
        // with up to an eighth of a chunk of context on either side.
        assert_eq!(
            loader_buffer_bytes(LoaderKind::Lazy, 400 * MIB, chunk, page),
            3 * (chunk + chunk / 4)
        );
        assert_eq!(
            loader_buffer_bytes(LoaderKind::Eager, 400 * MIB, chunk, page),
            chunk / 4
        );
        assert_eq!(
            loader_buffer_bytes(LoaderKind::Mmap, 400 * MIB, chunk, page),
            0
        );
        // A file of one chunk: one buffer, nothing around it.
        assert_eq!(
            loader_buffer_bytes(LoaderKind::Lazy, MIB + 1, chunk, page),
            MIB + page
        );
        assert_eq!(loader_buffer_bytes(LoaderKind::Eager, MIB, chunk, page), 0);
    }

    fn qwen_like() -> ModelShape {
        ModelShape {
            arch: "qwen2".into(),
            file_bytes: 491_400_064,
            tensor_bytes: 485_452_288,
            layers: 24,
            embd: 896,
            heads: 14,
            kv_heads: 2,
            head_dim: 64,
            ff: 4864,
            vocab: 151_936,
            context_len: 32768,
            rope_dims: 64,
            rope_tables: 1,
            act_row_bytes: 5548 + 5168,
            max_act_row_bytes: 5548,
            max_layer_rows: 4864,
        }
    }

    fn req(sessions: u64, context: u64) -> FitRequest {
        FitRequest {
            sessions,
            context,
            kv: KvType::F16,
            threads: 4,
            draft: crate::DraftConfig::OFF,
        }
    }

    #[test]
    fn sizes_parse_in_binary_units() {
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("4096M"), Ok(4 << 30));
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8gb"), Ok(8 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("4X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("G").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn kv_rounds_each_session_to_whole_blocks() {
        let e = Estimate::new(&qwen_like(), req(3, 21), 2 << 30, 4096).unwrap();
        assert_eq!(e.kv_per_token, 2 * 24 * 2 * 64 * 2);
        assert_eq!(e.tokens_per_session, 32);
        assert_eq!(e.kv, 3 * 32 * 12288);
        assert_eq!(e.weights, 491_401_216);
        assert_eq!(e.verdict, Verdict::Fits);
        let q8 = Estimate::new(
            &qwen_like(),
            FitRequest {
                kv: KvType::Q8_0,
                ..req(1, 16)
            },
            2 << 30,
            4096,
        )
        .unwrap();
        assert_eq!(q8.kv_per_token, 2 * 24 * 2 * 68);
    }

    #[test]
    fn fit_charges_what_the_scheduler_charges() {
        let s = qwen_like();
        let config = sessions_config(&s, 3, 21, KvType::F16).unwrap();
        let charges = scheduler_charges(&s, &config, 4).unwrap();
        let e = Estimate::new(&s, req(3, 21), 2 << 30, 4096).unwrap();
        assert_eq!(e.kv, charges.kv_bytes);
        assert_eq!(e.scratch, charges.scratch);
        assert_eq!(config.max_running, 3);
        assert_eq!(config.step_tokens, 21);
        assert_eq!(e.scratch.logits, 3 * (896 * 4 + 151_936 * 4));
        // Each of the 3 running sequences keeps its sampler's and constraint's buffers; each
        // of the 4 threads draws one at a time.
        assert_eq!(e.scratch.sampler, 3 * 151_936 * 16 + 4 * 151_936 * 8);
        // With drafts, a step computes the logits of up to 16 rows (DraftConfig::step_rows).
        let drafting = FitRequest {
            draft: crate::DraftConfig::with_tokens(8),
            ..req(3, 21)
        };
        let d = Estimate::new(&s, drafting, 2 << 30, 4096).unwrap();
        assert_eq!(d.scratch.logits, 16 * (896 * 4 + 151_936 * 4));
        let config = SchedulerConfig {
            draft: drafting.draft,
            ..config
        };
        assert_eq!(
            scheduler_charges(&s, &config, 4).unwrap().scratch,
            d.scratch
        );
    }

    #[test]
    fn scratch_is_sized_for_the_step() {
        let s = qwen_like();
        let small = Scratch::new(&s, 20, 2);
        assert_eq!(small.rows, 20);
        let big = Scratch::new(&s, 32768, 2);
        assert_eq!(big.rows, 512);
        // f32 activations of a 512-row batch: (3·896 + 2·896 + 2·128 + 2·4864) · 4 B per row.
        assert_eq!(
            big.activations,
            512 * ((3 * 896 + 2 * 896 + 2 * 128 + 2 * 4864) * 4 + 256)
        );
        assert_eq!(big.logits, 896 * 4 + 151_936 * 4);
        // Per-thread attention scores: 7 query heads per KV head × context floats.
        assert!(big.per_thread >= 2 * 7 * 32768 * 4);
        assert!(big.total() > 30 << 20 && big.total() < 60 << 20, "{big:?}");
        // A batch of 16 sequences holds 16 rows of logits.
        let batch = Scratch::for_batch(&s, 32768, 2, 512, 16);
        assert_eq!(batch.logits, 16 * (896 * 4 + 151_936 * 4));
    }

    #[test]
    fn verdicts_and_limits() {
        let s = qwen_like();
        // 4 sessions × 32K f16 tokens = 1.5 GiB of KV: too much for a 2 GiB pool.
        let e = Estimate::new(&s, req(4, 32768), 2 << 30, 4096).unwrap();
        let Verdict::FitsWithLimits {
            max_sessions,
            max_context,
        } = e.verdict
        else {
            panic!("{:?}", e.verdict)
        };
        let room = (2u64 << 30) - e.weights - e.scratch.total();
        assert_eq!(max_sessions, room / (32768 * 12288));
        assert_eq!(max_sessions, 3);
        assert_eq!(max_context % 16, 0);
        assert!(4 * max_context * 12288 <= room);
        assert!(4 * (max_context + 16) * 12288 > room);
        // A pool smaller than the weights: does not fit; no pool at all: does not fit.
        assert_eq!(
            Estimate::new(&s, req(1, 16), 400 << 20, 4096)
                .unwrap()
                .verdict,
            Verdict::DoesNotFit
        );
        assert_eq!(
            Estimate::new(&s, req(1, 16), 0, 4096).unwrap().verdict,
            Verdict::DoesNotFit
        );
        // q8_0 needs head_dim % 32 == 0.
        let odd = ModelShape {
            head_dim: 8,
            ..qwen_like()
        };
        let err = Estimate::new(
            &odd,
            FitRequest {
                kv: KvType::Q8_0,
                ..req(1, 16)
            },
            2 << 30,
            4096,
        )
        .unwrap_err();
        assert!(err.to_string().contains("multiple of 32"), "{err}");
    }
}
