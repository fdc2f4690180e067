//! `airs serve` as a client sees it: a real server process on a loopback port, driven by the
//! official `openai` Python client (tests/serve/openai_suite.py, in a pinned virtual
//! environment installed on first use), raw HTTP, a second server as the remote endpoint, and
//! Debian's headless Chromium for the pool page. Crashes and shutdowns use real signals.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

const KEY: &str = "test-key-123";

/// The tests run one at a time: each runs servers and clients that want both cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running `airs serve`.
struct Server {
    child: Child,
    addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Start `airs serve --port 0 <args>` and wait until `/health` says 200.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_airs"))
            .args(["serve", "--port", "0", "--threads", "2"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning airs serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                        let _ = tx.send(addr);
                    }
                    log.lock().unwrap().push_str(&line);
                    log.lock().unwrap().push('\n');
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("airs serve did not start: {}", log.lock().unwrap()));
        let s = Server { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(120);
        while s.get("/health").0 != 200 {
            assert!(Instant::now() < deadline, "never healthy: {}", s.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// GET `path` (with the test key): status and body.
    fn get(&self, path: &str) -> (u16, String) {
        http(&self.addr, "GET", path, None)
    }

    fn json(&self, path: &str) -> Value {
        let (status, body) = self.get(path);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn sigterm(&mut self) -> ExitStatus {
        // SAFETY: kill(2) with a valid pid and signal number has no memory-safety precondition.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(Instant::now() < deadline, "did not exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request over a fresh connection: status and body.
fn http(addr: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let body = body.unwrap_or("");
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if s.write_all(req.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1);
    // Chunked bodies (small JSON answers): join the chunks.
    let body = if out
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut joined = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            joined.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        joined
    } else {
        body.to_string()
    };
    (status, body)
}

fn suite() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve/openai_suite.py")
}

/// Run a scenario of the Python suite; its output (it must pass).
fn python(scenario: &str, server: &Server, args: &[&str]) -> String {
    let out = Command::new(airs_testdata::python_with_openai())
        .arg(suite())
        .args([scenario, "--base", &server.base()])
        .args(args)
        .output()
        .expect("running the openai suite");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "scenario {scenario} failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    stdout
}

fn qwen() -> String {
    airs_testdata::qwen_path().display().to_string()
}

fn qwen_id() -> String {
    airs_testdata::qwen_path()
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn stories() -> String {
    airs_testdata::stories_path().display().to_string()
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("airs-serve-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The messages of session `name` in `db`, as `airs session --show --json` prints them.
fn history(db: &Path, name: &str) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_airs"))
        .args(["session", "--db"])
        .arg(db)
        .args(["--model", &stories(), "--session", name, "--show", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn the_openai_client_gets_openai_answers_from_qwen() {
    let _serial = serial();
    let server = Server::start(&["--model", &qwen(), "--api-key", KEY, "--parallel", "4"]);
    python(
        "api",
        &server,
        &["--key", KEY, "--model", &qwen_id(), "--context", "32768"],
    );
}

#[test]
fn eight_clients_at_once_get_what_they_get_one_at_a_time_and_prefixes_are_shared() {
    let _serial = serial();
    let server = Server::start(&["--model", &qwen(), "--api-key", KEY, "--parallel", "8"]);
    python(
        "concurrency",
        &server,
        &["--key", KEY, "--model", &qwen_id()],
    );
    python("prefix", &server, &["--key", KEY, "--model", &qwen_id()]);
}

#[test]
fn a_client_that_disconnects_mid_stream_frees_its_blocks() {
    let _serial = serial();
    let server = Server::start(&["--model", &stories(), "--api-key", KEY]);
    python(
        "disconnect",
        &server,
        &["--key", KEY, "--model", "stories260K"],
    );
}

#[test]
fn a_bounded_load_gets_only_documented_statuses_and_memory_returns_to_idle() {
    let _serial = serial();
    let server = Server::start(&[
        "--model",
        &stories(),
        "--api-key",
        KEY,
        "--parallel",
        "4",
        "--queue",
        "6",
        "--kv-pool",
        "1M",
    ]);
    let out = python(
        "load",
        &server,
        &[
            "--key",
            KEY,
            "--model",
            "stories260K",
            "--clients",
            "16",
            "--requests",
            "25",
        ],
    );
    assert!(out.contains("PASS load"));
}

/// The suite's `session` scenario for session `name` on `server`: `turns` ("a|b|c"), replies of
/// up to `max_tokens`, the last one streamed if `stream_last`; stdout piped.
fn session_client(
    server: &Server,
    name: &str,
    turns: &str,
    max_tokens: &str,
    stream_last: bool,
) -> Child {
    let mut c = Command::new(airs_testdata::python_with_openai());
    c.arg(suite())
        .args([
            "session",
            "--base",
            &server.base(),
            "--key",
            KEY,
            "--model",
            "stories260K",
        ])
        .args([
            "--session",
            name,
            "--turns",
            turns,
            "--max-tokens",
            max_tokens,
        ]);
    if stream_last {
        c.arg("--stream-last");
    }
    c.stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Sends `turns` ("a|b|c") of session "story"; the ACKed reply texts.
fn session_turns(server: &Server, turns: &str, stream_last: bool) -> Vec<String> {
    let mut args = vec![
        "--key",
        KEY,
        "--model",
        "stories260K",
        "--session",
        "story",
        "--system",
        "You tell stories.",
        "--turns",
        turns,
        "--max-tokens",
        "24",
    ];
    if stream_last {
        args.push("--stream-last");
    }
    let out = python("session", server, &args);
    out.lines()
        .filter_map(|l| l.strip_prefix("ACK "))
        .map(|l| {
            let (_, j) = l.split_once(' ').unwrap();
            serde_json::from_str::<Value>(j).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

const TURNS: [&str; 4] = [
    "Once upon a time there was a cat.",
    "The cat found a ball.",
    "Then it rained.",
    "How did the day end?",
];

#[test]
fn sigkill_mid_session_stream_loses_no_acknowledged_message_and_the_session_continues() {
    let _serial = serial();
    // The reference: the whole conversation without a crash.
    let ref_dir = temp_dir("ref");
    let ref_db = ref_dir.join("h.db");
    let want = {
        let s = Server::start(&[
            "--model",
            &stories(),
            "--api-key",
            KEY,
            "--db",
            ref_db.to_str().unwrap(),
        ]);
        session_turns(&s, &TURNS.join("|"), false)
    };
    assert_eq!(want.len(), 4);

    let dir = temp_dir("crash");
    let db = dir.join("h.db");
    let db_s = db.to_str().unwrap().to_string();
    let mut server = Server::start(&["--model", &stories(), "--api-key", KEY, "--db", &db_s]);
    let acked = session_turns(&server, &TURNS[..2].join("|"), false);
    assert_eq!(acked, want[..2]);
    // Turn 3 streamed, the server killed in the middle of it.
    let mut client = session_client(&server, "story", TURNS[2], "400", true);
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    assert!(first.starts_with("CHUNK"), "{first}");
    server.kill9();
    let _ = client.wait();
    let h = history(&db, "story");
    // system, then two acknowledged turns; the streamed one was never acknowledged.
    let texts: Vec<&str> = h.iter().map(|m| m["content"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 5, "{texts:?}");
    assert_eq!(texts[2], want[0]);
    assert_eq!(texts[4], want[1]);

    // A restart over the same database continues exactly as the uninterrupted conversation.
    let server = Server::start(&["--model", &stories(), "--api-key", KEY, "--db", &db_s]);
    let rest = session_turns(&server, &TURNS[2..].join("|"), false);
    assert_eq!(rest, want[2..]);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&ref_dir);
}

#[test]
fn sigterm_during_requests_exits_0_with_histories_intact() {
    let _serial = serial();
    let dir = temp_dir("term");
    let db = dir.join("h.db");
    let mut server = Server::start(&[
        "--model",
        &stories(),
        "--api-key",
        KEY,
        "--db",
        db.to_str().unwrap(),
        "--grace",
        "20",
    ]);
    let turns = "Once upon a time there was a dog.|The dog ran.|What next?|And then?";
    // Four conversations; their clients print each acknowledged reply as it arrives.
    let (tx, rx) = std::sync::mpsc::channel::<(usize, String)>();
    let mut clients = Vec::new();
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        let mut c = session_client(&server, name, turns, "300", false);
        let out = c.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("ACK ") {
                    let j: Value = serde_json::from_str(rest.split_once(' ').unwrap().1).unwrap();
                    let _ = tx.send((i, j["text"].as_str().unwrap().to_string()));
                }
            }
        });
        clients.push(c);
    }
    drop(tx);
    // SIGTERM once every conversation has a turn acknowledged (the next ones are in flight).
    let mut acked: Vec<Vec<String>> = vec![Vec::new(); 4];
    while acked.iter().any(Vec::is_empty) {
        let (i, text) = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("an acknowledgement");
        acked[i].push(text);
    }
    let status = server.sigterm();
    assert!(status.success(), "exit status {status:?}: {}", server.log());
    for c in &mut clients {
        let _ = c.wait();
    }
    while let Ok((i, text)) = rx.recv_timeout(Duration::from_secs(5)) {
        acked[i].push(text);
    }
    assert!(server.log().contains("engines stopped"), "{}", server.log());
    for (name, acked) in ["a", "b", "c", "d"].iter().zip(&acked) {
        let h = history(&db, name);
        // Whole turns only, and every acknowledged reply is there.
        assert!(h.len().is_multiple_of(2), "{name}: half a turn: {h:?}");
        let replies: Vec<&str> = h
            .iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert!(
            replies.len() >= acked.len(),
            "{name}: {replies:?} vs {acked:?}"
        );
        assert_eq!(
            &replies[..acked.len()],
            acked.iter().map(String::as_str).collect::<Vec<_>>()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_2g_device_serves_through_its_remote_endpoint() {
    let _serial = serial();
    let remote = Server::start(&["--model", &stories()]);
    let front = Server::start(&[
        "--device-ram",
        "2G",
        "--remote",
        &remote.base(),
        "--api-key",
        KEY,
    ]);
    python(
        "remote",
        &front,
        &[
            "--key",
            KEY,
            "--model",
            "stories260K",
            "--remote-base",
            &remote.base(),
        ],
    );
}

#[test]
fn the_pool_page_draws_the_live_pool_in_chromium() {
    let _serial = serial();
    let dir = temp_dir("page");
    let db = dir.join("h.db");
    let server = Server::start(&[
        "--model",
        &stories(),
        "--db",
        db.to_str().unwrap(),
        "--kv-pool",
        "2M",
    ]);
    // Two sessions keep their caches between turns: the map has holders and blocks.
    for name in ["alice", "bob"] {
        let body = format!(
            r#"{{"model": "stories260K", "session": "{name}", "max_tokens": 20, "temperature": 0,
                "messages": [{{"role": "user", "content": "Once upon a time"}}]}}"#
        );
        let (status, out) = http(&server.addr, "POST", "/v1/chat/completions", Some(&body));
        assert_eq!(status, 200, "{out}");
    }
    // `/v1/pool` is the engine's snapshot after its last step: the second reply may reach us
    // before the snapshot that holds its session.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pool = loop {
        let pool = server.json("/v1/pool");
        if pool["models"][0]["kv"]["holders"]
            .as_array()
            .is_some_and(|h| h.len() == 2)
            || Instant::now() > deadline
        {
            break pool;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let total: u64 = pool["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["kv"]["blocks_total"].as_u64().unwrap())
        .sum();
    let holders = pool["models"][0]["kv"]["holders"].as_array().unwrap().len();
    assert_eq!(holders, 2, "{pool}");
    let profile = dir.join("chromium");
    let out = Command::new(airs_testdata::chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=4000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("{}/", server.base()))
        .output()
        .expect("running chromium");
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    let count = dom
        .split("id=\"block-count\">")
        .nth(1)
        .and_then(|s| s.split('<').next())
        .unwrap_or("");
    assert_eq!(
        count,
        total.to_string(),
        "block count on the page\n{dom}\n{log}"
    );
    assert!(
        dom.contains("alice") && dom.contains("bob"),
        "the sessions are drawn: {dom}"
    );
    assert!(dom.contains("<canvas"), "the blocks are drawn");
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") && (l.contains("Error") || l.contains("Uncaught")))
        .collect();
    assert!(
        console_errors.is_empty(),
        "console errors: {console_errors:?}"
    );
    assert!(
        dom.contains("<span id=\"error\"></span>"),
        "the page read /v1/pool: {dom}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two configured models in a model pool that holds one: a request naming the other loads it
/// after unloading the idle one; while the first model is busy, a request for the other gets
/// 503 naming what holds the pool.
#[test]
fn models_load_on_demand_and_the_idle_one_makes_room() {
    let _serial = serial();
    let server = Server::start(&[
        "--model",
        &qwen(),
        "--model",
        &stories(),
        // Qwen with its KV pool and scratch (8 sequences' sampler buffers among it) takes
        // ~605 MiB, stories260K ~70 MiB: one at a time.
        "--model-pool",
        "620M",
        "--kv-pool",
        "64M",
        "--api-key",
        KEY,
    ]);
    let loaded = |s: &Server| -> Vec<String> {
        s.json("/v1/models")["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["loaded"] == true)
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(loaded(&server), [qwen_id()]);
    let ask = |model: &str, max_tokens: usize| {
        let body = format!(
            r#"{{"model": "{model}", "max_tokens": {max_tokens}, "temperature": 0,
                "messages": [{{"role": "user", "content": "Once upon a time"}}]}}"#
        );
        http(&server.addr, "POST", "/v1/chat/completions", Some(&body))
    };
    let (status, body) = ask("stories260K", 8);
    assert_eq!(status, 200, "{body}");
    assert_eq!(loaded(&server), ["stories260K"], "Qwen made room");
    let (status, body) = ask(&qwen_id(), 4);
    assert_eq!(status, 200, "{body}");
    assert_eq!(loaded(&server), [qwen_id()]);
    let pool = server.json("/v1/pool");
    assert!(
        pool["model_pool"]["weights_bytes"].as_u64().unwrap() < 600 << 20,
        "{pool}"
    );
    // Qwen busy with a long request: stories260K cannot be loaded now. (Greedy Qwen declines
    // "Tell me a long story." in 12 tokens, a reply short enough to end between two polls
    // below; it lists the numbers in ~290.)
    let addr = server.addr.clone();
    let long = std::thread::spawn(move || {
        let body = format!(
            r#"{{"model": "{}", "max_tokens": 400, "temperature": 0,
                "messages": [{{"role": "user",
                               "content": "List the numbers from 1 to 200, one per line."}}]}}"#,
            qwen_id()
        );
        http(&addr, "POST", "/v1/chat/completions", Some(&body))
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.json("/v1/pool")["models"][0]["running"] != 1 {
        assert!(Instant::now() < deadline, "the long request never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, body) = ask("stories260K", 4);
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("model pool") && body.contains("insufficient_memory"),
        "{body}"
    );
    assert_eq!(long.join().unwrap().0, 200);
}

/// CORS admits pages served from this machine, not other origins.
#[test]
fn cors_admits_localhost_origins_only() {
    let _serial = serial();
    let server = Server::start(&["--model", &stories()]);
    let preflight = |origin: &str| -> String {
        let mut s = TcpStream::connect(&server.addr).unwrap();
        let req = format!(
            "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\n\
             Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.to_ascii_lowercase()
    };
    for ok in [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "http://[::1]:5173",
    ] {
        let r = preflight(ok);
        assert!(
            r.contains(&format!("access-control-allow-origin: {ok}")),
            "{ok}: {r}"
        );
    }
    for bad in ["http://evil.example", "http://localhost.evil.example"] {
        assert!(
            !preflight(bad).contains("access-control-allow-origin"),
            "{bad}"
        );
    }
}

/// `airs serve` started for a model it cannot serve exits with an error naming why, instead
/// of listening and answering 503 forever: a missing file and a file that is not GGUF before
/// it listens, a model the model pool cannot hold once its load fails.
#[test]
fn a_model_that_cannot_be_served_is_an_error_at_start() {
    let _serial = serial();
    let dir = temp_dir("unservable");
    let not_gguf = dir.join("notes.gguf");
    std::fs::write(&not_gguf, b"these are notes, not a model").unwrap();
    let missing = dir.join("missing.gguf");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--model", missing.to_str().unwrap()],
            "No such file or directory",
        ),
        (&["--model", not_gguf.to_str().unwrap()], "not a GGUF file"),
        (
            &["--model-pool", "200K", "--model", &stories()],
            "but the model pool holds",
        ),
    ];
    for (args, why) in cases {
        let started = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_airs"))
            .args(["serve", "--port", "0", "--threads", "1"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("airs: error:") && last.contains(why),
            "{args:?}: {stderr}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
}

/// A prompt larger than the whole KV pool can never be served by this server: it is a 400
/// `context_length_exceeded` with the numbers (not a 503 that clients retry), and
/// `/v1/models` says how long a request can be. A prompt that fits is served.
#[test]
fn a_prompt_larger_than_the_whole_kv_pool_is_a_bad_request() {
    let _serial = serial();
    let server = Server::start(&["--model", &stories(), "--kv-pool", "100K"]);
    let models = server.json("/v1/models");
    let model = &models["data"][0];
    let pool = model["memory"]["kv_blocks_total"].as_u64().unwrap();
    let context = model["context_length"].as_u64().unwrap();
    assert!(pool > 0 && context == pool * 16, "{model}");
    assert!(
        model["model_context_length"].as_u64().unwrap() > context,
        "{model}"
    );
    let ask = |words: usize| {
        let body = serde_json::json!({
            "model": "stories260K", "max_tokens": 4,
            "messages": [{"role": "user", "content": "Lily ran ".repeat(words)}],
        });
        http(
            &server.addr,
            "POST",
            "/v1/chat/completions",
            Some(&body.to_string()),
        )
    };
    let (status, body) = ask(context as usize);
    assert_eq!(status, 400, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["error"]["code"], "context_length_exceeded", "{body}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("the whole pool holds {context}")),
        "{message}"
    );
    let (status, body) = ask(4);
    assert_eq!(status, 200, "{body}");
}

/// Connections that send nothing cannot hold the server: beyond `--max-connections` new ones
/// wait to be accepted, and a connection whose request head has not come within
/// `--read-timeout` is closed, which lets the waiting ones in. A kept-alive connection used
/// more often than that stays open across several timeouts' worth of time. A request body
/// that stalls as long fails.
#[test]
fn idle_connections_are_closed_and_cannot_starve_the_server() {
    let _serial = serial();
    let server = Server::start(&["--max-connections", "4", "--read-timeout", "1"]);
    // More idle connections than the server holds (the rest wait in the backlog).
    let opened = Instant::now();
    let mut idle: Vec<TcpStream> = (0..10)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (status, body) = server.get("/health");
    let answered = opened.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        answered >= Duration::from_millis(900) && answered < Duration::from_secs(6),
        "a new client was answered after {answered:?}: it should wait for the idle ones' \
         header timeout (1 s), and no longer"
    );
    // The idle connections were closed by the server (end of stream, nothing sent).
    for (i, s) in idle.iter_mut().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "idle connection {i} got {:?}", &buf[..n]);
    }
    // One kept-alive connection, a request every 0.4 s for 2 s: never closed under it.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for i in 0..5 {
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"}") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "request {i}: the kept-alive connection was closed");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got)
        );
        std::thread::sleep(Duration::from_millis(400));
    }
    // A body that stalls: the request fails with 400 after the timeout, and the connection
    // is closed.
    let mut s = TcpStream::connect(&server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"model\": ",
    )
    .unwrap();
    let stalled = Instant::now();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.1 400") && out.contains("reading the request body"),
        "{out}"
    );
    assert!(
        stalled.elapsed() >= Duration::from_millis(900)
            && stalled.elapsed() < Duration::from_secs(5),
        "answered after {:?}",
        stalled.elapsed()
    );
}

/// A client that stops reading a long stream cannot keep the server from exiting after
/// SIGTERM: past the grace period and a few seconds more, its connection is dropped and the
/// server exits 0.
#[test]
fn a_client_that_stops_reading_does_not_hold_the_shutdown() {
    use std::os::fd::AsRawFd;
    let _serial = serial();
    let mut server = Server::start(&["--grace", "1"]);
    let mut s = TcpStream::connect(&server.addr).unwrap();
    let small: libc::c_int = 4096;
    // SAFETY: setsockopt(2) on an open socket with a pointer to a live c_int and its size.
    let set = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_RCVBUF");
    // Far more than the socket buffers hold: 16 choices of 500 tokens, each token with 20
    // alternatives.
    let body = r#"{"model": "stories260K", "stream": true, "max_tokens": 500, "n": 16,
        "logprobs": true, "top_logprobs": 20, "ignore_eos": true, "temperature": 0.8,
        "messages": [{"role": "user", "content": "Tell me a story."}]}"#;
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut first = [0u8; 16];
    s.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"), "{first:?}");
    std::thread::sleep(Duration::from_millis(500));
    let asked = Instant::now();
    let status = server.sigterm();
    let took = asked.elapsed();
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(
        took < Duration::from_secs(15),
        "exited {took:?} after SIGTERM\n{}",
        server.log()
    );
    assert!(
        server.log().contains("connections still open"),
        "the stalled connection was not the one held: {}",
        server.log()
    );
    drop(s);
}

/// One process writes a session database: a second server on it exits with an error naming
/// why (it would interleave turns of the same sessions), while `airs session --show` reads the
/// first server's committed turns.
#[test]
fn a_second_server_on_one_session_database_is_refused() {
    let _serial = serial();
    let dir = temp_dir("onedb");
    let db = dir.join("h.db");
    let server = Server::start(&["--model", &stories(), "--db", db.to_str().unwrap()]);
    let body = r#"{"model": "stories260K", "session": "ann", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": "Once upon a time"}]}"#;
    let (status, out) = http(&server.addr, "POST", "/v1/chat/completions", Some(body));
    assert_eq!(status, 200, "{out}");
    let second = Command::new(env!("CARGO_BIN_EXE_airs"))
        .args([
            "serve",
            "--port",
            "0",
            "--threads",
            "1",
            "--model",
            &stories(),
            "--db",
        ])
        .arg(&db)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("is in use by another airs process"),
        "{stderr}"
    );
    let messages = history(&db, "ann");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["content"], "Once upon a time");
    drop(server);
}
