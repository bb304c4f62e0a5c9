//! LUKS1 and LUKS2 volumes (SKELETON: the LUKS owner fills this in).
#![forbid(unsafe_code)]
