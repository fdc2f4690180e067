//! The history store: every session and every message of its conversation in one SQLite
//! database, with what is needed to rebuild the session's KV cache exactly — the token ids each
//! message added to the sequence (the kernels are batch-invariant, so recomputing them in any
//! batching gives the same rows) — and the sampler settings the session was created with.
//!
//! Design: §6.3 of the model-memory chapter and the design README make KV eviction "return the
//! blocks, recompute later from the persisted conversation"; this is that persisted
//! conversation. A turn (the user message and the reply) is written in **one transaction**,
//! and the runtime acknowledges the reply only after the commit returns, so a killed process
//! loses no acknowledged message, and a turn that was not acknowledged is wholly absent (the
//! client retries it; nothing half-written is ever replayed).
//!
//! Durability: the database runs in WAL mode. With `synchronous=NORMAL` a commit appends to the
//! WAL without fsync: it survives the *process* being killed (the bytes are in the kernel's page
//! cache), but the last commits can be lost if the *machine* loses power before the kernel
//! writes them back. With `synchronous=FULL` (the default, [`Durability::Full`]) the WAL is
//! fsynced at every commit, so an acknowledged message also survives power loss — which a
//! Raspberry Pi on a wall plug and an SD card must expect. It costs one fsync per turn
//! (milliseconds on an SD card, next to the hundreds of milliseconds of generating a reply).
//!
//! Schema (version 2):
//! - `sessions(id, name UNIQUE, model, priority, sampler JSON, salt, created_ms, tools)`:
//!   `tools` the JSON text of the functions the session may call (OpenAI's `tools`, as the
//!   chat template renders them at the conversation's start), or NULL. Version 1 had no
//!   `tools`; opening such a database adds the column (NULL for its sessions).
//! - `messages(session_id, seq, role, content, tokens, passes, computed, created_ms)`, primary key
//!   `(session_id, seq)`: `tokens` is the little-endian `u32` token ids the message appended to
//!   the session's sequence (a system message appends none: its tokens belong to the first
//!   turn's prompt), `computed` the sequence positions whose KV exist after the message.
//!   `passes` held forward-pass lengths when rebuilding had to replay them; it is written empty
//!   and ignored on reading (kept so databases need no rewrite). Roles: `system`, `user`,
//!   `assistant`, `tool` (a function's result).
//!
//! One writer process: [`HistoryStore::open`] takes the database's writer lock, an exclusive
//! `flock` on the sidecar file `<db>-lock` that the process holds while any of its stores of
//! that database is open (a server opens one per model). A second process that opens it to
//! write gets [`RuntimeErrorKind::StoreInUse`] instead of interleaving turns with the first
//! (two servers on one database gave the same new session to both and then failed commits on
//! duplicate rows). Readers ([`HistoryStore::open_reader`], `airs session --show`) take no
//! lock: WAL lets them read while the writer runs. The lock is the kernel's, so a killed
//! process leaves none behind.
//!
//! Cost: a turn is one transaction of an insert per message (the new ones and the reply); loading a
//! session reads its messages once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use airs_memory::eviction::{Priority, SessionId};
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError, RuntimeErrorKind};

const SCHEMA_VERSION: i64 = 2;

/// How hard a commit tries to reach the disk (see the module documentation).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: survives process kill and power loss.
    #[default]
    Full,
    /// `synchronous=NORMAL` (with WAL): survives process kill, not power loss.
    Normal,
}

/// Who wrote a message.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A function's result, sent back after a reply that called it.
    Tool,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    fn parse(s: &str) -> Result<Role> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(RuntimeError::corrupt(format!("unknown role {other:?}"))),
        }
    }
}

/// The sampler of a session, persisted so a continuation draws exactly what it would have.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplerSettings {
    /// 0 is greedy.
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    #[serde(default)]
    pub frequency_penalty: f32,
    #[serde(default)]
    pub presence_penalty: f32,
    /// The session seed; turn `t` samples with [`SamplerSettings::turn_seed`]`(t)`.
    pub seed: u64,
}

impl Default for SamplerSettings {
    fn default() -> SamplerSettings {
        let d = airs_engine::SamplerConfig::default();
        SamplerSettings {
            temperature: d.temperature,
            top_k: d.top_k,
            top_p: d.top_p,
            min_p: d.min_p,
            repeat_penalty: d.repeat_penalty,
            repeat_last_n: d.repeat_last_n,
            frequency_penalty: d.frequency_penalty,
            presence_penalty: d.presence_penalty,
            seed: d.seed,
        }
    }
}

