//! (temporary) recorded graphs' analysis
pub(crate) mod dag;
pub(crate) mod dot;
pub(crate) mod plan;
