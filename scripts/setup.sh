#!/usr/bin/env bash
# Sets up a fresh machine for specbeam: Debian libraries, .venv, editable install.
#     scripts/setup.sh        # PYTHON=python3.12 scripts/setup.sh picks the new .venv's Python
# (An install elsewhere needs libsndfile1, g++ and `pip install .`: docs/usage.md, Installing.)
# Running it again when nothing changed takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

# Required: libsndfile1 (fairseq2n refuses to import without it); g++ builds the lean
# decoders' native layers (specbeam/kernels/native.py), which the tests check.
# Optional: sword-text-*, the Bible modules the embedded task is built from, read only by a
# rebuild (tasks/bible_es_en/prepare.py) and its test, not by translation; SLURM, munge and
# MariaDB, the one-node cluster tests/apps/test_slurm.py starts (as root) to run the shard
# sweep on (it starts its own daemons, on free ports, beside any the system runs).
REQUIRED=(libsndfile1 g++)
OPTIONAL=(sword-text-sparv sword-text-kjv slurm-wlm slurmdbd munge mariadb-server)

missing() { for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || echo "$pkg"; done; }
mapfile -t missing_required < <(missing "${REQUIRED[@]}")
mapfile -t missing_optional < <(missing "${OPTIONAL[@]}")
todo=("${missing_required[@]}" "${missing_optional[@]}")
if ((${#todo[@]})) && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive # mariadb-server and slurm ask nothing then
    apt-get install -y -q "${todo[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q "${todo[@]}" >/dev/null; }
elif ((${#missing_required[@]})); then
    echo "error: missing Debian packages ${missing_required[*]}; run: sudo apt-get install -y ${todo[*]}" >&2
    exit 1
elif ((${#missing_optional[@]})); then
    echo "warning: optional Debian packages ${missing_optional[*]} are missing (installing them" \
        "needs root and apt-get): translation works, but the tests that need them (rebuilding" \
        "the embedded task's data, the SLURM cluster) are skipped; run: sudo apt-get install" \
        "-y ${missing_optional[*]}" >&2
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

# The native layers (lean decoder, acceptance), built once (about two minutes on 2 cores) so that no app
# waits for them; where they cannot be built, the apps run them in Python.
.venv/bin/python -m specbeam.build_native \
    || echo "warning: the native layers were not built; decoding runs them in Python" >&2
