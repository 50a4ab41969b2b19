#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and end-to-end tests against a
# private containerd, real etcd and real kubectl that the tests start and
# remove themselves. Needs root. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/test-deps.sh
[ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"

# A clean build gains nothing from incremental state, which would add
# gigabytes to target/ beside the test binaries.
export CARGO_INCREMENTAL=0
# Build everything first so the e2e tests find the binaries they run.
cargo build --workspace --bins --tests --quiet
# The e2e fixtures run these; given here, they do not run cargo themselves
# (a per-package build would resolve features differently and rebuild).
export SKIFF_AGENT_BIN=$PWD/target/debug/skiff-agent SKIFF_SERVER_BIN=$PWD/target/debug/skiff-server
# Two test threads on two cores: each e2e test starts its own containerd.
cargo test --workspace --no-fail-fast -- --test-threads=2
