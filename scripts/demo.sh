#!/usr/bin/env bash
# The demo: builds stagefs and runs `stagefs demo [MOUNTPOINT]`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo run --release --quiet -- demo "$@"
