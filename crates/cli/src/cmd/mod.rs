//! Subcommand groups, one module per owner crate.
pub mod bench;
pub mod crypt;
pub mod daemon;
pub mod docs;
pub mod header;
pub mod luks;
pub mod plain;
pub mod reencrypt;
pub mod tcrypt;
