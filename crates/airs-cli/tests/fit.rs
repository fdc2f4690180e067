//! `airs fit` end to end: the device pool table of the design, verdicts, one-line errors, and
//! the prediction checked against real loads — the peak RSS `airs run --json` measures must be
//! within 5% of what `airs fit` predicts for stories260K (runtime-dominated) and Qwen2.5-0.5B
//! (weights-dominated).

use std::path::Path;
use std::process::{Command, Output};

use airs_testdata::{gemma_path, qwen_path, stories_path};
use serde_json::Value;

fn airs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_airs"))
        .args(args)
        .output()
        .expect("running airs")
}

fn ok(args: &[&str]) -> String {
    let out = airs(args);
    assert!(
        out.status.success(),
        "airs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn json_of(args: &[&str]) -> Value {
    serde_json::from_str(&ok(args)).expect("one JSON object on stdout")
}

/// The one stderr line of a failed command.
fn error_line(args: &[&str]) -> String {
    let out = airs(args);
    assert!(!out.status.success(), "airs {args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.trim_end().lines().count(), 1, "one error line: {err}");
    err
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn mib(v: &Value) -> u64 {
    v.as_u64().expect("a byte count") >> 20
}

const PROMPT: &str = "Once upon a time";
const GENERATED: usize = 16;

/// Runs `airs run` on `model` `runs` times; returns the largest peak RSS and the context the run
/// needed (prompt + generated tokens).
fn measured_peak(model: &Path, loader: &str, runs: usize) -> (u64, Vec<u64>, usize) {
    let n = GENERATED.to_string();
    let mut peaks = Vec::new();
    let mut context = 0;
    for _ in 0..runs {
        let v = json_of(&[
            "run",
            "--model",
            path_str(model),
            "--loader",
            loader,
            PROMPT,
            "-n",
            &n,
            // Without drafts: how many rows of logits a step with drafts holds depends on the
            // text, and the estimate charges the most (a known term, tested with the
            // estimate's other parts in `airs_runtime::fit`).
            "--draft-tokens",
            "0",
            "--json",
        ]);
        let prompt = v["prompt_token_ids"].as_array().expect("prompt ids").len();
        assert_eq!(
            v["generated_token_ids"].as_array().map(Vec::len),
            Some(GENERATED),
            "the run generates the tokens it was asked for"
        );
        context = prompt + GENERATED;
        peaks.push(v["memory"]["peak_rss_bytes"].as_u64().expect("peak RSS"));
    }
    (*peaks.iter().max().unwrap(), peaks, context)
}

fn check_prediction(model: &Path, loader: &str, runs: usize) {
    let (peak, peaks, context) = measured_peak(model, loader, runs);
    let fit = json_of(&[
        "fit",
        path_str(model),
        "--sessions",
        "1",
        "--context",
        &context.to_string(),
        "--loader",
        loader,
        "--draft-tokens",
        "0",
        "--json",
    ]);
    let predicted = fit["predicted_peak_rss_bytes"]
        .as_u64()
        .expect("prediction");
    // What the prediction is made of: model pool use plus the runtime outside the pool.
    assert_eq!(
        predicted,
        fit["model_pool"]["total_bytes"].as_u64().unwrap()
            + fit["runtime"]["total_bytes"].as_u64().unwrap()
    );
    let error = (peak as f64 - predicted as f64) / predicted as f64;
    eprintln!(
        "{}: measured peak RSS {peak} (runs: {peaks:?}), predicted {predicted}, error {:+.2}%\n{}",
        model.display(),
        error * 100.0,
        serde_json::to_string_pretty(&fit).unwrap()
    );
    assert!(
        error.abs() <= 0.05,
        "{}: measured peak RSS {peak} vs predicted {predicted}: {:+.2}% (runs: {peaks:?})",
        model.display(),
        error * 100.0
    );
}

/// stories260K: RSS is the binary and the runtime, loaded eagerly. With the lazy loader, whether
/// its chunk buffer (the whole 1.1 MiB file, 10 % of this small process) is still alive when
/// the inference footprint is reached is a race, which made the largest of 10 runs land
/// anywhere in ±5 % of the prediction; the eager loader has no buffer, and its runs agree
/// within 2.5 %. The lazy loader's buffers are checked on the larger models below. The peak is
/// the largest of several runs (each takes a few milliseconds).
#[test]
fn predicted_peak_rss_matches_airs_run_on_stories260k() {
    check_prediction(&stories_path(), "eager", 10);
}

/// Qwen2.5-Coder-0.5B Q4_K_M: the 469 MiB region dominates; the loader's buffers overlap the
/// run structurally (the load runs while inference starts), so one run shows the peak.
#[test]
fn predicted_peak_rss_matches_airs_run_on_qwen() {
    check_prediction(&qwen_path(), "lazy", 1);
}

/// Gemma 3 270M Q4_K_M: a 262,144-token vocabulary (its logits, sampler and tokenizer tables)
/// and two RoPE tables per pass (sliding-window layers rotate at their own base).
#[test]
fn predicted_peak_rss_matches_airs_run_on_gemma() {
    check_prediction(&gemma_path(), "lazy", 1);
}

#[test]
fn pools_follow_the_design_table() {
    let stories = stories_path();
    let s = path_str(&stories);
    let four = json_of(&["fit", s, "--device-ram", "4G", "--json"]);
    let b = &four["budget"];
    assert_eq!(
        [
            mib(&b["total_bytes"]),
            mib(&b["kernel_bytes"]),
            mib(&b["reserved_bytes"]),
            mib(&b["dma_bytes"]),
            mib(&b["user_pool_bytes"]),
            mib(&b["model_pool_bytes"]),
        ],
        [4096, 256, 128, 128, 1536, 2048]
    );
    assert_eq!(four["fit"]["verdict"], "fits");
    let eight = json_of(&["fit", s, "--device-ram", "8GiB", "--json"]);
    assert_eq!(mib(&eight["budget"]["model_pool_bytes"]), 4096);
    let two = json_of(&["fit", s, "--device-ram", "2048M", "--json"]);
    assert_eq!(two["budget"]["model_pool_bytes"], 0);
    assert_eq!(mib(&two["budget"]["user_pool_bytes"]), 1792);
    assert_eq!(two["fit"]["verdict"], "does_not_fit");
    // The override moves only the user pool.
    let over = json_of(&[
        "fit",
        s,
        "--device-ram",
        "4G",
        "--model-pool",
        "3G",
        "--json",
    ]);
    assert_eq!(mib(&over["budget"]["model_pool_bytes"]), 3072);
    assert_eq!(mib(&over["budget"]["user_pool_bytes"]), 512);

    // The text table: pool lines, then the model line with its verdict.
    let table = ok(&["fit", s, "--device-ram", "4G", "--context", "256"]);
    assert!(
        table.starts_with("Memory budget of a 4 GiB device (--device-ram)"),
        "{table}"
    );
    for (label, value) in [
        ("Total RAM:", "4096.0 MiB"),
        ("  - Kernel:", "256.0 MiB"),
        ("  - Reserved (firmware tables, MMIO):", "128.0 MiB"),
        ("  - DMA pool:", "128.0 MiB"),
        ("  - User pool (OS services, agents,", "1536.0 MiB"),
        ("  Available for model:", "2048.0 MiB"),
        ("  KV cache (1 × 256 tokens × 640 B):", "160.0 KiB"),
    ] {
        let line = table
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line in\n{table}"));
        assert!(
            line.trim_end().ends_with(value),
            "{line:?}: expected {value}"
        );
    }
    assert!(table.contains("Predicted peak RSS (model pool + runtime):"));
    let model_line = table
        .lines()
        .find(|l| l.starts_with("  Model pool use:"))
        .expect("model line");
    assert!(model_line.contains("← fits ("), "{model_line}");
    let two = ok(&["fit", s, "--device-ram", "2G"]);
    assert!(two.contains("inference goes to a remote endpoint"), "{two}");
    assert!(two.contains("← does not fit (no model pool)"), "{two}");
}

#[test]
fn kv_is_paged_in_16_token_blocks_and_typed() {
    let qwen = qwen_path();
    let q = path_str(&qwen);
    let per_token = |kv: &str| {
        let v = json_of(&["fit", q, "--context", "100", "--kv-type", kv, "--json"]);
        assert_eq!(v["model_pool"]["kv_tokens_per_session"], 112);
        assert_eq!(
            v["model_pool"]["kv_bytes"].as_u64(),
            v["model_pool"]["kv_bytes_per_token"]
                .as_u64()
                .map(|b| b * 112)
        );
        v["model_pool"]["kv_bytes_per_token"].as_u64().unwrap()
    };
    // 24 layers × 2 KV heads × 64 head_dim.
    assert_eq!(per_token("f32"), 2 * 24 * 2 * 64 * 4);
    assert_eq!(per_token("f16"), 2 * 24 * 2 * 64 * 2);
    assert_eq!(per_token("q8_0"), 2 * 24 * 2 * 64 / 32 * 34);
    // Weights are the whole file image, page-rounded (the model region holds the file).
    let v = json_of(&["fit", q, "--context", "16", "--json"]);
    let file = std::fs::metadata(&qwen).unwrap().len();
    let weights = v["model_pool"]["weights_bytes"].as_u64().unwrap();
    assert!(
        weights >= file && weights - file < 64 << 10,
        "{weights} vs {file}"
    );
}

#[test]
fn too_many_sessions_fit_with_limits() {
    let qwen = qwen_path();
    let q = path_str(&qwen);
    // 8 sessions × 32K tokens × 12 KiB = 3 GiB of f16 KV: more than a 4 GiB device's pool.
    let v = json_of(&[
        "fit",
        q,
        "--device-ram",
        "4G",
        "--sessions",
        "8",
        "--context",
        "32768",
        "--json",
    ]);
    assert_eq!(v["fit"]["verdict"], "fits_with_limits", "{v}");
    let pool = v["budget"]["model_pool_bytes"].as_u64().unwrap();
    let fixed = v["model_pool"]["weights_bytes"].as_u64().unwrap()
        + v["model_pool"]["scratch_bytes"].as_u64().unwrap();
    let per_token = v["model_pool"]["kv_bytes_per_token"].as_u64().unwrap();
    let sessions = v["fit"]["max_sessions"].as_u64().unwrap();
    let context = v["fit"]["max_context_tokens"].as_u64().unwrap();
    assert!((1..8).contains(&sessions), "{sessions}");
    assert!(fixed + sessions * 32768 * per_token <= pool);
    assert!(fixed + (sessions + 1) * 32768 * per_token > pool);
    assert_eq!(context % 16, 0);
    assert!(fixed + 8 * context * per_token <= pool);
    assert!(fixed + 8 * (context + 16) * per_token > pool);
    let table = ok(&[
        "fit",
        q,
        "--device-ram",
        "4G",
        "--sessions",
        "8",
        "--context",
        "32768",
    ]);
    assert!(
        table.contains(&format!(
            "← fits with at most {sessions} sessions of 32768 tokens or {context} tokens per \
             session"
        )),
        "{table}"
    );
    // A pool smaller than the weights: does not fit at all.
    let small = json_of(&[
        "fit",
        q,
        "--model-pool",
        "400M",
        "--context",
        "16",
        "--json",
    ]);
    assert_eq!(small["fit"]["verdict"], "does_not_fit");
    let table = ok(&["fit", q, "--model-pool", "400M", "--context", "16"]);
    assert!(table.contains("← does not fit"), "{table}");
}

#[test]
fn errors_are_one_line() {
    let stories = stories_path();
    let s = path_str(&stories);
    let e = error_line(&["fit", s, "--kv-type", "q8_0"]);
    assert!(e.contains("multiple of 32"), "{e}");
    let e = error_line(&["fit", s, "--device-ram", "4G", "--model-pool", "5G"]);
    assert!(e.contains("at most 3584 MiB"), "{e}");
    let e = error_line(&["fit", s, "--context", "100000"]);
    assert!(e.contains("context length of 2048"), "{e}");
    let e = error_line(&["fit", "/nonexistent/model.gguf"]);
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
    let out = airs(&["fit", s, "--device-ram", "4X"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown unit"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
