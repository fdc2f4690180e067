//! Idle detection: the clock the runtime stamps every KV access with, and whether the kernel
//! offers DAMON.
//!
//! Design: §6.3 evicts interactive caches only once they are idle; the design README notes that
//! DAMON (the kernel's Data Access MONitor) needs root and a kernel built with it, while the
//! runtime itself performs every KV access — each forward pass over a session's cache — and so
//! knows exactly when each session was last used. The runtime therefore tracks idleness itself
//! ([`Clock`] timestamps on every pass) and reports DAMON's presence
//! ([`damon_available`]) as telemetry only; nothing depends on it.
//!
//! Cost: one clock read per forward pass; one `stat` for the DAMON probe.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where DAMON's sysfs admin interface lives when the kernel has it.
pub const DAMON_ADMIN_PATH: &str = "/sys/kernel/mm/damon/admin";

/// Whether the running kernel exposes DAMON's sysfs interface (telemetry only).
pub fn damon_available() -> bool {
    Path::new(DAMON_ADMIN_PATH).exists()
}

/// A monotonic clock: time since some fixed origin.
pub trait Clock: Send + Sync {
    fn now(&self) -> Duration;
}

/// Real time since the clock was made.
#[derive(Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> SystemClock {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to (tests and scripted workloads: "five minutes pass").
/// Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(
            by.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::SeqCst,
        );
    }

    pub fn set(&self, to: Duration) {
        self.nanos.store(
            to.as_nanos().min(u128::from(u64::MAX)) as u64,
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}
