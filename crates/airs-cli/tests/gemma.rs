//! `airs` on Gemma 3 270M (Q4_K_M, installed at test time): inspect shows the architecture's
//! parts, and `airs run --chat` (the file has no chat template: the Gemma fallback renders
//! `<start_of_turn>` turns) gives exactly ik_llama.cpp's greedy reply to the same prompt.
//!
//! This file is the pretrained model, not the instruction-tuned one: its "reply" to a chat
//! turn repeats the question, and ik_llama.cpp 8337e4cd (greedy, special tokens parsed, 2
//! threads; the program is described in testdata/reference/README.md) produces the same 30
//! tokens, so the reply is held to the reference implementation rather than to a judgement of
//! coherence.

use std::process::Command;

use serde_json::Value;

fn airs(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_airs"))
        .args(args)
        .output()
        .expect("running airs");
    assert!(
        out.status.success(),
        "airs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

#[test]
fn gemma_chat_reply_equals_ik_llama_cpp_greedy() {
    let model = airs_testdata::gemma_path();
    let model = model.to_str().unwrap();
    let v = airs(&[
        "run",
        "--model",
        model,
        "--chat",
        "What is the capital of France? Answer in one sentence.",
        "-n",
        "30",
        "--json",
    ]);
    let ids = |key: &str| -> Vec<u64> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    // ik_llama.cpp's tokenization of "<start_of_turn>user\n{question}<end_of_turn>\n
    // <start_of_turn>model\n" with BOS.
    assert_eq!(
        ids("prompt_token_ids"),
        [
            2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 25685, 528, 886, 13315,
            236761, 106, 107, 105, 4368, 107
        ]
    );
    assert_eq!(
        ids("generated_token_ids"),
        [
            3689, 563, 506, 5279, 529, 7001, 236881, 25685, 528, 886, 13315, 236761, 121536, 107,
            106094, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 25685, 528, 886, 13315, 236761,
            121536, 107
        ]
    );
}

#[test]
fn inspect_names_gemma3_parts() {
    let model = airs_testdata::gemma_path();
    let v = airs(&["inspect", "--json", model.to_str().unwrap()]);
    let h = &v["hyperparameters"];
    assert_eq!(h["architecture"], "gemma3");
    assert_eq!(h["sliding_window"]["window"], 512);
    assert_eq!(h["sliding_window"]["local_layers"], 15);
    assert_eq!(h["ffn_activation"], "gelutanh");
    assert_eq!(h["qk_norm"], true);
    assert_eq!(h["post_norms"], true);
    assert_eq!(h["attention_scale"], 0.0625);
    assert_eq!(h["tied_output"], true);
}
