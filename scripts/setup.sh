#!/usr/bin/env bash
# Sets up a fresh machine for specbeam: Debian libraries, .venv, editable install.
# Running it again when nothing changed takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

# libsndfile1: fairseq2n refuses to import without it.
# sword-text-*: the Bible modules the embedded task is built from (and its tests read).
# g++: builds the lean decoders' native layers (specbeam/search/native.py).
DEBIAN_PACKAGES=(libsndfile1 sword-text-sparv sword-text-kjv g++)

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
        apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null && apt-get install -y -q "${missing[@]}" >/dev/null; }
    else
        echo "error: missing Debian packages ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

PY=${PYTHON:-python3}
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv

# Reinstall only when the project's dependency declaration changed.
stamp=.venv/.specbeam-install-stamp
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[test]'
    echo "$want" >"$stamp"
fi

# The native layers (lean decoder, acceptance), built once (about a minute) so that no app
# waits for them; where they cannot be built, the apps run them in Python.
.venv/bin/python -m specbeam.build_native \
    || echo "warning: the native layers were not built; decoding runs them in Python" >&2
