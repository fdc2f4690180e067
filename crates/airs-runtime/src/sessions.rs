//! Persistent conversation sessions: each session's conversation lives in the SQLite history
//! store ([`crate::store`]); in memory the scheduler keeps its token sequence and, between
//! turns, its KV cache, which eviction may take back (it is then rebuilt from the sequence on
//! the next turn: batch-invariant kernels make the rebuilt rows bit-identical, so the
//! continuation is exactly what it would have been).
//!
//! Design: §6.3 of the model-memory chapter (per-session KV caches with a priority, evicted
//! background → system → idle interactive, recomputed from the persisted conversation), read
//! through the design README. A session serves one turn at a time; a second turn waits for the
//! first, whose reply it must see. A turn is its new messages (a user message, or the results
//! of the functions the last reply called) and the reply; a session's tools (the functions it
//! may call) are rendered at its start, so its first turn sets them. A turn is committed — its
//! new messages and the reply in one transaction — before the runtime reports it done (the
//! acknowledgement), so a killed process loses no acknowledged message and never half a turn.
//!
//! Cost: a session holds its token ids and its messages' texts in memory, its KV blocks in the
//! pool while cached, and its messages on disk.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use airs_engine::PagedKv;
use airs_memory::eviction::{Priority, SessionId};

use crate::error::{Result, RuntimeError, RuntimeErrorKind};
use crate::request::RequestId;
use crate::store::{HistoryStore, NewMessage, Role, SamplerSettings, StoredMessage, StoredSession};
use crate::tools::Tools;

/// One session in memory.
#[derive(Debug)]
pub(crate) struct Session {
    pub id: SessionId,
    pub name: String,
    pub priority: Priority,
    pub salt: Option<Vec<u8>>,
    /// Roles and contents, as stored.
    pub history: Vec<(Role, String)>,
    /// The functions the conversation may call, rendered at its start (fixed by its first
    /// turn).
    pub tools: Option<Arc<Tools>>,
    pub next_seq: u64,
    /// The sequence: every token of the conversation, in KV order.
    pub tokens: Vec<u32>,
    /// Positions whose KV exist after the last turn (the cache holds this many unless
    /// something was evicted).
    pub computed: usize,
    pub turns: u64,
    /// The cache between turns.
    pub kv: Option<PagedKv>,
    /// Time of the last KV access on the scheduler's clock.
    pub last_access: Duration,
    /// The request being served, if any.
    pub busy: Option<RequestId>,
}

impl Session {
    fn from_store(stored: StoredSession, messages: Vec<StoredMessage>) -> Result<Session> {
        let tools = match &stored.tools {
            None => None,
            Some(json) => Some(Arc::new(Tools::from_json(json).map_err(|e| {
                RuntimeError::corrupt(format!("session {:?}'s tools: {e}", stored.name))
            })?)),
        };
        let mut s = Session {
            tools,
            id: stored.id,
            name: stored.name,
            priority: stored.priority,
            salt: stored.salt,
            history: Vec::new(),
            next_seq: 0,
            tokens: Vec::new(),
            computed: 0,
            turns: 0,
            kv: None,
            last_access: Duration::ZERO,
            busy: None,
        };
        for m in messages {
            if m.seq != s.next_seq {
                return Err(RuntimeError::corrupt(format!(
                    "session {:?}: message {} follows {}",
                    s.name, m.seq, s.next_seq
                )));
            }
            s.next_seq += 1;
            s.tokens.extend_from_slice(&m.tokens);
            if m.role == Role::Assistant {
                s.turns += 1;
                s.computed = m.computed as usize;
            }
            s.history.push((m.role, m.content));
        }
        if s.computed > s.tokens.len() {
            return Err(RuntimeError::corrupt(format!(
                "session {:?}: {} computed positions of {} tokens",
                s.name,
                s.computed,
                s.tokens.len()
            )));
        }
        Ok(s)
    }

    /// Positions the session's cache holds now.
    pub fn cached_len(&self) -> usize {
        self.kv.as_ref().map_or(0, |kv| kv.table().len())
    }

    /// Blocks the session's cache holds.
    pub fn blocks(&self) -> u32 {
        self.kv
            .as_ref()
            .map_or(0, |kv| kv.table().blocks().len() as u32)
    }
}

/// The sessions of one scheduler and their store.
#[derive(Debug)]
pub(crate) struct Sessions {
    pub store: HistoryStore,
    pub open: BTreeMap<SessionId, Session>,
    model_key: String,
}

impl Sessions {
    pub fn new(store: HistoryStore, model_key: String) -> Sessions {
        Sessions {
            store,
            open: BTreeMap::new(),
            model_key,
        }
    }

    /// The open session called `name`.
    pub fn find(&self, name: &str) -> Option<SessionId> {
        self.open.values().find(|s| s.name == name).map(|s| s.id)
    }

    /// Open `name`: loaded from the store if it is there (it must belong to this model),
    /// created otherwise with `system` as its first message and `tools`. Its priority becomes
    /// `priority` (persisted). A session's tools are rendered at its start, so a turn that
    /// names tools must name the session's own (set by its first turn); a turn without tools
    /// continues with the session's.
    pub fn open(
        &mut self,
        name: &str,
        priority: Priority,
        system: Option<&str>,
        tools: Option<&Arc<Tools>>,
        salt: Option<&[u8]>,
        now: Duration,
    ) -> Result<SessionId> {
        let id = self.open_or_load(name, priority, system, tools, salt, now)?;
        let s = self.open.get_mut(&id).expect("opened");
        if let Some(tools) = tools
            && s.tools.as_deref() != Some(&**tools)
        {
            if s.turns > 0 {
                return Err(RuntimeError::invalid(format!(
                    "session {name:?} {}: a session's tools are set by its first turn (the \
                     template renders them at the conversation's start); send the same tools \
                     or none",
                    if s.tools.is_some() {
                        "was opened with other tools"
                    } else {
                        "was opened without tools"
                    }
                )));
            }
            // A session whose first turn never completed takes this turn's tools.
            self.store.set_tools(id, Some(tools.json()))?;
            s.tools = Some(Arc::clone(tools));
        }
        Ok(id)
    }

    /// The session called `name`: open already, loaded from the store, or created.
    fn open_or_load(
        &mut self,
        name: &str,
        priority: Priority,
        system: Option<&str>,
        tools: Option<&Arc<Tools>>,
        salt: Option<&[u8]>,
        now: Duration,
    ) -> Result<SessionId> {
        if let Some(id) = self.find(name) {
            let s = self.open.get_mut(&id).expect("found");
            if s.priority != priority {
                self.store.set_priority(id, priority)?;
                s.priority = priority;
            }
            return Ok(id);
        }
        let stored = match self.store.find_session(name)? {
            Some(stored) => {
                if stored.model != self.model_key {
                    return Err(RuntimeError::new(RuntimeErrorKind::ModelMismatch {
                        session: stored.name,
                        stored: stored.model,
                        current: self.model_key.clone(),
                    }));
                }
                if stored.priority != priority {
                    self.store.set_priority(stored.id, priority)?;
                }
                StoredSession { priority, ..stored }
            }
            None => self.store.create_session(
                name,
                &self.model_key,
                priority,
                &SamplerSettings::default(),
                salt,
                system,
                tools.map(|t| t.json()),
            )?,
        };
        let messages = self.store.load_messages(stored.id)?;
        let mut session = Session::from_store(stored, messages)?;
        session.last_access = now;
        let id = session.id;
        self.open.insert(id, session);
        Ok(id)
    }

    /// Commit a turn of session `id`: its new messages `inputs` (user messages or function
    /// results; the tokens `delta` the turn appended are stored with the first, with the
    /// positions computed before it) and the reply `text` of `reply` tokens, with `computed`
    /// positions computed after it; then update the session in memory. Returns the turn's
    /// number. Nothing changes in memory unless the commit succeeded.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_turn(
        &mut self,
        id: SessionId,
        inputs: &[(Role, String)],
        delta: &[u32],
        text: &str,
        reply: &[u32],
        computed: usize,
        kv: Option<PagedKv>,
        now: Duration,
    ) -> Result<u64> {
        let s = self
            .open
            .get_mut(&id)
            .ok_or_else(|| RuntimeError::new(RuntimeErrorKind::UnknownSession(id.to_string())))?;
        let mut messages: Vec<NewMessage> = inputs
            .iter()
            .enumerate()
            .map(|(i, (role, content))| NewMessage {
                role: *role,
                content: content.clone(),
                tokens: if i == 0 { delta.to_vec() } else { Vec::new() },
                computed: s.computed as u64,
            })
            .collect();
        messages.push(NewMessage {
            role: Role::Assistant,
            content: text.to_owned(),
            tokens: reply.to_vec(),
            computed: computed as u64,
        });
        // The acknowledgement point: nothing below runs unless the turn is durable.
        self.store.append(id, s.next_seq, &messages)?;
        s.next_seq += messages.len() as u64;
        s.history.extend(inputs.iter().cloned());
        s.history.push((Role::Assistant, text.to_owned()));
        s.tokens.extend_from_slice(delta);
        s.tokens.extend_from_slice(reply);
        s.computed = computed;
        s.kv = kv;
        s.last_access = now;
        let turn = s.turns;
        s.turns += 1;
        s.busy = None;
        Ok(turn)
    }
}
