//! skiff control plane (skeleton until its own issue).
