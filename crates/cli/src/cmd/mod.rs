//! Subcommand groups, one module per owner crate.
pub mod bench;
pub mod bitlk;
pub mod crypt;
pub mod daemon;
pub mod docs;
pub mod fvault2;
pub mod header;
pub mod kdf;
pub mod luks;
pub mod plain;
pub mod reencrypt;
mod reencrypt_dshift;
mod reencrypt_luks1;
mod reencrypt_offset;
mod reencrypt_online;
pub mod serve;
pub mod tcrypt;
pub mod tokens;
