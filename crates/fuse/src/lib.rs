//! FUSE single-file export (SKELETON: the frontends owner fills this in).
