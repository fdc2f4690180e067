//! airs-memory
