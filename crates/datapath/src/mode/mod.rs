//! The three data-path modes; see each module's diagram.

pub(crate) mod adaptive;
pub(crate) mod classic;
pub(crate) mod gather;
pub(crate) mod inline;
