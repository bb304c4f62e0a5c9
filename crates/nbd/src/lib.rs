//! NBD server frontend (SKELETON: the frontends owner fills this in).
