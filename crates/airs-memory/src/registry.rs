//! The model registry: the models loaded in the model pool at one time, and the eviction policy
//! that makes room for a new one.
//!
//! Design: §6.4 of the model-memory chapter ("Model Loading and Eviction":
//! `ModelEvictionPolicy::select_victim` — never evict a model with active sessions, among the
//! others evict the least recently used) and §6.2 (a region is evicted "only when the refcount
//! drops to zero AND memory pressure requires it"), plus the security floor of §6.2.1/§12.2:
//! a model marked as a floor (the primary model while a protected service uses it) is never
//! evicted.
//!
//! Each loaded model is a [`ModelRegion`] plus bookkeeping ([`ModelInfo`]): a [`ModelId`], the
//! bytes it takes from the pool, a last-use tick and the floor flag. [`ModelRegistry::load`]
//! charges a model its file length rounded up to the base page (what the region maps), decided
//! from the [`RegionLayout`] *before* loading, so the pool is never over-committed, not even
//! transiently:
//! - a model larger than the whole pool fails at once ([`RegistryError::TooLarge`]);
//! - otherwise, if free bytes are short, victims are chosen among the *evictable* models (no
//!   session holds them, not a floor) in least-recently-used order, just enough of them; if even
//!   all evictable models would not make room, nothing is evicted and the error
//!   ([`RegistryError::NoRoom`]) names the models that hold the memory;
//! - victims are dropped (the registry's `Arc` was the last handle, so their memory returns to
//!   the pool), then the new region is loaded. If that load fails, the victims stay evicted.
//!
//! A model counts as held while any [`RegionRef`] (a session, [`ModelRegistry::acquire`]) or any
//! other `Arc` of its region is alive: eviction must return the memory, so a model whose region
//! someone still references is never a victim. "Recently used" is a logical clock ticked by
//! every `load` and `acquire` (deterministic, no ties). Loading a path that is already loaded
//! returns the loaded model (and touches it) instead of loading a second copy.
//!
//! The registry charges model *weights* to the pool's account ([`ModelPool`]), the charge
//! living as long as the region (a session holding a model keeps it charged even past the
//! registry); KV pools and scratch charge the same account ([`ModelRegistry::in_pool`]), so the
//! free bytes a load sees are what all of them left. Only models are evicted here: memory held by KV caches and scratch
//! is reported in [`RegistryError::NoRoom`] but never taken back by a model load.
//!
//! Cost: `load` and eviction are O(models log models) plus the loader's start-up (whole file for
//! `eager`, a few syscalls for `mmap`/`lazy`), during which the registry's lock is held; `acquire`
//! is O(models) under the lock. The loader is injectable ([`ModelRegistry::with_loader`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::account::{ModelPool, PoolUse};
use crate::error::MemoryError;
use crate::layout::RegionLayout;
use crate::loader::LoadOptions;
use crate::region::{ModelRegion, RegionRef};

/// Identity of a model loaded in a [`ModelRegistry`]; never reused by that registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(u64);

impl ModelId {
    /// The raw number (ids count up from 1 per registry).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "model#{}", self.0)
    }
}

/// A snapshot of one loaded model's bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    pub id: ModelId,
    pub path: PathBuf,
    /// Bytes the model takes from the pool (file length rounded up to the base page).
    pub bytes: u64,
    /// Logical time of the last `load` or `acquire` of this model (larger = more recent).
    pub last_used: u64,
    /// Handles holding the region besides the registry: sessions ([`RegionRef`]s) and any
    /// other `Arc` of it. A held model is never evicted.
    pub holders: usize,
    /// A security floor: never evicted, whatever its use.
    pub floor: bool,
}

impl ModelInfo {
    /// Whether the eviction policy may choose this model.
    pub fn evictable(&self) -> bool {
        self.holders == 0 && !self.floor
    }
}

impl fmt::Display for ModelInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} ({} bytes",
            self.id,
            self.path.display(),
            self.bytes
        )?;
        if self.holders > 0 {
            write!(f, ", {} session(s)", self.holders)?;
        }
        if self.floor {
            f.write_str(", floor")?;
        }
        f.write_str(")")
    }
}

/// What went wrong, coarsely; match on this, not on the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RegistryErrorKind {
    /// The model is larger than the whole pool: it can never be loaded here.
    TooLarge,
    /// The model would fit the pool, but the memory is held by models in use or floors.
    NoRoom,
    /// No loaded model has this id (never loaded, or evicted).
    UnknownModel,
    /// The model cannot be unloaded: sessions hold it or it is a floor.
    Held,
    /// The loader failed (see [`MemoryError`]).
    Load,
}

