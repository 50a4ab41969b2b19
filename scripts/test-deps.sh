#!/usr/bin/env bash
# What the tests need beyond scripts/deps.sh: the official Python client,
# pinned in tests/python/requirements.txt, in its own virtualenv (the
# client-compatibility tests run it). Safe to re-run: reinstalls only when
# the pins change.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q "install ok installed"; then
    echo "installing: python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq python3-venv >/dev/null
fi

VENV=/opt/skiff-test/venv
REQUIREMENTS=tests/python/requirements.txt
if ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt"; then
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$REQUIREMENTS"
    cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi
