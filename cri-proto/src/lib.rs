//! CRI v1 types and client (being written).