/// Error of a [`ModelRegistry`] operation. The numbers and the models involved are fields.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// `model_bytes` exceed the whole pool; `loaded` lists what is loaded (floors flagged).
    #[error(
        "{} needs {} but the model pool holds {}{}{}",
        path.display(),
        Mib(*model_bytes),
        Mib(*pool_bytes),
        if *pool_bytes == 0 { " (no local model on this device: inference is remote)" } else { "" },
        LoadedList(loaded)
    )]
    TooLarge {
        path: PathBuf,
        model_bytes: u64,
        pool_bytes: u64,
        loaded: Vec<ModelInfo>,
    },
    /// Even evicting every evictable model frees only `free_bytes + evictable_bytes`; `held`
    /// lists the models holding the rest (in use or floors), `other_bytes` what KV caches and
    /// scratch hold. Nothing was evicted.
    #[error(
        "no room for {} ({}) in the {} model pool: {} free, {} evictable; held by {}{}",
        path.display(),
        Mib(*model_bytes),
        Mib(*pool_bytes),
        Mib(*free_bytes),
        Mib(*evictable_bytes),
        List(held),
        Others(*other_bytes)
    )]
    NoRoom {
        path: PathBuf,
        model_bytes: u64,
        pool_bytes: u64,
        free_bytes: u64,
        evictable_bytes: u64,
        held: Vec<ModelInfo>,
        other_bytes: u64,
    },
    #[error("no loaded model {0}")]
    UnknownModel(ModelId),
    #[error("cannot unload {0}: it is held")]
    Held(ModelInfo),
    #[error("loading {}: {source}", path.display())]
    Load {
        path: PathBuf,
        #[source]
        source: MemoryError,
    },
}

impl RegistryError {
    pub fn kind(&self) -> RegistryErrorKind {
        match self {
            RegistryError::TooLarge { .. } => RegistryErrorKind::TooLarge,
            RegistryError::NoRoom { .. } => RegistryErrorKind::NoRoom,
            RegistryError::UnknownModel(_) => RegistryErrorKind::UnknownModel,
            RegistryError::Held(_) => RegistryErrorKind::Held,
            RegistryError::Load { .. } => RegistryErrorKind::Load,
        }
    }
}

/// Bytes as "N MiB" (with the exact byte count when it is not whole MiB).
struct Mib(u64);

impl fmt::Display for Mib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = self.0 as f64 / (1u64 << 20) as f64;
        if self.0.is_multiple_of(1 << 20) {
            write!(f, "{mib:.0} MiB")
        } else {
            write!(f, "{mib:.1} MiB ({} bytes)", self.0)
        }
    }
}

/// Items separated by ", ", or "nothing" (error messages naming what holds memory).
pub(crate) struct List<'a, T>(pub(crate) &'a [T]);

impl<T: fmt::Display> fmt::Display for List<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing");
        }
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{m}")?;
        }
        Ok(())
    }
}

struct Others(u64);

impl fmt::Display for Others {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            Ok(())
        } else {
            write!(f, ", and KV caches and scratch ({})", Mib(self.0))
        }
    }
}

struct LoadedList<'a>(&'a [ModelInfo]);

impl fmt::Display for LoadedList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            write!(f, "; loaded: {}", List(self.0))
        }
    }
}

/// Result of a successful [`ModelRegistry::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub id: ModelId,
    /// True when the path was already loaded and that model is returned.
    pub already_loaded: bool,
    /// The models evicted to make room, in eviction order (least recently used first).
    pub evicted: Vec<ModelInfo>,
}

/// The function that loads a region (default: [`ModelRegion::load`]).
pub type RegionLoader =
    Box<dyn Fn(&Path, RegionLayout, &LoadOptions) -> crate::Result<Arc<ModelRegion>> + Send + Sync>;

struct Entry {
    id: ModelId,
    path: PathBuf,
    bytes: u64,
    last_used: u64,
    floor: bool,
    /// Carries the weights' charge: it returns to the pool when the region goes.
    region: Arc<ModelRegion>,
}

impl Entry {
    fn holders(&self) -> usize {
        // The registry's own Arc is one strong count; every RegionRef holds another.
        Arc::strong_count(&self.region) - 1
    }

    fn info(&self) -> ModelInfo {
        ModelInfo {
            id: self.id,
            path: self.path.clone(),
            bytes: self.bytes,
            last_used: self.last_used,
            holders: self.holders(),
            floor: self.floor,
        }
    }
}

