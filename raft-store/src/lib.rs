//! Baton's replicated state: the pure lease state machine (`machine`) and, around it, the
//! openraft storage on sled.
pub mod machine;
pub mod store;
