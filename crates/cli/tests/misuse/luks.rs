//! Misuse rows: luks.

use crate::harness::Row;

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![]
}
