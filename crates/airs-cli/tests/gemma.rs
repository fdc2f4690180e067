//! `airs` on Gemma 3 270M (Q4_K_M, installed at test time): inspect shows the architecture's
//! parts, and `airs run --chat` (the file has no chat template: the Gemma fallback renders
//! `<start_of_turn>` turns) gives ik_llama.cpp's greedy reply to the same prompt.
//!
//! This file is the pretrained model, not the instruction-tuned one: its "reply" to a chat
//! turn repeats the question, so the reply is held to the reference implementation rather
//! than to a judgement of coherence. The reference is ik_llama.cpp 8337e4cd's greedy
//! continuation (special tokens parsed, 2 threads, f16 KV; a 40-line program outside the
//! repository, like `shared/tools/dump_topk.cpp`, that prints each step's token, its logit
//! margin over the runner-up, and the runner-up). As for the Qwen greedy references
//! (testdata/reference/README.md), ids are compared up to the first step where the
//! reference's margin is below the near-tie margin 0.3 — there summation order decides — and
//! at that step airs's token must be one of the reference's two best.

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
    let generated = ids("generated_token_ids");
    assert_eq!(generated.len(), IK_GREEDY.len());
    let near_tie = IK_GREEDY
        .iter()
        .position(|&(_, margin, _)| margin < NEAR_TIE)
        .unwrap_or(IK_GREEDY.len());
    let expected: Vec<u64> = IK_GREEDY[..near_tie].iter().map(|s| s.0).collect();
    assert_eq!(
        generated[..near_tie],
        expected,
        "greedy ids before the first near-tie"
    );
    if let Some(&(best, _, second)) = IK_GREEDY.get(near_tie) {
        assert!(
            [best, second].contains(&generated[near_tie]),
            "step {near_tie}: {} is neither of the reference's two best",
            generated[near_tie]
        );
    }
}

/// Logit margin below which summation order decides a greedy step (as for Qwen).
const NEAR_TIE: f32 = 0.3;

/// ik_llama.cpp's 30 greedy steps: (token, top-1 minus top-2 logit, runner-up). Step 12 is a
/// near-tie (0.013): the first 12 tokens are held exactly.
const IK_GREEDY: [(u64, f32, u64); 30] = [
    (3689, 2.1820, 818),
    (563, 2.4287, 659),
    (506, 3.4125, 496),
    (5279, 2.1591, 1463),
    (529, 3.8903, 3207),
    (7001, 1.3142, 506),
    (236881, 3.9424, 528),
    (25685, 2.7022, 107),
    (528, 5.0507, 506),
    (886, 4.9519, 236743),
    (13315, 5.5997, 107),
    (236761, 4.9858, 107),
    (121536, 0.0133, 107),
    (107, 3.9063, 108),
    (106094, 0.0862, 3689),
    (107, 0.8409, 573),
    (3689, 2.6550, 14070),
    (563, 2.9274, 659),
    (506, 4.5595, 496),
    (5279, 3.9135, 1463),
    (529, 5.9298, 3207),
    (7001, 3.4624, 7591),
    (236881, 6.0827, 528),
    (25685, 3.3974, 107),
    (528, 6.8474, 495),
    (886, 6.7827, 236743),
    (13315, 6.7411, 107),
    (236761, 4.7777, 107),
    (121536, 0.3241, 13888),
    (107, 2.0485, 13888),
];

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
