//! Executor unit tests.
