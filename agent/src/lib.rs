//! skiff-agent
