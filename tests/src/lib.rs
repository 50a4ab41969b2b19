//! e2e harness (being written).
