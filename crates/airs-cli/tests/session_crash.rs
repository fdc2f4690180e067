//! `airs session --script`, killed with SIGKILL in the middle of a conversation, loses no
//! acknowledged turn (every `ack` line it printed is in the database, reply for reply), and a
//! rerun of the same script continues the conversation exactly as an uninterrupted run does.
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SCRIPT: &str = "Once upon a time there was a little girl named Lily.
She liked to play in the garden.
One day she found a big red ball.
What did she do with the ball?
Then her friend Tom came.
How did the day end?
";

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airs-cli-session-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("script.txt"), SCRIPT).unwrap();
    dir
}

fn airs(dir: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_airs"));
    c.arg("session")
        .arg("--db")
        .arg(dir.join("history.db"))
        .arg("--model")
        .arg(airs_testdata::stories_path())
        .args([
            "--session",
            "story",
            "--system",
            "You tell stories.",
            "-n",
            "24",
            "--temperature",
            "0.8",
            "--seed",
            "11",
            "--pool",
            "1M",
            "--threads",
            "1",
        ])
        .args(extra);
    c
}

fn run_script(dir: &Path) {
    let script = dir.join("script.txt");
    let out = airs(dir, &["--script", script.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn history(dir: &Path) -> serde_json::Value {
    let out = airs(dir, &["--show", "--json"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn sigkill_mid_conversation_loses_no_acknowledged_turn() {
    let reference = temp_dir("reference");
    run_script(&reference);
    let want = history(&reference);
    assert_eq!(
        want.as_array().unwrap().len(),
        1 + 2 * 6,
        "system + six turns"
    );

    for (kill_after, delay_us) in [(1usize, 0u64), (3, 2_000)] {
        let dir = temp_dir(&format!("kill{kill_after}"));
        let script = dir.join("script.txt");
        let mut child = airs(&dir, &["--script", script.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = Vec::new();
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            let Some(rest) = line.strip_prefix("ack ") else {
                continue;
            };
            let (_, json) = rest.split_once(' ').unwrap();
            acked.push(serde_json::from_str::<serde_json::Value>(json).unwrap());
            if acked.len() == kill_after {
                std::thread::sleep(std::time::Duration::from_micros(delay_us));
                child.kill().unwrap(); // SIGKILL
                break;
            }
        }
        assert!(!child.wait().unwrap().success());
        let got = history(&dir);
        let msgs = got.as_array().unwrap();
        for a in &acked {
            let turn = a["turn"].as_u64().unwrap() as usize;
            let reply = &msgs[2 + 2 * turn];
            assert_eq!(reply["role"], "assistant");
            assert_eq!(reply["tokens"], a["tokens"], "acknowledged turn {turn}");
            assert_eq!(reply["content"], a["text"]);
        }
        run_script(&dir);
        assert_eq!(history(&dir), want, "kill after {kill_after}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&reference);
}

#[test]
fn one_turn_at_a_time_prints_the_committed_reply() {
    let dir = temp_dir("single");
    let first = airs(&dir, &["--priority", "background", "Hello there."])
        .output()
        .unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let second = airs(&dir, &["--json", "Tell me more."]).output().unwrap();
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let reply: serde_json::Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(reply["turn"], 1);
    // A new process: the session's cache was rebuilt from the history first.
    assert!(reply["rebuild"]["recomputed_tokens"].as_u64().unwrap() > 0);
    let h = history(&dir);
    let text = String::from_utf8_lossy(&first.stdout);
    assert_eq!(
        h[2]["content"].as_str().unwrap(),
        text.strip_suffix('\n').unwrap()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_kv_pool_the_model_pool_cannot_hold_fails_and_leaves_no_trace() {
    let dir = temp_dir("pool");
    // 4 MiB hold the weights (1.1 MiB) and the scratch, not a 1 MiB KV pool beside them.
    let out = airs(&dir, &["--model-pool", "4M", "Hello there."])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot hold"), "{stderr}");
    assert!(stderr.contains("weights"), "{stderr}");
    assert!(out.stdout.is_empty());
    // With room for all three, the same turn is served and committed; the failed attempt left
    // no trace in the history (system, user, assistant: three messages).
    let ok = airs(&dir, &["--model-pool", "16M", "Hello there."])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(history(&dir).as_array().unwrap().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
