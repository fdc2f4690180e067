//! One model pool: a model's weights (through the registry), its session manager's KV pool and
//! its forward-pass scratch are charged to one account, enforced at run time — a manager whose
//! KV pool does not fit beside the weights fails at start, naming what holds the pool, and a
//! model load does not take memory KV caches hold. Every charge is returned when its owner
//! goes away. Runs on the real stories260K file.

use std::sync::Arc;

use airs_memory::{
    LoadOptions, LoaderKind, ModelRegistry, PinPolicy, PoolUse, RegionLayout, RegistryErrorKind,
};
use airs_runtime::{
    Engine, HistoryStore, ManagerConfig, Priority, RequestOptions, RuntimeErrorKind,
    SessionManager, SessionSpec,
};

const MIB: u64 = 1 << 20;

fn weights_charge() -> u64 {
    let len = std::fs::metadata(airs_testdata::stories_path())
        .unwrap()
        .len();
    let page = airs_memory::page_size() as u64;
    len.div_ceil(page) * page
}

fn load(registry: &Arc<ModelRegistry>) -> Engine {
    Engine::load(
        registry,
        &airs_testdata::stories_path(),
        &LoadOptions::with_loader(LoaderKind::Eager),
        1,
    )
    .unwrap()
}

fn config(kv_bytes: u64) -> ManagerConfig {
    let mut c = ManagerConfig::new(kv_bytes as usize);
    c.pin = PinPolicy::None;
    c
}

#[test]
fn weights_kv_pool_and_scratch_share_one_account_and_are_returned() {
    let registry = Arc::new(ModelRegistry::new(16 * MIB));
    let engine = load(&registry);
    let weights = weights_charge();
    assert_eq!(registry.pool().usage().weights_bytes, weights);

    let mut manager =
        SessionManager::new(engine, HistoryStore::open_in_memory().unwrap(), config(MIB)).unwrap();
    let kv = manager.pool().stats();
    let u = registry.pool().usage();
    assert_eq!(u.weights_bytes, weights);
    assert_eq!(
        u.kv_cache_bytes,
        (kv.blocks_total as usize * kv.block_bytes) as u64
    );
    assert!(u.kv_cache_bytes <= MIB && u.kv_cache_bytes > MIB / 2);
    assert!(u.scratch_bytes > 0);
    let s = manager.stats().model_pool;
    assert_eq!(s.capacity_bytes, 16 * MIB);
    assert_eq!(
        s.free_bytes,
        16 * MIB - weights - u.kv_cache_bytes - u.scratch_bytes
    );

    // Serving allocates KV blocks inside the charged pool: the account does not move.
    let id = manager
        .open_session(&SessionSpec::new("a", Priority::Interactive))
        .unwrap();
    let reply = manager
        .request(id, "Once upon a time", &RequestOptions { max_tokens: 8 })
        .unwrap();
    assert!(!reply.tokens.is_empty());
    assert_eq!(registry.pool().usage(), u);

    // The manager (and the engine it owns) gone: KV and scratch come back; the registry still
    // holds the model, now evictable, and unloading it empties the account.
    drop(manager);
    let u = registry.pool().usage();
    assert_eq!((u.kv_cache_bytes, u.scratch_bytes), (0, 0));
    assert_eq!(u.weights_bytes, weights);
    let model = registry.models()[0].clone();
    assert_eq!(model.holders, 0);
    registry.unload(model.id).unwrap();
    assert_eq!(registry.pool().used_bytes(), 0);
}

#[test]
fn a_kv_pool_beside_the_weights_that_overflows_the_pool_fails_naming_the_holders() {
    let weights = weights_charge();
    // Room for the weights, the scratch (2.5 MiB for a 4 MiB KV pool's context) and a little KV
    // cache, not 4 MiB of it.
    let registry = Arc::new(ModelRegistry::new(weights + 4 * MIB));
    let engine = load(&registry);
    let err = SessionManager::new(
        engine,
        HistoryStore::open_in_memory().unwrap(),
        config(4 * MIB),
    )
    .unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err.kind(), RuntimeErrorKind::Engine(_)),
        "{message}"
    );
    assert!(message.contains("KV cache"), "{message}");
    assert!(message.contains("stories260K.gguf"), "{message}");
    assert!(message.contains("weights"), "{message}");
    // Nothing of the failed manager stays charged (the engine went with it).
    let u = registry.pool().usage();
    assert_eq!((u.kv_cache_bytes, u.scratch_bytes), (0, 0));

    // The same KV pool in a pool with room: starts.
    let engine = load(&registry);
    SessionManager::new(engine, HistoryStore::open_in_memory().unwrap(), config(MIB)).unwrap();
}

#[test]
fn a_model_load_does_not_take_memory_kv_caches_hold() {
    let weights = weights_charge();
    let registry = Arc::new(ModelRegistry::new(weights + MIB));
    // A KV pool leaves less than the model's weights free (the pool would hold both without it).
    let _kv = registry
        .pool()
        .charge(PoolUse::KvCache, MIB + MIB / 2, "another model's KV pool")
        .unwrap();
    let layout = RegionLayout::whole_file(
        std::fs::metadata(airs_testdata::stories_path())
            .unwrap()
            .len(),
    );
    let err = registry
        .load(
            airs_testdata::stories_path(),
            layout,
            &LoadOptions::with_loader(LoaderKind::Eager),
        )
        .unwrap_err();
    assert_eq!(err.kind(), RegistryErrorKind::NoRoom);
    assert!(
        err.to_string().contains("KV caches and scratch (1.5 MiB"),
        "{err}"
    );
    assert_eq!(registry.pool().usage().weights_bytes, 0);
}