impl SamplerSettings {
    /// The seed of turn `turn` (0-based): SplitMix64 of the session seed and the turn, so each
    /// turn's draws depend only on what is persisted, not on the process that made them.
    pub fn turn_seed(&self, turn: u64) -> u64 {
        turn_seed(self.seed, turn)
    }

    /// The engine's sampler configuration for turn `turn`.
    pub fn for_turn(&self, turn: u64) -> airs_engine::SamplerConfig {
        airs_engine::SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: Vec::new(),
            seed: self.turn_seed(turn),
        }
    }
}

/// The sampler seed of turn `turn` (0-based) of a session whose requests ask for `seed`:
/// SplitMix64 of the two, so each turn draws differently and depends only on what is
/// persisted, not on the process that made it.
pub fn turn_seed(seed: u64, turn: u64) -> u64 {
    let mut z = seed.wrapping_add(turn.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A session as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredSession {
    pub id: SessionId,
    pub name: String,
    /// The model the session's token ids belong to.
    pub model: String,
    pub priority: Priority,
    pub sampler: SamplerSettings,
    /// Prefix-cache salt: sessions share KV prefixes only with sessions of the same salt.
    pub salt: Option<Vec<u8>>,
    pub created_ms: i64,
    /// The JSON text of the functions the session may call (rendered at its start).
    pub tools: Option<String>,
}

/// A message as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    pub seq: u64,
    pub role: Role,
    pub content: String,
    /// Token ids this message appended to the session's sequence.
    pub tokens: Vec<u32>,
    /// Sequence positions with KV after this message.
    pub computed: u64,
}

/// A message to append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewMessage {
    pub role: Role,
    pub content: String,
    pub tokens: Vec<u32>,
    pub computed: u64,
}

/// A `sessions` row: id, name, model, priority, sampler JSON, salt, created_ms, tools.
type SessionRow = (
    i64,
    String,
    String,
    String,
    String,
    Option<Vec<u8>>,
    i64,
    Option<String>,
);

/// The SQLite history store (see the module documentation).
#[derive(Debug)]
pub struct HistoryStore {
    conn: Connection,
    durability: Durability,
    /// The database's writer lock, shared by this process's stores of it (`None`: a reader,
    /// or a database in memory).
    _writer: Option<Arc<WriterLock>>,
    /// Time each commit takes on top of its own (tests of what a slow disk costs).
    #[cfg(feature = "fault-injection")]
    commit_delay: std::time::Duration,
}

/// An exclusive `flock` on a database's `<db>-lock` file, held while the file is open.
#[derive(Debug)]
struct WriterLock {
    _file: std::fs::File,
}

/// This process's writer locks by database path: the stores of one database share one lock
/// (a second `flock` from this process on another descriptor would refuse it).
static WRITER_LOCKS: Mutex<Vec<(PathBuf, Weak<WriterLock>)>> = Mutex::new(Vec::new());

impl WriterLock {
    /// The writer lock of the database at `path`, taken for this process, or shared with the
    /// stores of this process that hold it.
    fn take(path: &Path) -> Result<Arc<WriterLock>> {
        // The path as the kernel resolves it (symbolic links followed), so two spellings of
        // one database share one lock file; a database not yet created, by its directory's.
        let key = match path.canonicalize() {
            Ok(p) => p,
            Err(_) => {
                let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    Some(p) => p.canonicalize(),
                    None => std::env::current_dir(),
                }
                .map_err(|e| RuntimeError::invalid(format!("{}: {e}", path.display())))?;
                let name = path.file_name().ok_or_else(|| {
                    RuntimeError::invalid(format!("{}: not a file", path.display()))
                })?;
                dir.join(name)
            }
        };
        let mut locks = WRITER_LOCKS.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|(_, l)| l.strong_count() > 0);
        if let Some(lock) = locks
            .iter()
            .find(|(p, _)| *p == key)
            .and_then(|(_, l)| l.upgrade())
        {
            return Ok(lock);
        }
        let mut lock_path = key.clone().into_os_string();
        lock_path.push("-lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| {
                RuntimeError::invalid(format!("{}: {e}", PathBuf::from(&lock_path).display()))
            })?;
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(RuntimeError::new(RuntimeErrorKind::StoreInUse(
                    path.display().to_string(),
                )));
            }
            Err(e) => {
                return Err(RuntimeError::invalid(format!(
                    "locking {}: {e}",
                    PathBuf::from(&lock_path).display()
                )));
            }
        }
        let lock = Arc::new(WriterLock { _file: file });
        locks.push((key, Arc::downgrade(&lock)));
        Ok(lock)
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn u32s_to_blob(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|t| t.to_le_bytes()).collect()
}

