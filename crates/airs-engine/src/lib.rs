//! airs-engine
