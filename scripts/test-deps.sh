#!/usr/bin/env bash
# What the tests need beyond scripts/deps.sh: the distribution registry
# server (docker-registry, for the private-registry tests) and the official
# Python client, pinned in tests/python/requirements.txt, in its own
# virtualenv (the client-compatibility tests run it). Safe to re-run:
# installs only missing packages, reinstalls the client only when the pins
# change.
set -euo pipefail
cd "$(dirname "$0")/.."

# docker-registry: the CNCF distribution registry the private-registry
# tests (tests/src/distribution.rs) serve with TLS and htpasswd auth.
missing=()
for pkg in python3-venv docker-registry; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=/opt/skiff-test/venv
REQUIREMENTS=tests/python/requirements.txt
if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt"; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS"
    cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi
