#!/usr/bin/env bash
# The whole test suite: unit, property, crash and real-mount tests.
# Long variants: STAGEFS_LONG_TESTS=1 scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-readers.sh
scripts/setup-servers.sh
cargo build --all-targets
cargo test --all-targets
