//! The model registry: LRU eviction among unheld models, sessions and floors that pin a model,
//! typed errors carrying the numbers, and a property test over random load / acquire / release /
//! floor sequences against real regions of small synthetic files.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use airs_memory::budget::PoolBudget;
use airs_memory::{
    ErrorKind, LoadOptions, LoaderKind, ModelId, ModelRegion, ModelRegistry, RegionLayout,
    RegionRef, RegistryError, RegistryErrorKind,
};
use common::{TempModel, temp_model};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

fn page() -> u64 {
    airs_memory::page_size() as u64
}

fn eager() -> LoadOptions {
    LoadOptions::with_loader(LoaderKind::Eager)
}

/// A synthetic model of `pages` base pages (the last one partial, as in real files).
fn model(pages: u64, seed: u64) -> TempModel {
    temp_model(pages * page() - 17, seed)
}

fn layout(m: &TempModel) -> RegionLayout {
    RegionLayout::whole_file(m.bytes.len() as u64)
}

fn load(reg: &ModelRegistry, m: &TempModel) -> Result<airs_memory::Loaded, RegistryError> {
    reg.load(&m.path, layout(m), &eager())
}

fn ids(reg: &ModelRegistry) -> Vec<ModelId> {
    reg.models().iter().map(|m| m.id).collect()
}

#[test]
fn evicts_the_least_recently_used_unheld_model() {
    let (a, b, c) = (model(4, 1), model(4, 2), model(4, 3));
    let reg = ModelRegistry::new(10 * page());
    let ia = load(&reg, &a).unwrap().id;
    let ib = load(&reg, &b).unwrap().id;
    assert_eq!(reg.used_bytes(), 8 * page());
    assert_eq!(reg.free_bytes(), 2 * page());
    // Touch a: b becomes the least recently used.
    drop(reg.acquire(ia).unwrap());
    let loaded = load(&reg, &c).unwrap();
    assert_eq!(
        loaded.evicted.iter().map(|m| m.id).collect::<Vec<_>>(),
        vec![ib]
    );
    assert_eq!(ids(&reg), vec![ia, loaded.id]);
    assert_eq!(reg.used_bytes(), 8 * page());
    assert_eq!(
        reg.acquire(ib).unwrap_err().kind(),
        RegistryErrorKind::UnknownModel
    );
    // The region's bytes are the file's.
    let session = reg.acquire(loaded.id).unwrap();
    assert!(session.bytes() == c.bytes.as_slice());
}

#[test]
fn evicted_region_memory_is_released() {
    let (a, b) = (model(3, 4), model(3, 5));
    let reg = ModelRegistry::new(4 * page());
    let ia = load(&reg, &a).unwrap().id;
    let weak = {
        let s = reg.acquire(ia).unwrap();
        Arc::downgrade(s.region())
    };
    assert!(weak.upgrade().is_some());
    load(&reg, &b).unwrap();
    assert!(weak.upgrade().is_none(), "the evicted region was freed");
}

