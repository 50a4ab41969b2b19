#!/usr/bin/env bash
# Installs the system packages skiff needs (Debian/Ubuntu), only the missing
# ones, and checks the Rust toolchain. Safe to re-run.
set -euo pipefail

# systemd, systemd-container, dbus-daemon, openssl: the systemd tests
# (systemd-analyze, a systemd-nspawn container with systemd as PID 1, a
# private bus for graceful node shutdown, the served serving certificate).
# crun: a second OCI runtime, containerd's `crun` handler for RuntimeClasses.
PACKAGES=(containerd runc crun containernetworking-plugins nftables iptables iproute2
          busybox-static etcd-server etcd-client protobuf-compiler gcc libc6-dev ca-certificates curl conntrack
          bind9-dnsutils systemd systemd-container dbus-daemon openssl)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
    [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "cargo not found: install a Rust toolchain (rustup) first" >&2; exit 1; }