fn blob_to_u32s(b: &[u8]) -> Result<Vec<u32>> {
    if !b.len().is_multiple_of(4) {
        return Err(RuntimeError::corrupt(
            "a token blob is not a whole number of u32",
        ));
    }
    Ok(b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

impl HistoryStore {
    /// Open (creating if needed) the database at `path`, in WAL mode with `durability`.
    /// Takes the database's writer lock first (see the module documentation).
    pub fn open(path: &Path, durability: Durability) -> Result<HistoryStore> {
        let writer = WriterLock::take(path)?;
        HistoryStore::init(Connection::open(path)?, durability, Some(writer))
    }

    /// Open the database at `path` to read it, without the writer lock: while another process
    /// writes to it, this one sees every committed turn.
    pub fn open_reader(path: &Path) -> Result<HistoryStore> {
        HistoryStore::init(Connection::open(path)?, Durability::Full, None)
    }

    /// A database in memory (tests, benchmarks): nothing survives the process.
    pub fn open_in_memory() -> Result<HistoryStore> {
        HistoryStore::init(Connection::open_in_memory()?, Durability::Normal, None)
    }

    fn init(
        conn: Connection,
        durability: Durability,
        writer: Option<Arc<WriterLock>>,
    ) -> Result<HistoryStore> {
        // WAL lets readers (e.g. `airs session --show`) see committed turns while a writer runs.
        let _mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        conn.execute_batch(match durability {
            Durability::Full => "PRAGMA synchronous=FULL;",
            Durability::Normal => "PRAGMA synchronous=NORMAL;",
        })?;
        conn.execute_batch(
            "PRAGMA foreign_keys=ON;
             PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS sessions(
                 id INTEGER PRIMARY KEY,
                 name TEXT NOT NULL UNIQUE,
                 model TEXT NOT NULL,
                 priority TEXT NOT NULL,
                 sampler TEXT NOT NULL,
                 salt BLOB,
                 created_ms INTEGER NOT NULL,
                 tools TEXT
             );
             CREATE TABLE IF NOT EXISTS messages(
                 session_id INTEGER NOT NULL REFERENCES sessions(id),
                 seq INTEGER NOT NULL,
                 role TEXT NOT NULL,
                 content TEXT NOT NULL,
                 tokens BLOB NOT NULL,
                 passes BLOB NOT NULL,
                 computed INTEGER NOT NULL,
                 created_ms INTEGER NOT NULL,
                 PRIMARY KEY(session_id, seq)
             );",
        )?;
        let version: Option<i64> = conn
            .query_row(
                "SELECT value FROM meta WHERE key='schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match version {
            None => {
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES('schema_version', ?1)",
                    [SCHEMA_VERSION],
                )?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(1) => {
                // Version 1 had no `tools` (its sessions have none).
                let tx = conn.unchecked_transaction()?;
                tx.execute_batch(
                    "ALTER TABLE sessions ADD COLUMN tools TEXT;
                     UPDATE meta SET value = 2 WHERE key = 'schema_version';",
                )?;
                tx.commit()?;
            }
            Some(v) => {
                return Err(RuntimeError::corrupt(format!(
                    "schema version {v}, this runtime reads {SCHEMA_VERSION}"
                )));
            }
        }
        Ok(HistoryStore {
            conn,
            durability,
            _writer: writer,
            #[cfg(feature = "fault-injection")]
            commit_delay: std::time::Duration::ZERO,
        })
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    fn row_to_session(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionRow> {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
        ))
    }

    fn parse_session(row: SessionRow) -> Result<StoredSession> {
        let (id, name, model, priority, sampler, salt, created_ms, tools) = row;
        Ok(StoredSession {
            id: SessionId(id as u64),
            name,
            model,
            priority: priority
                .parse()
                .map_err(|e: String| RuntimeError::corrupt(e))?,
            sampler: serde_json::from_str(&sampler)
                .map_err(|e| RuntimeError::corrupt(format!("sampler settings: {e}")))?,
            salt,
            created_ms,
            tools,
        })
    }

    const SESSION_COLUMNS: &'static str =
        "id, name, model, priority, sampler, salt, created_ms, tools";

    /// The session called `name`, if any.
    pub fn find_session(&self, name: &str) -> Result<Option<StoredSession>> {
        let row = self
            .conn
            .query_row(
                &format!(
                    "SELECT {} FROM sessions WHERE name = ?1",
                    Self::SESSION_COLUMNS
                ),
                [name],
                Self::row_to_session,
            )
            .optional()?;
        row.map(Self::parse_session).transpose()
    }

    /// Every session, by id.
    pub fn list_sessions(&self) -> Result<Vec<StoredSession>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {} FROM sessions ORDER BY id",
            Self::SESSION_COLUMNS
        ))?;
        let rows = stmt.query_map([], Self::row_to_session)?;
        rows.map(|r| Self::parse_session(r?)).collect()
    }

    /// Create a session, with its system message and its tools (JSON text) if any, in one
    /// transaction.
    #[allow(clippy::too_many_arguments)]
    pub fn create_session(
        &mut self,
        name: &str,
        model: &str,
        priority: Priority,
        sampler: &SamplerSettings,
        salt: Option<&[u8]>,
        system: Option<&str>,
        tools: Option<&str>,
    ) -> Result<StoredSession> {
        let created_ms = now_ms();
        let sampler_json = serde_json::to_string(sampler)
            .map_err(|e| RuntimeError::invalid(format!("sampler settings: {e}")))?;
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO sessions(name, model, priority, sampler, salt, created_ms, tools)
             VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                name,
                model,
                priority.name(),
                sampler_json,
                salt,
                created_ms,
                tools
            ],
        )?;
        let id = tx.last_insert_rowid();
        if let Some(text) = system {
            tx.execute(
                "INSERT INTO messages(session_id, seq, role, content, tokens, passes, computed,
                                      created_ms)
                 VALUES(?1, 0, 'system', ?2, x'', x'', 0, ?3)",
                params![id, text, created_ms],
            )?;
        }
        tx.commit()?;
        Ok(StoredSession {
            id: SessionId(id as u64),
            name: name.to_owned(),
            model: model.to_owned(),
            priority,
            sampler: sampler.clone(),
            salt: salt.map(<[u8]>::to_vec),
            created_ms,
            tools: tools.map(str::to_owned),
        })
    }

    /// Set a session's tools (JSON text; a session whose first turn has not completed).
    pub fn set_tools(&mut self, id: SessionId, tools: Option<&str>) -> Result<()> {
        self.conn.execute(
            "UPDATE sessions SET tools = ?1 WHERE id = ?2",
            params![tools, id.0 as i64],
        )?;
        Ok(())
    }

    /// Change a session's priority.
    pub fn set_priority(&mut self, id: SessionId, priority: Priority) -> Result<()> {
        self.conn.execute(
            "UPDATE sessions SET priority = ?1 WHERE id = ?2",
            params![priority.name(), id.0 as i64],
        )?;
        Ok(())
    }

    /// A session's messages in order.
    pub fn load_messages(&self, id: SessionId) -> Result<Vec<StoredMessage>> {
        let mut stmt = self.conn.prepare(
            "SELECT seq, role, content, tokens, computed FROM messages
             WHERE session_id = ?1 ORDER BY seq",
        )?;
        let rows = stmt.query_map([id.0 as i64], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Vec<u8>>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, role, content, tokens, computed) = row?;
            out.push(StoredMessage {
                seq: seq as u64,
                role: Role::parse(&role)?,
                content,
                tokens: blob_to_u32s(&tokens)?,
                computed: computed as u64,
            });
        }
        Ok(out)
    }

    /// Append `messages` to session `id` at sequence numbers `first_seq..` in one transaction.
    /// When this returns `Ok`, the messages are durable to the store's [`Durability`].
    pub fn append(&mut self, id: SessionId, first_seq: u64, messages: &[NewMessage]) -> Result<()> {
        let created_ms = now_ms();
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO messages(session_id, seq, role, content, tokens, passes, computed,
                                      created_ms)
                 VALUES(?1, ?2, ?3, ?4, ?5, x'', ?6, ?7)",
            )?;
            for (i, m) in messages.iter().enumerate() {
                stmt.execute(params![
                    id.0 as i64,
                    (first_seq + i as u64) as i64,
                    m.role.name(),
                    m.content,
                    u32s_to_blob(&m.tokens),
                    m.computed as i64,
                    created_ms
                ])?;
            }
        }
        tx.commit()?;
        #[cfg(feature = "fault-injection")]
        std::thread::sleep(self.commit_delay);
        Ok(())
    }

    /// Make every later commit take `delay` longer, as a slow disk would (tests only).
    #[cfg(feature = "fault-injection")]
    pub fn inject_commit_delay(&mut self, delay: std::time::Duration) {
        self.commit_delay = delay;
    }
}
