//! Histories survive the process: a conversation continued by a new scheduler over the same
//! database — after a clean exit, or after the process was killed with SIGKILL in the middle of
//! the conversation — loses no acknowledged message and continues exactly as an uninterrupted
//! one does (greedy and seeded sampling alike).
//!
//! The kill test runs this test binary itself as the child (`crash_child_process`, which does
//! nothing unless `AIRS_RUNTIME_CRASH_DB` is set): it serves a scripted conversation, printing
//! `ACK <turn> <token ids>` after each turn is committed, and the parent kills it after a few
//! acknowledgements.
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use std::sync::Arc;

use airs_engine::SamplerConfig;
use airs_memory::PinPolicy;
use airs_runtime::{
    Durability, GenerationParams, HistoryStore, LoadedModel, Request, Role, RuntimeErrorKind,
    Scheduler, SchedulerConfig, SessionTurn,
};

const TURNS: [&str; 6] = [
    "Once upon a time there was a little girl named Lily.",
    "She liked to play in the garden.",
    "One day she found a big red ball.",
    "What did she do with the ball?",
    "Then her friend Tom came.",
    "How did the day end?",
];
const MAX_TOKENS: usize = 24;

/// One turn of session "story", seeded sampling, served to completion; the reply's ids.
fn say(s: &mut Scheduler, text: &str) -> Vec<u32> {
    let params = GenerationParams {
        max_tokens: MAX_TOKENS,
        sampler: SamplerConfig {
            temperature: 0.8,
            seed: 11,
            ..SamplerConfig::default()
        },
        ..GenerationParams::default()
    };
    let mut request = Request::turn("story", text, params);
    request.session = Some(SessionTurn {
        name: "story".into(),
        system: Some("You tell stories.".into()),
    });
    s.serve(request).unwrap().first().tokens.clone()
}

fn scheduler_over(store: HistoryStore) -> Scheduler {
    let m = Arc::new(LoadedModel::open(&airs_testdata::stories_path(), 1).unwrap());
    let mut c = SchedulerConfig::new(1 << 20);
    c.pin = PinPolicy::None;
    Scheduler::new(m, c, Some(store)).unwrap()
}

