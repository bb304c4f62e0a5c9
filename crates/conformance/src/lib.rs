//! Tests across frontends, kept out of the frontends themselves so that no
//! frontend depends on another (not even for its tests). The crate has no
//! code of its own; its tests are:
//!
//! * `tests/bad_requests.rs`: one table of requests the engine must refuse,
//!   sent through NBD, ublk (its translation), vhost-user-blk (libblkio)
//!   and FUSE, each answering with the errno of the engine's one table
//!   (`datapath::Error::errno`) in its own vocabulary.
#![forbid(unsafe_code)]
