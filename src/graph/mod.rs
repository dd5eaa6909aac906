//! (temporary) recorded graphs' analysis
pub(crate) mod dag;
pub(crate) mod plan;
