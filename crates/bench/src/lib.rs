//! `ucrypt bench` (SKELETON: the bench owner fills this in).
