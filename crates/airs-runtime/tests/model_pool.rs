//! One model pool: a model's weights (through the registry), its scheduler's KV pool and its
//! forward-step scratch are charged to one account, enforced at run time — a scheduler whose
//! KV pool does not fit beside the weights fails at start, naming what holds the pool, and a
//! model load does not take memory KV caches hold. Every charge is returned when its owner
//! goes away. Runs on the real stories260K file.

use std::sync::Arc;

use airs_memory::{
    LoadOptions, LoaderKind, ModelRegistry, PinPolicy, PoolUse, RegionLayout, RegistryErrorKind,
};
use airs_runtime::{
    GenerationParams, HistoryStore, LoadedModel, Request, RuntimeErrorKind, Scheduler,
    SchedulerConfig,
};

const MIB: u64 = 1 << 20;

fn weights_charge() -> u64 {
    let len = std::fs::metadata(airs_testdata::stories_path())
        .unwrap()
        .len();
    let page = airs_memory::page_size() as u64;
    len.div_ceil(page) * page
}

fn load(registry: &Arc<ModelRegistry>) -> Arc<LoadedModel> {
    Arc::new(
        LoadedModel::load(
            registry,
            &airs_testdata::stories_path(),
            &LoadOptions::with_loader(LoaderKind::Eager),
            1,
        )
        .unwrap(),
    )
}

fn config(kv_bytes: u64) -> SchedulerConfig {
    let mut c = SchedulerConfig::new(kv_bytes as usize);
    c.pin = PinPolicy::None;
    c
}

#[test]
fn weights_kv_pool_and_scratch_share_one_account_and_are_returned() {
    let registry = Arc::new(ModelRegistry::new(16 * MIB));
    let engine = load(&registry);
    let weights = weights_charge();
    assert_eq!(registry.pool().usage().weights_bytes, weights);

    let mut scheduler = Scheduler::new(
        engine,
        config(MIB),
        Some(HistoryStore::open_in_memory().unwrap()),
    )
    .unwrap();
    let kv = scheduler.kv_pool().stats();
    let u = registry.pool().usage();
    assert_eq!(u.weights_bytes, weights);
    assert_eq!(
        u.kv_cache_bytes,
        (kv.blocks_total as usize * kv.block_bytes) as u64
    );
    assert!(u.kv_cache_bytes <= MIB && u.kv_cache_bytes > MIB / 2);
    assert!(u.scratch_bytes > 0);
    assert_eq!(u.capacity_bytes, 16 * MIB);
    assert_eq!(
        u.free_bytes(),
        16 * MIB - weights - u.kv_cache_bytes - u.scratch_bytes
    );

    // Serving allocates KV blocks inside the charged pool: the account does not move.
    let params = GenerationParams {
        max_tokens: 8,
        ..GenerationParams::default()
    };
    let reply = scheduler
        .serve(Request::turn("a", "Once upon a time", params))
        .unwrap();
    assert!(!reply.first().tokens.is_empty());
    assert_eq!(registry.pool().usage(), u);

    // The scheduler (and the model it holds) gone: KV and scratch come back; the registry
    // still holds the model, now evictable, and unloading it empties the account.
    drop(scheduler);
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
    let err = Scheduler::new(engine, config(4 * MIB), None).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(err.kind(), RuntimeErrorKind::Engine(_)),
        "{message}"
    );
    assert!(message.contains("KV pool"), "{message}");
    assert!(message.contains("stories260K.gguf"), "{message}");
    assert!(message.contains("weights"), "{message}");
    // Nothing of the failed scheduler stays charged (the model went with it).
    let u = registry.pool().usage();
    assert_eq!((u.kv_cache_bytes, u.scratch_bytes), (0, 0));

    // The same KV pool in a pool with room: starts.
    let engine = load(&registry);
    Scheduler::new(engine, config(MIB), None).unwrap();
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

/// Two real models share one pool through the registry: a load that needs room evicts the least
/// recently used model no engine holds, never a held one or a floor; a model that can never fit
/// fails up front with the numbers.
#[test]
fn real_models_share_the_pool_lru_unheld_evicted_floors_kept() {
    let qwen = airs_testdata::qwen_path();
    let stories = airs_testdata::stories_path();
    let copy = std::env::temp_dir().join(format!("airs-pool-{}-copy.gguf", std::process::id()));
    std::fs::copy(&stories, &copy).unwrap();
    let page = airs_memory::page_size() as u64;
    let charge = |p: &std::path::Path| std::fs::metadata(p).unwrap().len().div_ceil(page) * page;
    // Room for Qwen and one stories260K, not two.
    let pool = charge(&qwen) + charge(&stories) + charge(&stories) / 2;
    let registry = Arc::new(ModelRegistry::new(pool));
    let eager = LoadOptions::with_loader(LoaderKind::Eager);
    let load = |p: &std::path::Path| LoadedModel::load(&registry, p, &eager, 1).unwrap();
    let paths = |r: &ModelRegistry| -> Vec<String> {
        r.models()
            .iter()
            .map(|m| m.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    let qwen_name = qwen.file_name().unwrap().to_string_lossy().into_owned();
    let copy_name = copy.file_name().unwrap().to_string_lossy().into_owned();

    let e_qwen = load(&qwen);
    drop(load(&stories));
    // Qwen is held by its engine; stories260K is not: the copy evicts stories260K.
    let e_copy = load(&copy);
    assert_eq!(paths(&registry), [qwen_name.clone(), copy_name.clone()]);
    drop(e_copy);

    // Qwen is now the least recently used and unheld, but a floor: stories260K evicts the copy.
    let qwen_id = registry.find(&qwen).unwrap();
    registry.set_floor(qwen_id, true).unwrap();
    drop(e_qwen);
    let _e_stories = load(&stories);
    assert_eq!(
        paths(&registry),
        [qwen_name, "stories260K.gguf".to_string()]
    );
    assert!(registry.pool().used_bytes() <= pool);

    // A pool smaller than Qwen's weights: refused before anything is read.
    let small = Arc::new(ModelRegistry::new(100 << 20));
    let err = LoadedModel::load(&small, &qwen, &eager, 1).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("but the model pool holds 100 MiB"),
        "{message}"
    );
    assert_eq!(small.pool().used_bytes(), 0);
    let _ = std::fs::remove_file(&copy);
}

/// The weights stay charged as long as anything holds the region, even past the registry that
/// loaded them: the account never shows memory free that a session still uses.
#[test]
fn weights_stay_charged_while_held_even_after_the_registry_is_gone() {
    let registry = Arc::new(ModelRegistry::new(16 * MIB));
    let account = registry.pool().clone();
    let engine = load(&registry);
    drop(registry);
    assert_eq!(account.usage().weights_bytes, weights_charge());
    drop(engine);
    assert_eq!(account.used_bytes(), 0);
}
