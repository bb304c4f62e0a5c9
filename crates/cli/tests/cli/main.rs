//! The `ucrypt` command line's integration tests, one test binary (each
//! file under `tests/` would be a binary of its own to link). One module per
//! area, named as its file; the helpers the areas share (`bench_common`,
//! `frontends_common`, `rbd_common`, `signals_common`) are modules of their own here, and the
//! misuse matrix keeps its rows in `misuse/`. Run one area with
//! `cargo test --release -p ucrypt-cli --test cli AREA::`.

mod bench_common;
mod frontends_common;
mod nbd_client;
mod rbd_common;
mod signals_common;

mod backing_lock;
mod bench_cli;
mod bench_file;
mod bench_rbd;
mod bench_reencrypt_online;
mod bench_vhost;
mod bitlk_images;
mod close_bounded;
mod crypt_benchmark;
mod crypt_map;
mod cryptsetup_defects;
mod cryptsetup_format_options;
mod cryptsetup_header_verbs;
mod cryptsetup_spellings;
mod crypttab_foreign;
mod docs_cli;
mod empty_passphrase;
mod exit_codes;
mod frontends_fuse;
mod frontends_luks;
mod frontends_nbd;
mod fvault2_image;
mod golden_daemon;
mod golden_luks;
mod host_unlock;
mod install;
mod keys;
mod live_verbs;
mod luks2_validation;
mod luks_cli;
mod map_luks;
mod metadata_lock;
mod misuse;
mod plain_open;
mod prompt;
mod rbd;
mod rbd_faults;
mod rbd_interop;
mod reencrypt;
mod reencrypt_compat;
mod reencrypt_device_size;
mod reencrypt_dshift;
mod reencrypt_encrypt;
mod reencrypt_luks1;
mod reencrypt_offset;
mod reencrypt_old_metadata;
mod reencrypt_online;
mod reencrypt_online_start;
mod reencrypt_plaintext;
mod reencrypt_test_passphrase;
mod reencrypt_verbose;
mod reencrypt_volume_key;
mod runtime_dir;
mod tables;
mod tcrypt_images;
