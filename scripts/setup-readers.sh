#!/usr/bin/env bash
# Installs the real readers the reader-view tests use (tests/readers.rs):
# DuckDB for Python, from PyPI. Safe to run again; without pip the DuckDB
# test reports SKIPPED and the other reader tests still run.
set -euo pipefail

if python3 -c 'import duckdb' >/dev/null 2>&1; then
  exit 0
fi
if ! command -v python3 >/dev/null 2>&1; then
  echo "setup-readers: python3 is missing; the DuckDB test will be skipped" >&2
  exit 0
fi
echo "setup-readers: installing duckdb (PyPI)" >&2
python3 -m pip install -q --disable-pip-version-check duckdb >/dev/null