#[test]
fn sessions_and_floors_are_never_evicted_and_the_error_names_them() {
    let (a, b, c) = (model(4, 6), model(4, 7), model(4, 8));
    let reg = ModelRegistry::new(10 * page());
    let ia = load(&reg, &a).unwrap().id;
    let ib = load(&reg, &b).unwrap().id;
    let session = reg.acquire(ia).unwrap();
    reg.set_floor(ib, true).unwrap();
    let err = load(&reg, &c).unwrap_err();
    assert_eq!(err.kind(), RegistryErrorKind::NoRoom);
    match &err {
        RegistryError::NoRoom {
            model_bytes,
            pool_bytes,
            free_bytes,
            evictable_bytes,
            held,
            ..
        } => {
            assert_eq!(*model_bytes, 4 * page());
            assert_eq!(*pool_bytes, 10 * page());
            assert_eq!(*free_bytes, 2 * page());
            assert_eq!(*evictable_bytes, 0);
            assert_eq!(held.iter().map(|m| m.id).collect::<Vec<_>>(), vec![ia, ib]);
            assert_eq!(held[0].holders, 1);
            assert!(held[1].floor);
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("1 session(s)") && msg.contains("floor"),
        "{msg}"
    );
    assert_eq!(ids(&reg), vec![ia, ib], "nothing was evicted");
    assert_eq!(
        reg.unload(ia).unwrap_err().kind(),
        RegistryErrorKind::Held,
        "a held model cannot be unloaded"
    );

    // Releasing the session makes a evictable; the floor still protects b.
    drop(session);
    let loaded = load(&reg, &c).unwrap();
    assert_eq!(loaded.evicted.len(), 1);
    assert_eq!(loaded.evicted[0].id, ia);
    assert_eq!(ids(&reg), vec![ib, loaded.id]);

    // Lifting the floor lets b go.
    reg.set_floor(ib, false).unwrap();
    assert_eq!(reg.unload(ib).unwrap().id, ib);
    assert_eq!(reg.used_bytes(), 4 * page());
}

#[test]
fn a_model_larger_than_the_pool_fails_up_front() {
    let (a, big) = (model(2, 9), model(6, 10));
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let reg = ModelRegistry::with_loader(
        5 * page(),
        Box::new(move |path, layout, options| {
            counted.fetch_add(1, Ordering::Relaxed);
            ModelRegion::load(path, layout, options)
        }),
    );
    let ia = load(&reg, &a).unwrap().id;
    reg.set_floor(ia, true).unwrap();
    let err = load(&reg, &big).unwrap_err();
    match &err {
        RegistryError::TooLarge {
            model_bytes,
            pool_bytes,
            loaded,
            ..
        } => {
            assert_eq!(*model_bytes, 6 * page());
            assert_eq!(*pool_bytes, 5 * page());
            assert_eq!(loaded.len(), 1);
            assert!(loaded[0].floor);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        calls.load(Ordering::Relaxed),
        1,
        "the loader never ran for it"
    );
    assert_eq!(ids(&reg), vec![ia]);
}

#[test]
fn a_two_gib_device_loads_nothing() {
    let a = model(1, 11);
    let reg = ModelRegistry::for_budget(&PoolBudget::for_total_ram(2 << 30));
    let err = load(&reg, &a).unwrap_err();
    assert_eq!(err.kind(), RegistryErrorKind::TooLarge);
    assert!(err.to_string().contains("inference is remote"), "{err}");
}

#[test]
fn the_same_file_is_loaded_once() {
    let (a, b, c) = (model(2, 12), model(2, 13), model(2, 14));
    let reg = ModelRegistry::new(4 * page());
    let ia = load(&reg, &a).unwrap().id;
    let ib = load(&reg, &b).unwrap().id;
    let again = load(&reg, &a).unwrap();
    assert!(again.already_loaded);
    assert_eq!(again.id, ia);
    assert_eq!(reg.find(&a.path), Some(ia));
    // Loading a again touched it: b is now the LRU victim.
    let loaded = load(&reg, &c).unwrap();
    assert_eq!(loaded.evicted[0].id, ib);
}

#[test]
fn loader_errors_are_typed_and_charge_nothing() {
    let a = model(2, 15);
    let reg = ModelRegistry::new(8 * page());
    let wrong = RegionLayout::whole_file(a.bytes.len() as u64 + 1);
    let err = reg.load(&a.path, wrong, &eager()).unwrap_err();
    assert_eq!(err.kind(), RegistryErrorKind::Load);
    match &err {
        RegistryError::Load { source, .. } => assert_eq!(source.kind(), ErrorKind::Layout),
        other => panic!("{other:?}"),
    }
    let missing = Path::new("/nonexistent/airs-registry-test.gguf");
    let err = reg
        .load(missing, RegionLayout::whole_file(100), &eager())
        .unwrap_err();
    assert_eq!(err.kind(), RegistryErrorKind::Load);
    assert_eq!(reg.used_bytes(), 0);
    assert!(reg.models().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Property test.

#[derive(Debug, Clone)]
enum Op {
    /// Load file `i` (sizes in `SIZES_PAGES`).
    Load(usize),
    /// Acquire the `i`-th id ever loaded (it may have been evicted).
    Acquire(usize),
    /// Drop the `i`-th session held.
    Release(usize),
    /// Set or clear the floor on the `i`-th id ever loaded.
    Floor(usize, bool),
}

/// File sizes in pages; the pool is `POOL_PAGES`, so the last file can never fit.
const SIZES_PAGES: [u64; 6] = [1, 2, 3, 4, 5, 13];
const POOL_PAGES: u64 = 12;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..SIZES_PAGES.len()).prop_map(Op::Load),
        3 => (0..16usize).prop_map(Op::Acquire),
        3 => (0..16usize).prop_map(Op::Release),
        1 => (0..16usize, any::<bool>()).prop_map(|(i, f)| Op::Floor(i, f)),
    ]
}

/// The test's own view: which sessions it holds, what it floored, and its own use order.
struct Mirror {
    seen: Vec<ModelId>,
    sessions: Vec<(ModelId, RegionRef)>,
    floors: HashSet<ModelId>,
    touched: HashMap<ModelId, u64>,
    clock: u64,
}

impl Mirror {
    fn touch(&mut self, id: ModelId) {
        self.clock += 1;
        self.touched.insert(id, self.clock);
    }

    fn pick(&self, i: usize) -> Option<ModelId> {
        (!self.seen.is_empty()).then(|| self.seen[i % self.seen.len()])
    }
}

fn check_load(
    reg: &ModelRegistry,
    mirror: &mut Mirror,
    files: &[TempModel],
    i: usize,
) -> Result<(), TestCaseError> {
    let file = &files[i];
    let bytes = SIZES_PAGES[i] * page();
    let pool = POOL_PAGES * page();
    let before = reg.models();
    let used: u64 = before.iter().map(|m| m.bytes).sum();
    let existing = before
        .iter()
        .find(|m| m.path == std::fs::canonicalize(&file.path).unwrap());
    // Evictable by the test's own knowledge, in the test's own LRU order.
    let mut evictable: Vec<_> = before
        .iter()
        .filter(|m| !mirror.floors.contains(&m.id))
        .filter(|m| !mirror.sessions.iter().any(|(s, _)| *s == m.id))
        .collect();
    evictable.sort_by_key(|m| mirror.touched[&m.id]);
    let result = load(reg, file);
    match (existing, result) {
        (Some(m), Ok(l)) => {
            prop_assert!(l.already_loaded && l.id == m.id && l.evicted.is_empty());
            mirror.touch(l.id);
        }
        (None, Ok(l)) => {
            prop_assert!(bytes <= pool);
            prop_assert!(!l.already_loaded);
            // The victims are the shortest LRU prefix of the evictable models that makes room.
            let need = (used + bytes).saturating_sub(pool);
            let mut expected = Vec::new();
            let mut freed = 0;
            for m in &evictable {
                if freed >= need {
                    break;
                }
                freed += m.bytes;
                expected.push(m.id);
            }
            let got: Vec<ModelId> = l.evicted.iter().map(|m| m.id).collect();
            prop_assert_eq!(got, expected);
            prop_assert!(!mirror.seen.contains(&l.id), "ids are never reused");
            mirror.seen.push(l.id);
            mirror.touch(l.id);
        }
        (None, Err(e)) if bytes > pool => {
            prop_assert_eq!(e.kind(), RegistryErrorKind::TooLarge);
            prop_assert_eq!(ids(reg), before.iter().map(|m| m.id).collect::<Vec<_>>());
        }
        (None, Err(e)) => {
            prop_assert_eq!(e.kind(), RegistryErrorKind::NoRoom, "{}", e);
            let evictable_bytes: u64 = evictable.iter().map(|m| m.bytes).sum();
            prop_assert!(pool - used + evictable_bytes < bytes);
            prop_assert_eq!(ids(reg), before.iter().map(|m| m.id).collect::<Vec<_>>());
        }
        (Some(_), Err(e)) => prop_assert!(false, "reloading a loaded file failed: {}", e),
    }
    Ok(())
}

fn run_ops(files: &[TempModel], ops: &[Op]) -> Result<(), TestCaseError> {
    let reg = ModelRegistry::new(POOL_PAGES * page());
    let mut mirror = Mirror {
        seen: Vec::new(),
        sessions: Vec::new(),
        floors: HashSet::new(),
        touched: HashMap::new(),
        clock: 0,
    };
    for op in ops {
        match *op {
            Op::Load(i) => check_load(&reg, &mut mirror, files, i)?,
            Op::Acquire(i) => {
                let Some(id) = mirror.pick(i) else { continue };
                let loaded = reg.info(id).is_some();
                match reg.acquire(id) {
                    Ok(s) => {
                        prop_assert!(loaded);
                        mirror.sessions.push((id, s));
                        mirror.touch(id);
                    }
                    Err(e) => {
                        prop_assert!(!loaded);
                        prop_assert_eq!(e.kind(), RegistryErrorKind::UnknownModel);
                    }
                }
            }
            Op::Release(i) => {
                if !mirror.sessions.is_empty() {
                    let n = mirror.sessions.len();
                    mirror.sessions.swap_remove(i % n);
                }
            }
            Op::Floor(i, floor) => {
                let Some(id) = mirror.pick(i) else { continue };
                match reg.set_floor(id, floor) {
                    Ok(()) if floor => {
                        mirror.floors.insert(id);
                    }
                    Ok(()) => {
                        mirror.floors.remove(&id);
                    }
                    Err(e) => prop_assert_eq!(e.kind(), RegistryErrorKind::UnknownModel),
                }
            }
        }
        // Invariants after every step.
        let models = reg.models();
        let sum: u64 = models.iter().map(|m| m.bytes).sum();
        prop_assert!(sum <= reg.pool_bytes(), "pool exceeded: {sum}");
        prop_assert_eq!(sum, reg.used_bytes());
        let loaded: HashSet<ModelId> = models.iter().map(|m| m.id).collect();
        for (id, _) in &mirror.sessions {
            prop_assert!(loaded.contains(id), "{id} evicted while a session held it");
        }
        for id in &mirror.floors {
            prop_assert!(loaded.contains(id), "floor {id} evicted");
        }
        for m in &models {
            let held = mirror.sessions.iter().filter(|(s, _)| *s == m.id).count();
            prop_assert_eq!(m.holders, held);
            prop_assert_eq!(m.floor, mirror.floors.contains(&m.id));
        }
    }
    Ok(())
}

#[test]
fn random_sequences_keep_the_budget_and_evict_lru_among_unheld() {
    let files: Vec<TempModel> = SIZES_PAGES
        .iter()
        .enumerate()
        .map(|(i, &p)| model(p, 100 + i as u64))
        .collect();
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&prop::collection::vec(op(), 1..60), |ops| {
            run_ops(&files, &ops)
        })
        .unwrap();
}