struct State {
    entries: Vec<Entry>,
    used_bytes: u64,
    next_id: u64,
    clock: u64,
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn find(&mut self, id: ModelId) -> Result<&mut Entry, RegistryError> {
        self.entries
            .iter_mut()
            .find(|e| e.id == id)
            .ok_or(RegistryError::UnknownModel(id))
    }

    fn remove(&mut self, id: ModelId) -> Entry {
        let i = self
            .entries
            .iter()
            .position(|e| e.id == id)
            .expect("entry present");
        let e = self.entries.remove(i);
        self.used_bytes -= e.bytes;
        e
    }
}

/// The models loaded in a model pool of fixed size (see the module docs).
pub struct ModelRegistry {
    pool: Arc<ModelPool>,
    page_bytes: u64,
    loader: RegionLoader,
    state: Mutex<State>,
}

impl fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRegistry")
            .field("pool_bytes", &self.pool.capacity_bytes())
            .field("models", &self.models())
            .finish()
    }
}

impl ModelRegistry {
    /// A registry of `pool_bytes` (a pool of its own) loading regions with [`ModelRegion::load`].
    pub fn new(pool_bytes: u64) -> Self {
        Self::in_pool(ModelPool::new(pool_bytes))
    }

    /// A registry charging models to `pool`, which KV pools and scratch may share.
    pub fn in_pool(pool: Arc<ModelPool>) -> Self {
        Self::with_loader_in(
            pool,
            Box::new(|path, layout, options| ModelRegion::load(path, layout, options)),
        )
    }

    /// A registry sized to a device budget's model pool.
    pub fn for_budget(budget: &crate::budget::PoolBudget) -> Self {
        Self::new(budget.model_pool_bytes)
    }

    /// A registry of `pool_bytes` that loads regions with `loader` (tests, instrumentation).
    /// The loader runs under the registry's lock: it must not call back into the registry.
    pub fn with_loader(pool_bytes: u64, loader: RegionLoader) -> Self {
        Self::with_loader_in(ModelPool::new(pool_bytes), loader)
    }

