#!/usr/bin/env bash
# Installs the real readers the reader-view and engine tests use
# (tests/readers.rs, tests/engines.rs): DuckDB, pyarrow, pandas and
# pyspark for Python, from PyPI. Safe to run again. Those tests fail, saying to run
# this script, when a package is missing; pyspark also needs a Java 17 or
# 21 runtime on PATH (this script says so when `java` is missing, it does
# not install one).
set -euo pipefail

if ! command -v python3 >/dev/null 2>&1; then
  echo "setup-readers: python3 is missing; tests/readers.rs and tests/engines.rs need it" >&2
  exit 1
fi
missing=()
for pkg in duckdb pyarrow pandas pyspark; do
  if ! python3 -c "import $pkg" >/dev/null 2>&1; then
    missing+=("$pkg")
  fi
done
if ((${#missing[@]})); then
  echo "setup-readers: installing ${missing[*]} (PyPI)" >&2
  python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore "${missing[@]}" >/dev/null
fi
if ! command -v java >/dev/null 2>&1; then
  echo "setup-readers: java is missing: the Spark tests (tests/engines.rs) need a Java 17 or 21 runtime, e.g. apt-get install openjdk-17-jre-headless" >&2
fi
