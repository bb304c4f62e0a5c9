//! Subcommand groups, one module per owner crate.
pub mod bench;
pub mod crypt;
pub mod daemon;
pub mod luks;
pub mod plain;
