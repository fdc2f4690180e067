//! The `airs` binary end to end: inspect, tokenize and run on real model files, and the
//! one-line errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use airs_testdata::{Reference, qwen_path, stories_path};
use serde_json::Value;

fn airs(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_airs"))
        .args(args)
        .output()
        .expect("running airs")
}

fn json_of(args: &[&str]) -> Value {
    let out = airs(args);
    assert!(
        out.status.success(),
        "airs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The synthetic TinyLlama-1.1B Q4_K_M, generated into the model cache on first use.
fn tinyllama_q4_k_m() -> PathBuf {
    let path = qwen_path()
        .parent()
        .expect("model cache dir")
        .join("tinyllama-1.1b-q4_k_m.gguf");
    if !path.exists() {
        let out = airs(&[
            "gen-model",
            "--shape",
            "tinyllama-1.1b",
            "--quant",
            "q4_k_m",
            "--seed",
            "1",
            "-o",
            path_str(&path),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    path
}

fn hparams(v: &Value) -> [u64; 7] {
    let h = &v["hyperparameters"];
    [
        "layers",
        "embedding_len",
        "heads",
        "kv_heads",
        "head_dim",
        "ff_len",
        "vocab_len",
    ]
    .map(|k| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}")))
}

#[test]
fn inspect_reports_the_hyperparameters_of_all_three_model_files() {
    let stories = json_of(&["inspect", "--json"]);
    assert_eq!(stories["hyperparameters"]["architecture"], "llama");
    assert_eq!(hparams(&stories), [5, 64, 8, 4, 8, 172, 512]);
    assert_eq!(stories["tensors"], 48);
    assert_eq!(stories["data_offset"], 14_176);

    let qwen = json_of(&["inspect", path_str(&qwen_path()), "--json"]);
    assert_eq!(qwen["hyperparameters"]["architecture"], "qwen2");
    assert_eq!(hparams(&qwen), [24, 896, 14, 2, 64, 4864, 151_936]);
    assert_eq!(qwen["hyperparameters"]["rope_style"], "neox");
    assert_eq!(qwen["hyperparameters"]["rope_base"], 1_000_000.0);
    assert_eq!(qwen["hyperparameters"]["qkv_bias"], true);
    assert_eq!(qwen["tokenizer"]["pre"], "qwen2");
    let by_type: Vec<(String, u64)> = qwen["tensors_by_type"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["count"].as_u64().unwrap(),
            )
        })
        .collect();
    for want in [
        ("q5_0", 133),
        ("f32", 121),
        ("q8_0", 13),
        ("q6_K", 12),
        ("q4_K", 12),
    ] {
        assert!(
            by_type.contains(&(want.0.to_owned(), want.1)),
            "{want:?} in {by_type:?}"
        );
    }
    assert_eq!(qwen["layers"].as_array().unwrap().len(), 24);

    let tiny = json_of(&["inspect", path_str(&tinyllama_q4_k_m()), "--json"]);
    assert_eq!(hparams(&tiny), [22, 2048, 32, 4, 64, 5632, 32_000]);
    assert_eq!(tiny["parameters"], 1_100_048_384u64);
}

#[test]
fn tokenize_gives_the_reference_prompt_ids() {
    let reference = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf32");
    let text = reference.prompt_text.clone().unwrap();
    let v = json_of(&["tokenize", path_str(&qwen_path()), &text, "--json"]);
    let ids: Vec<u32> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, reference.prompt_token_ids);
}

#[test]
fn run_streams_the_reference_story_from_the_embedded_model() {
    let v = json_of(&["run", "-n", "64", "--kv-type", "f32", "--json"]);
    let reference = Reference::load("stories260K.bos.kvf32");
    let ids: Vec<u32> = v["generated_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, reference.greedy_token_ids);
    assert_eq!(v["stop_reason"], "max_tokens");
    assert!(v["text"].as_str().unwrap().starts_with(" Once upon a time"));
    let out = airs(&["run", "Once upon a time", "-n", "16"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Once upon a time, there was"));
}

#[test]
fn run_constrained_to_json_writes_json_and_logit_bias_steers_tokens() {
    let free = json_of(&["run", "-n", "24", "--json"]);
    assert!(
        free["text"]
            .as_str()
            .unwrap()
            .starts_with(" Once upon a time")
    );
    let v = json_of(&["run", "-n", "24", "--format", "json-object", "--json"]);
    let text = v["text"].as_str().unwrap();
    // The story model never closes its strings within 24 tokens: a prefix of one object.
    assert!(text.starts_with('{'), "{text:?}");
    let e = serde_json::from_str::<Value>(text).unwrap_err();
    assert!(e.is_eof(), "{text:?}: {e}");
    // Banning the greedy first token, then forcing another one.
    let first = free["generated_token_ids"][0].as_u64().unwrap();
    let banned = json_of(&[
        "run",
        "-n",
        "4",
        "--logit-bias",
        &format!("{first}=-inf"),
        "--json",
    ]);
    assert_ne!(banned["generated_token_ids"][0].as_u64().unwrap(), first);
    let forced = json_of(&["run", "-n", "4", "--logit-bias", "300=100", "--json"]);
    assert_eq!(
        forced["generated_token_ids"],
        serde_json::json!([300, 300, 300, 300])
    );
    // A schema holds even the story model to an instance: an enum and a boolean close it.
    let dir = std::env::temp_dir().join(format!("airs-cli-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = dir.join("mood.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"mood": {"enum": ["happy", "sad"]},
            "sunny": {"type": "boolean"}}, "required": ["mood", "sunny"]}"#,
    )
    .unwrap();
    let v = json_of(&[
        "run",
        "-n",
        "64",
        "--json-schema",
        path_str(&schema),
        "--json",
    ]);
    let reply: Value = serde_json::from_str(v["text"].as_str().unwrap()).expect("an instance");
    assert!(
        ["happy", "sad"].contains(&reply["mood"].as_str().unwrap()),
        "{reply}"
    );
    assert!(reply["sunny"].is_boolean(), "{reply}");
    assert_eq!(v["stop_reason"], "eos");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}"#,
    )
    .unwrap();
    let out = airs(&["run", "--json-schema", path_str(&schema)]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"format\""));
    std::fs::remove_dir_all(&dir).unwrap();
    let out = airs(&["run", "--logit-bias", "7"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ID=BIAS"));
}

#[test]
fn run_with_tools_prints_the_calls_qwen_makes_and_the_calls_a_choice_forces() {
    let tools = airs_testdata::repo_path("testdata/tools/weather-and-add.json");
    let qwen = qwen_path();
    let ask = |extra: &[&str], json: bool| {
        let mut args = vec![
            "run",
            "--model",
            path_str(&qwen),
            "--chat",
            "What's the weather like in Paris today?",
            "--tools",
            path_str(&tools),
            "-n",
            "64",
        ];
        args.extend_from_slice(extra);
        if json {
            args.push("--json");
        }
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run_json = |extra: &[&str]| {
        let args = ask(extra, true);
        json_of(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let v = run_json(&[]);
    assert_eq!(
        v["tool_calls"],
        serde_json::json!([{"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}])
    );
    // Streamed: the call as one JSON line, no text around it.
    let args = ask(&[], false);
    let out = airs(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim(),
        r#"{"tool_call":{"arguments":{"city":"Paris"},"name":"get_weather"}}"#
    );
    // Forced to add: a call of add's schema; none: no tools shown, text.
    let v = run_json(&["--tool-choice", "add"]);
    let call = &v["tool_calls"][0];
    assert_eq!(call["name"], "add");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["a"].is_i64() && args["b"].is_i64(), "{args}");
    let v = run_json(&["--tool-choice", "none"]);
    assert!(v["tool_calls"].is_null() && !v["text"].as_str().unwrap().is_empty());
    let args = ask(&["--tool-choice", "launch"], false);
    let out = airs(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a tool"));
}

#[test]
fn chat_on_qwen_answers_with_the_reference_tokens() {
    let reference = Reference::load("qwen2.5-coder-0.5b-q4km.chat-prime.kvf16");
    let v = json_of(&[
        "run",
        "--model",
        path_str(&qwen_path()),
        "--chat",
        "Write a Python function that checks whether a number is prime.",
        "--system",
        "You are a helpful assistant.",
        "-n",
        "16",
        "--json",
    ]);
    let prompt: Vec<u32> = v["prompt_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(prompt, reference.prompt_token_ids);
    let ids: Vec<u32> = v["generated_token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, reference.greedy_token_ids[..16]);
}

#[test]
fn errors_are_one_line_and_exit_non_zero() {
    for args in [
        vec!["inspect", "/nonexistent/model.gguf"],
        vec![
            "inspect",
            path_str(&stories_path().with_extension("missing")),
        ],
        vec!["tokenize", "/etc/hostname", "x"],
        vec!["run", "--model", "/etc/hostname"],
    ] {
        let out = airs(&args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("airs: error: "), "{stderr}");
    }
}

#[test]
fn run_charges_weights_kv_and_scratch_to_the_model_pool_and_refuses_what_does_not_fit() {
    let v = json_of(&["run", "-n", "8", "--model-pool", "64M", "--json"]);
    let mp = &v["memory"]["model_pool"];
    let field = |k: &str| mp[k].as_u64().unwrap();
    assert_eq!(field("capacity_bytes"), 64 << 20);
    let weights = std::fs::metadata(stories_path()).unwrap().len();
    assert_eq!(field("weights_bytes"), weights);
    assert_eq!(
        field("kv_cache_bytes"),
        v["memory"]["kv_pool"]["pool_bytes"].as_u64().unwrap()
    );
    assert!(field("scratch_bytes") > 0);
    assert_eq!(
        field("free_bytes"),
        (64 << 20) - weights - field("kv_cache_bytes") - field("scratch_bytes")
    );

    // Weights fit, scratch and KV cache do not: refused before generating, naming the holders.
    let out = airs(&["run", "-n", "8", "--model-pool", "1200K"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("the model pool (1.2 MiB) cannot hold"),
        "{stderr}"
    );
    assert!(
        stderr.contains("weights stories260K.gguf (embedded)"),
        "{stderr}"
    );

    // A device without a model pool runs nothing locally.
    let out = airs(&["run", "--device-ram", "2G"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no model pool"), "{stderr}");
}

/// `airs perplexity --kld-ref --json` on Qwen against llama.cpp's distributions (one chunk of
/// the design text): the KL statistics, and every position where the top tokens differ with how
/// sure the reference was — consistent with the agreement figure, and near-ties only.
#[test]
fn perplexity_lists_where_the_top_token_differs_from_the_reference() {
    let text = airs_testdata::repo_path("testdata/text/model-memory.md");
    let reference = airs_testdata::repo_path(
        "testdata/reference/qwen2.5-coder-0.5b-q4km.kld-design.kvf16.json",
    );
    let v = json_of(&[
        "perplexity",
        "--model",
        path_str(&qwen_path()),
        path_str(&text),
        "--kld-ref",
        path_str(&reference),
        "--chunks",
        "1",
        "--json",
    ]);
    let positions = v["positions"].as_u64().unwrap();
    assert_eq!(positions, 255, "{v}");
    assert!(v["kld"]["mean"].as_f64().unwrap() < 0.002, "{v}");
    let list = v["top1_disagreements"].as_array().unwrap();
    let agreement = v["top1_agreement"].as_f64().unwrap();
    assert_eq!(
        list.len() as f64,
        ((1.0 - agreement) * positions as f64).round(),
        "{v}"
    );
    let mut max_margin = 0.0f64;
    for d in list {
        let at = d["position"].as_u64().unwrap();
        assert!((256..511).contains(&at), "{d}");
        assert_ne!(d["reference_top"], d["airs_top"]);
        let margin = d["reference_margin"].as_f64().unwrap();
        assert!(margin >= 0.0, "{d}");
        max_margin = max_margin.max(margin);
    }
    assert_eq!(v["top1_max_disagreement_margin"].as_f64(), Some(max_margin));
    assert!(max_margin <= 0.3, "{v}");
}

/// `airs perplexity` on the embedded model: llama-perplexity's chunks and scored positions in
/// JSON; a reference made for another model is refused in one line naming what differs.
#[test]
fn perplexity_reports_chunks_and_refuses_a_reference_of_another_model() {
    let text = airs_testdata::repo_path("testdata/text/model-memory.md");
    let v = json_of(&[
        "perplexity",
        path_str(&text),
        "--ctx",
        "128",
        "--chunks",
        "2",
        "--json",
    ]);
    assert_eq!(v["model"], "stories260K.gguf (embedded)");
    assert_eq!(
        (v["chunks"].as_u64(), v["positions"].as_u64()),
        (Some(2), Some(2 * 63))
    );
    let ppl = v["perplexity"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{v}");
    assert!(v["tokens_per_s"].as_f64().unwrap() > 0.0 && v.get("kld").is_none());
    let qwen_ref = airs_testdata::repo_path(
        "testdata/reference/qwen2.5-coder-0.5b-q4km.kld-design.kvf16.json",
    );
    let out = airs(&[
        "perplexity",
        path_str(&text),
        "--kld-ref",
        path_str(&qwen_ref),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("vocabulary of 151936 tokens; the model has 512"),
        "{stderr}"
    );
}

#[test]
fn bench_batch_serves_batched_requests_as_alone_and_weighs_them_against_the_dot_peak() {
    let v = json_of(&[
        "bench",
        "batch",
        "--sessions",
        "1,3",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "6",
        "--probe-background",
        "0",
        "--probe-dot-ms",
        "2",
        "--threads",
        "2",
        "--placement",
        "--json",
    ]);
    assert_eq!(v["identical_to_alone"], true);
    // stories260K: 5 layers of q, o (64×64), k, v (32×64), gate, up (172×64), down (64×172),
    // and the output projection (512×64).
    let macs = 5 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 172 * 64) + 512 * 64;
    assert_eq!(v["matmul_macs_per_token"], macs);
    let peaks: Vec<f64> = v["int8_dot_peak_macs_per_s"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert!(
        peaks.len() == 2 && peaks.iter().all(|&p| p > 1e6),
        "{peaks:?}"
    );
    let peak = peaks[0].max(peaks[1]);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(
        runs.iter()
            .map(|r| r["sessions"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1, 3]
    );
    // `--placement`: every run's read path, and the medians within a placement divided by one
    // session's under the same placement.
    let one_session = &runs[0]["placement"]["by_read_path"];
    for r in runs {
        let placement = &r["placement"];
        let paths = placement["read_paths"].as_array().unwrap();
        assert_eq!(paths.len(), 1, "one repetition, one run: {placement}");
        let path = paths[0].as_str().unwrap();
        assert!(["own", "shared", "between"].contains(&path), "{placement}");
        let by_path = placement["by_read_path"].as_object().unwrap();
        let rate = r["aggregate_decode_tokens_per_s"].as_f64().unwrap();
        if path == "between" {
            assert!(
                by_path.is_empty(),
                "a moved run is in no placement: {placement}"
            );
            continue;
        }
        assert_eq!(by_path.len(), 1, "{placement}");
        let within = &by_path[path];
        assert_eq!(within["runs"], 1);
        assert_eq!(within["aggregate_decode_tokens_per_s"].as_f64(), Some(rate));
        // (JSON's decimal floats parse back within an ulp or two.)
        match one_session[path]["aggregate_decode_tokens_per_s"].as_f64() {
            Some(one) => {
                let speedup = within["speedup_vs_one_session"].as_f64().unwrap();
                assert!((speedup * one / rate - 1.0).abs() < 1e-9, "{placement}");
            }
            None => assert!(within["speedup_vs_one_session"].is_null()),
        }
    }
    for r in runs {
        assert_eq!(r["identical_to_alone"], true);
        let tokens_per_s = r["aggregate_decode_tokens_per_s"].as_f64().unwrap();
        let macs_per_s = r["matmul_macs_per_s"].as_f64().unwrap();
        assert!((macs_per_s / (tokens_per_s * macs as f64) - 1.0).abs() < 1e-9);
        let fraction = r["fraction_of_dot_peak"].as_f64().unwrap();
        assert!((fraction * peak / macs_per_s - 1.0).abs() < 1e-9);
    }
}

#[test]
fn a_session_with_tools_prints_its_calls_and_takes_their_results() {
    // `airs session --tools`: the first turn sets the session's tools and prints Qwen's call;
    // the next process sends only the result (`--tool-result`), and the history holds both
    // as they were. A session without tools takes no results.
    let tools = airs_testdata::repo_path("testdata/tools/weather-and-add.json");
    let qwen = qwen_path();
    let dir = std::env::temp_dir().join(format!("airs-cli-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("sessions.db");
    let session = |extra: &[&str]| {
        let mut args = vec![
            "session",
            "--db",
            path_str(&db),
            "--model",
            path_str(&qwen),
            "--sync",
            "normal",
            "-n",
            "64",
        ];
        args.extend_from_slice(extra);
        airs(&args)
    };
    let out = session(&[
        "--session",
        "agent",
        "--tools",
        path_str(&tools),
        "What's the weather like in Paris today?",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        r#"{"tool_call":{"arguments":{"city":"Paris"},"name":"get_weather"}}"#
    );
    let result = r#"{"temperature_c": 22, "sky": "sunny"}"#;
    let out = session(&[
        "--session",
        "agent",
        "--tools",
        path_str(&tools),
        "--tool-result",
        result,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reply: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reply["turn"], 1);
    assert!(reply["prompt_tokens"].as_u64().unwrap() < 40, "{reply}");
    let shown: Value =
        serde_json::from_slice(&session(&["--session", "agent", "--show", "--json"]).stdout)
            .unwrap();
    let roles: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(shown[2]["content"], result);
    let out = session(&["--session", "plain", "--tool-result", result]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no tools"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_host_reports_one_thread_and_all_threads_and_their_ratios() {
    let v = json_of(&[
        "bench",
        "host",
        "--threads",
        "2",
        "--pass-ms",
        "2",
        "--read-mib",
        "8",
        "--passes",
        "2",
        "--json",
    ]);
    assert_eq!(v["threads"], 2);
    let rate = |group: &str, key: &str| v[group][key].as_f64().unwrap();
    let (dot_one, dot_all) = (
        rate("int8_dot_macs_per_s", "one_thread"),
        rate("int8_dot_macs_per_s", "all_threads"),
    );
    let (read_one, read_all) = (
        rate("read_bytes_per_s", "one_thread"),
        rate("read_bytes_per_s", "all_threads"),
    );
    assert!(
        [dot_one, dot_all, read_one, read_all]
            .iter()
            .all(|&r| r > 1e6),
        "{v}"
    );
    // The ratios are the figures' (what the host gives is not the test's to assert).
    assert!((v["dot_cores"].as_f64().unwrap() * dot_one / dot_all - 1.0).abs() < 1e-9);
    assert!((v["read_scaling"].as_f64().unwrap() * read_one / read_all - 1.0).abs() < 1e-9);
    for (class, ratio) in [("multipliers", "dot_cores"), ("read_path", "read_scaling")] {
        let ratio = v[ratio].as_f64().unwrap();
        let expected = if ratio >= 1.5 {
            "own"
        } else if ratio < 1.3 {
            "shared"
        } else {
            "between"
        };
        assert_eq!(v[class], expected, "{v}");
    }
    let round_trip = v["cache_line_round_trip_ns"].as_f64().unwrap();
    assert!(round_trip > 0.0 && round_trip < 1e8, "{v}");
    let one = json_of(&[
        "bench",
        "host",
        "--threads",
        "1",
        "--pass-ms",
        "2",
        "--read-mib",
        "8",
        "--passes",
        "1",
        "--json",
    ]);
    assert!(one["cache_line_round_trip_ns"].is_null(), "{one}");
    let out = airs(&["bench", "host", "--passes", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--passes"));
}

/// `airs bench decode --json` of `gen_tokens` after 8 prompt tokens on 2 threads, `reps` times,
/// with `extra` arguments.
fn bench_decode_json(gen_tokens: &str, reps: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "decode",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        gen_tokens,
        "--reps",
        reps,
        "--threads",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    json_of(&args)
}

#[test]
fn bench_decode_reports_decode_per_placement_against_the_read_probe_around_it() {
    let v = bench_decode_json("8", "3", &["--probe-mib", "8", "--placement"]);
    let decode: Vec<f64> = v["decode_tokens_per_s_all"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_f64().unwrap())
        .collect();
    assert_eq!(decode.len(), 3);
    assert!(decode.iter().all(|&r| r > 0.0), "{v}");
    let bytes_per_token = v["weight_bytes_per_token"].as_f64().unwrap();
    let paths: Vec<&str> = v["placement"]["read_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 3, "{v}");
    assert!(
        paths.iter().all(|p| ["own", "shared", "moved"].contains(p)),
        "{v}"
    );
    // Each placement's figures are its repetitions' (what the host gives is not the test's to
    // assert): as many runs as repetitions under it, and the weight bandwidth of its median.
    let by_path = v["placement"]["by_read_path"].as_object().unwrap();
    for (path, r) in by_path {
        let runs = r["runs"].as_u64().unwrap() as usize;
        assert_eq!(runs, paths.iter().filter(|p| *p == path).count(), "{v}");
        let tps = r["decode_tokens_per_s"].as_f64().unwrap();
        let gbps = r["decode_weight_gb_per_s"].as_f64().unwrap();
        assert!(
            (gbps * 1e9 / (bytes_per_token * tps) - 1.0).abs() < 1e-9,
            "{v}"
        );
        let (probe, fraction) = (
            r["read_probe_gb_per_s"].as_f64().unwrap(),
            r["decode_fraction_of_probe"].as_f64().unwrap(),
        );
        assert!(probe > 0.0 && fraction > 0.0, "{v}");
        if runs == 1 {
            assert!((fraction * probe / gbps - 1.0).abs() < 1e-9, "{v}");
        }
    }
    let placed = paths.iter().filter(|p| **p != "moved").count();
    assert_eq!(
        by_path
            .values()
            .map(|r| r["runs"].as_u64().unwrap() as usize)
            .sum::<usize>(),
        placed
    );
    let out = airs(&["bench", "decode", "--placement", "--probe-mib", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--probe-mib"));
}

#[test]
fn bench_decode_weighs_each_step_against_the_read_probe_passes_around_it() {
    let v = bench_decode_json("20", "2", &["--probe-mib", "8", "--probe-steps"]);
    let s = &v["probe_steps"];
    // 19 decode steps a repetition (the first token ends the prefill).
    assert_eq!(s["steps"].as_u64(), Some(2 * 19), "{v}");
    assert_eq!(s["probe_mib"].as_u64(), Some(8), "{v}");
    let f = |key: &str| s[key].as_f64().unwrap();
    assert!(f("read_probe_gb_per_s_median") > 0.0, "{v}");
    assert!(
        0.0 < f("decode_fraction_p10")
            && f("decode_fraction_p10") <= f("decode_fraction_median")
            && f("decode_fraction_median") <= f("decode_fraction_p90"),
        "{v}"
    );
    // Each repetition's decode rate (its steps' own time).
    let decode: Vec<f64> = v["decode_tokens_per_s_all"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_f64().unwrap())
        .collect();
    assert_eq!(decode.len(), 2, "{v}");
    assert!(decode.iter().all(|&r| r > 0.0), "{v}");
    let out = airs(&["bench", "decode", "--probe-steps", "--probe-mib", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--probe-mib"));
    let out = airs(&["bench", "decode", "--probe-steps", "--alternate-kv-pages"]);
    assert!(!out.status.success());
}

/// Steps of each setting (A, B) in one window of an `alternation` report.
fn window_steps(window: &Value) -> Vec<u64> {
    window["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_u64().unwrap())
        .collect()
}

#[test]
fn bench_decode_alternates_two_chunk_counts_step_by_step_and_reports_windows() {
    // 300 tokens: a window of 256 decode steps and one of the request's last 43.
    let v = bench_decode_json(
        "300",
        "1",
        &["--probe-mib", "0", "--alternate-chunks", "1,4"],
    );
    let alt = &v["alternation"];
    assert_eq!(
        (alt["a"].as_u64(), alt["b"].as_u64()),
        (Some(1), Some(4)),
        "{v}"
    );
    let windows = alt["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 2, "{v}");
    assert_eq!(window_steps(&windows[0]), [128, 128], "{v}");
    // 299 decode steps in all (the first token ends the prefill).
    assert_eq!(
        window_steps(&windows[1]).iter().sum::<u64>(),
        299 - 256,
        "{v}"
    );
    for w in windows {
        let (a, b) = (
            w["a_ms_per_step"].as_f64().unwrap(),
            w["b_ms_per_step"].as_f64().unwrap(),
        );
        assert!(a > 0.0 && b > 0.0, "{v}");
        assert!(
            (w["b_over_a"].as_f64().unwrap() - b / a).abs() < 1e-9,
            "{v}"
        );
    }
    assert!(
        alt["b_over_a_median"].as_f64().is_some_and(|m| m > 0.0),
        "{v}"
    );
    let out = airs(&["bench", "decode", "--alternate-chunks", "2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("A,B"));
    let out = airs(&["bench", "decode", "--alternate-chunks", "0,2"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 1"));
}

#[test]
fn bench_decode_alternates_kv_pools_on_huge_and_base_pages_with_identical_tokens() {
    // 300 tokens on each pool: 299 decode steps each, alternated in windows of 256 steps.
    let v = bench_decode_json("300", "1", &["--alternate-kv-pages"]);
    assert_eq!(v["identical"].as_bool(), Some(true), "{v}");
    let alt = &v["alternation"];
    assert_eq!(
        (alt["a"].as_u64(), alt["b"].as_u64()),
        (Some(1), Some(0)),
        "{v}"
    );
    let windows = alt["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 3, "{v}");
    assert_eq!(window_steps(&windows[0]), [128, 128], "{v}");
    assert_eq!(window_steps(&windows[1]), [128, 128], "{v}");
    // The loop ends when the next pool to step has finished: the other is one step short.
    let last: u64 = window_steps(&windows[2]).iter().sum();
    assert!((2 * 299 - 512 - 1..=2 * 299 - 512).contains(&last), "{v}");
    assert!(
        alt["b_over_a_median"].as_f64().is_some_and(|m| m > 0.0),
        "{v}"
    );
    let out = airs(&[
        "bench",
        "decode",
        "--alternate-kv-pages",
        "--alternate-chunks",
        "1,2",
    ]);
    assert!(!out.status.success());
}

#[test]
fn bench_batch_alternates_chunk_counts_over_the_steps_that_decode_every_session() {
    let v = json_of(&[
        "bench",
        "batch",
        "--sessions",
        "2",
        "--prompt-tokens",
        "8",
        "--gen-tokens",
        "300",
        "--probe-background",
        "0",
        "--probe-dot-ms",
        "0",
        "--no-compare",
        "--alternate-chunks",
        "8,2",
        "--json",
    ]);
    let alt = &v["runs"][0]["alternation"];
    assert_eq!(
        (alt["a"].as_u64(), alt["b"].as_u64()),
        (Some(8), Some(2)),
        "{v}"
    );
    let windows = alt["windows"].as_array().unwrap();
    let steps: Vec<u64> = windows.iter().flat_map(window_steps).collect();
    // The step that prefills both prompts is not compared; the 299 that decode both are.
    assert_eq!(steps.iter().sum::<u64>(), 299, "{v}");
    assert_eq!(&steps[..2], [128, 128], "{v}");
    assert!(
        windows
            .iter()
            .all(|w| w["b_over_a"].as_f64().is_some_and(|r| r > 0.0)),
        "{v}"
    );
}
