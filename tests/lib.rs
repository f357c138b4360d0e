//! Shared helpers for the integration tests in `tests/it/`, which start real `batond`
//! processes. The helpers arrive with the server.