fn temp_db(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("airs-runtime-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("history.db")
}

/// This test binary run as a child process: only the test `name`, which does its work when
/// the variable `db_var` names its database; its stdout piped.
fn spawn_child(name: &str, db_var: &str, db: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(db_var, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// The replies of the whole script served by one scheduler in memory.
fn reference() -> Vec<Vec<u32>> {
    let mut s = scheduler_over(HistoryStore::open_in_memory().unwrap());
    TURNS.iter().map(|t| say(&mut s, t)).collect()
}

/// Serve the turns of the script not yet in the database, calling `ack` after each commit.
fn continue_script(db: &Path, mut ack: impl FnMut(usize, &[u32])) -> Vec<Vec<u32>> {
    let done = replies_in(db).len();
    let store = HistoryStore::open(db, Durability::Full).unwrap();
    let mut s = scheduler_over(store);
    for (i, t) in TURNS.iter().enumerate().skip(done) {
        let tokens = say(&mut s, t);
        ack(i, &tokens);
    }
    replies_in(db)
}

/// The reply token ids committed in the database.
fn replies_in(db: &Path) -> Vec<Vec<u32>> {
    let store = HistoryStore::open(db, Durability::Full).unwrap();
    let Some(s) = store.find_session("story").unwrap() else {
        return Vec::new();
    };
    let msgs = store.load_messages(s.id).unwrap();
    let users: Vec<&str> = msgs
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect();
    assert_eq!(
        users,
        TURNS[..users.len()],
        "user messages committed in order"
    );
    msgs.into_iter()
        .filter(|m| m.role == Role::Assistant)
        .map(|m| m.tokens)
        .collect()
}

#[test]
fn a_new_process_continues_the_conversation_identically() {
    let want = reference();
    let db = temp_db("reopen");
    // Three turns, then a "restart" (a new scheduler, model and connection), then the rest.
    {
        let store = HistoryStore::open(&db, Durability::Full).unwrap();
        let mut s = scheduler_over(store);
        for t in &TURNS[..3] {
            say(&mut s, t);
        }
    }
    assert_eq!(replies_in(&db), want[..3]);
    let got = continue_script(&db, |_, _| {});
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

/// The child: runs only when spawned by `sigkill_mid_conversation_loses_no_acknowledged_turn`.
#[test]
fn crash_child_process() {
    let Some(db) = std::env::var_os("AIRS_RUNTIME_CRASH_DB") else {
        return;
    };
    continue_script(Path::new(&db), |turn, tokens| {
        println!("ACK {turn} {tokens:?}");
    });
}

#[test]
fn sigkill_mid_conversation_loses_no_acknowledged_turn() {
    let want = reference();
    // Kill right after an acknowledgement, and a little later (mid-generation or mid-commit).
    for (kill_after, delay_us) in [(1usize, 0u64), (2, 1_000), (3, 3_000)] {
        let db = temp_db(&format!("kill{kill_after}"));
        let mut child = spawn_child("crash_child_process", "AIRS_RUNTIME_CRASH_DB", &db);
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut acked: Vec<(usize, String)> = Vec::new();
        for line in stdout.lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("ACK ") {
                let (turn, tokens) = rest.split_once(' ').unwrap();
                acked.push((turn.parse().unwrap(), tokens.to_string()));
                if acked.len() == kill_after {
                    std::thread::sleep(std::time::Duration::from_micros(delay_us));
                    child.kill().unwrap(); // SIGKILL, mid-conversation
                    break;
                }
            }
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "the child was killed");
        let committed = replies_in(&db);
        assert!(
            committed.len() >= kill_after,
            "an acknowledged turn was lost"
        );
        for (turn, tokens) in &acked {
            assert_eq!(
                &format!("{:?}", committed[*turn]),
                tokens,
                "acknowledged reply {turn}"
            );
        }
        // Restart: the rest of the conversation is served as if nothing happened.
        let got = continue_script(&db, |_, _| {});
        assert_eq!(got, want, "kill after {kill_after}");
        let _ = std::fs::remove_dir_all(db.parent().unwrap());
    }
}

/// The child: runs only when spawned by `one_process_writes_a_session_database`; holds the
/// database open to write until killed.
#[test]
fn writer_child_process() {
    let Some(db) = std::env::var_os("AIRS_RUNTIME_WRITER_DB") else {
        return;
    };
    let _store = HistoryStore::open(Path::new(&db), Durability::Full).unwrap();
    println!("WRITING");
    std::thread::sleep(std::time::Duration::from_secs(120));
}

/// While one process writes to a session database, another cannot open it to write (it would
/// interleave turns of the same sessions), but can read it; stores of one process share the
/// lock; a killed writer leaves no lock behind.
#[test]
fn one_process_writes_a_session_database() {
    let db = temp_db("writer");
    {
        // This process's stores of one database share its writer lock.
        let a = HistoryStore::open(&db, Durability::Full).unwrap();
        let b = HistoryStore::open(&db, Durability::Full).unwrap();
        drop((a, b));
    }
    let mut child = spawn_child("writer_child_process", "AIRS_RUNTIME_WRITER_DB", &db);
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("WRITING") {
        line.clear();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "the child ended");
    }
    let refused = HistoryStore::open(&db, Durability::Full).unwrap_err();
    assert!(
        matches!(refused.kind(), RuntimeErrorKind::StoreInUse(_)),
        "{refused}"
    );
    // Also through another spelling of the same file.
    let link = db.with_file_name("link.db");
    std::os::unix::fs::symlink(&db, &link).unwrap();
    let refused = HistoryStore::open(&link, Durability::Full).unwrap_err();
    assert!(
        matches!(refused.kind(), RuntimeErrorKind::StoreInUse(_)),
        "{refused}"
    );
    let reader = HistoryStore::open_reader(&db).unwrap();
    assert_eq!(reader.find_session("story").unwrap().map(|s| s.id), None);
    child.kill().unwrap();
    child.wait().unwrap();
    HistoryStore::open(&db, Durability::Full).expect("the killed writer's lock is gone");
    let _ = std::fs::remove_dir_all(db.parent().unwrap());
}

#[test]
fn a_version_1_database_is_upgraded_and_its_sessions_continue() {
    // Version 1 had no `tools` column: a database written by it (made here by writing two
    // turns and taking the column away) is upgraded on open, and its session continues as
    // an uninterrupted one.
    let want = reference();
    let db = temp_db("v1");
    {
        let mut s = scheduler_over(HistoryStore::open(&db, Durability::Normal).unwrap());
        for t in &TURNS[..2] {
            say(&mut s, t);
        }
    }
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "ALTER TABLE sessions DROP COLUMN tools;
             UPDATE meta SET value = 1 WHERE key = 'schema_version';",
        )
        .unwrap();
    }
    let mut s = scheduler_over(HistoryStore::open(&db, Durability::Normal).unwrap());
    let got: Vec<Vec<u32>> = TURNS[2..].iter().map(|t| say(&mut s, t)).collect();
    assert_eq!(got, want[2..]);
    drop(s);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: i64 = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, 2);
    let tools: Option<String> = conn
        .query_row("SELECT tools FROM sessions WHERE name = 'story'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(tools, None);
}
