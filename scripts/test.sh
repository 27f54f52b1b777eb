#!/usr/bin/env bash
# The whole test suite: unit, property, crash and real-mount tests.
# Long variants: STAGEFS_LONG_TESTS=1 scripts/test.sh
# Each target is built once (test profile), and every test binary runs even
# when one fails; the exit status is non-zero if any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-readers.sh
scripts/setup-servers.sh
exec cargo test --all-targets --no-fail-fast
