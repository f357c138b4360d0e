//! Client library for Baton.
pub mod api;
