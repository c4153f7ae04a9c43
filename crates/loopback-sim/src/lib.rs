//! Deterministic fabric simulator (under construction).
