//! The traffic/time study behind `cargo xtask figures`.