    /// [`ModelRegistry::with_loader`] charging `pool`.
    pub fn with_loader_in(pool: Arc<ModelPool>, loader: RegionLoader) -> Self {
        Self {
            pool,
            page_bytes: crate::sys::page_size() as u64,
            loader,
            state: Mutex::new(State {
                entries: Vec::new(),
                used_bytes: 0,
                next_id: 1,
                clock: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements; a panic elsewhere cannot break it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes a model whose file is `file_len` bytes takes from the pool.
    pub fn charge(&self, file_len: u64) -> u64 {
        file_len.div_ceil(self.page_bytes) * self.page_bytes
    }

    /// Loads the model at `path` (see the module docs for the eviction rule). If `path` is
    /// already loaded, returns that model, touched, without loading it again.
    pub fn load(
        &self,
        path: impl AsRef<Path>,
        layout: RegionLayout,
        options: &LoadOptions,
    ) -> Result<Loaded, RegistryError> {
        let path = path.as_ref();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut st = self.lock();
        if let Some(i) = st.entries.iter().position(|e| e.path == key) {
            let now = st.tick();
            st.entries[i].last_used = now;
            return Ok(Loaded {
                id: st.entries[i].id,
                already_loaded: true,
                evicted: Vec::new(),
            });
        }
        let bytes = self.charge(layout.file_len);
        let pool_bytes = self.pool.capacity_bytes();
        if bytes > pool_bytes {
            return Err(RegistryError::TooLarge {
                path: key,
                model_bytes: bytes,
                pool_bytes,
                loaded: st.entries.iter().map(Entry::info).collect(),
            });
        }
        let free = self.pool.free_bytes();
        let no_room = |st: &State, free_bytes: u64, evictable_bytes: u64| RegistryError::NoRoom {
            path: key.clone(),
            model_bytes: bytes,
            pool_bytes,
            free_bytes,
            evictable_bytes,
            held: st
                .entries
                .iter()
                .map(Entry::info)
                .filter(|m| !m.evictable())
                .collect(),
            other_bytes: self.pool.used_bytes().saturating_sub(st.used_bytes),
        };
        let victims = if bytes > free {
            let mut evictable: Vec<ModelInfo> = st
                .entries
                .iter()
                .map(Entry::info)
                .filter(ModelInfo::evictable)
                .collect();
            evictable.sort_by_key(|m| m.last_used);
            let need = bytes - free;
            let mut freed = 0;
            let n = evictable
                .iter()
                .position(|m| {
                    freed += m.bytes;
                    freed >= need
                })
                .map(|i| i + 1);
            let Some(n) = n else {
                return Err(no_room(&st, free, freed));
            };
            evictable.truncate(n);
            evictable
        } else {
            Vec::new()
        };
        for v in &victims {
            drop(st.remove(v.id));
        }
        // Charged before the region maps anything, so the pool is never over-committed. A KV
        // pool or scratch charged meanwhile (outside this lock) can still take the room.
        let charge = self
            .pool
            .charge(PoolUse::Weights, bytes, key.display().to_string())
            .map_err(|e| no_room(&st, e.free_bytes, 0))?;
        let region =
            (self.loader)(path, layout, options).map_err(|source| RegistryError::Load {
                path: key.clone(),
                source,
            })?;
        region.attach_charge(charge);
        let id = ModelId(st.next_id);
        st.next_id += 1;
        let last_used = st.tick();
        st.used_bytes += bytes;
        st.entries.push(Entry {
            id,
            path: key,
            bytes,
            last_used,
            floor: false,
            region,
        });
        Ok(Loaded {
            id,
            already_loaded: false,
            evicted: victims,
        })
    }

    /// A session's hold on model `id`: the region cannot be evicted until it drops. Marks the
    /// model as used now.
    pub fn acquire(&self, id: ModelId) -> Result<RegionRef, RegistryError> {
        let mut st = self.lock();
        let now = st.tick();
        let e = st.find(id)?;
        e.last_used = now;
        Ok(e.region.acquire())
    }

    /// Marks (or unmarks) model `id` as a security floor: a floor is never evicted.
    pub fn set_floor(&self, id: ModelId, floor: bool) -> Result<(), RegistryError> {
        self.lock().find(id)?.floor = floor;
        Ok(())
    }

    /// Unloads model `id` now; fails if it is held or a floor.
    pub fn unload(&self, id: ModelId) -> Result<ModelInfo, RegistryError> {
        let mut st = self.lock();
        let info = st.find(id)?.info();
        if !info.evictable() {
            return Err(RegistryError::Held(info));
        }
        drop(st.remove(id));
        Ok(info)
    }

    /// The model loaded from `path`, if any.
    pub fn find(&self, path: impl AsRef<Path>) -> Option<ModelId> {
        let path = path.as_ref();
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        self.lock()
            .entries
            .iter()
            .find(|e| e.path == key)
            .map(|e| e.id)
    }

    /// Bookkeeping of model `id`.
    pub fn info(&self, id: ModelId) -> Option<ModelInfo> {
        self.lock().find(id).ok().map(|e| e.info())
    }

    /// Bookkeeping of every loaded model, in load order.
    pub fn models(&self) -> Vec<ModelInfo> {
        self.lock().entries.iter().map(Entry::info).collect()
    }

    /// Size of the pool.
    pub fn pool_bytes(&self) -> u64 {
        self.pool.capacity_bytes()
    }

    /// The account the registry charges.
    pub fn pool(&self) -> &Arc<ModelPool> {
        &self.pool
    }

    /// Bytes charged to loaded models.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used_bytes
    }

    /// Bytes of the pool not charged to anything (models, KV caches, scratch).
    pub fn free_bytes(&self) -> u64 {
        self.pool.free_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_carry_the_numbers() {
        let m = ModelInfo {
            id: ModelId(3),
            path: "/m/a.gguf".into(),
            bytes: 3 << 20,
            last_used: 1,
            holders: 2,
            floor: true,
        };
        let e = RegistryError::TooLarge {
            path: "/m/big.gguf".into(),
            model_bytes: 5 << 20,
            pool_bytes: 4 << 20,
            loaded: vec![m.clone()],
        };
        assert_eq!(e.kind(), RegistryErrorKind::TooLarge);
        assert_eq!(
            e.to_string(),
            "/m/big.gguf needs 5 MiB but the model pool holds 4 MiB; loaded: model#3 /m/a.gguf \
             (3145728 bytes, 2 session(s), floor)"
        );
        let e = RegistryError::TooLarge {
            path: "x".into(),
            model_bytes: 4096,
            pool_bytes: 0,
            loaded: vec![],
        };
        assert!(e.to_string().contains("inference is remote"), "{e}");
        let e = RegistryError::NoRoom {
            path: "/m/b.gguf".into(),
            model_bytes: 2 << 20,
            pool_bytes: 4 << 20,
            free_bytes: 1 << 20,
            evictable_bytes: 0,
            held: vec![m],
            other_bytes: 3 << 20,
        };
        assert_eq!(e.kind(), RegistryErrorKind::NoRoom);
        assert!(e.to_string().contains("held by model#3"), "{e}");
        assert!(
            e.to_string()
                .ends_with(", and KV caches and scratch (3 MiB)"),
            "{e}"
        );
    }
}
