#!/usr/bin/env bash
# Runs a command with other sessions' background builds paused, so a short
# measurement sees a quieter machine: every process named rustc, cc, ld or
# cargo whose nice value is 19 and whose working directory is not under
# $KEEP (default: this repository's top) is sent SIGSTOP, and SIGCONT when
# the command ends, fails or is interrupted, or after at most $MAX_S
# seconds (default 170), whichever comes first (the command is then
# killed). Usage: scripts/bench/paused.sh COMMAND [ARGS...]
set -u
KEEP=${KEEP:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
MAX_S=${MAX_S:-170}
stopped=()
resume() {
    for p in "${stopped[@]}"; do kill -CONT "$p" 2>/dev/null; done
    stopped=()
}
trap resume EXIT
trap 'resume; exit 130' INT TERM
for p in $(pgrep -x 'rustc|cc|ld|cargo'); do
    [ "$(ps -o ni= -p "$p" 2>/dev/null | tr -d ' ')" = 19 ] || continue
    cwd=$(readlink "/proc/$p/cwd" 2>/dev/null) || continue
    case "$cwd/" in "$KEEP"/*) continue ;; esac
    kill -STOP "$p" 2>/dev/null && stopped+=("$p")
done
echo "paused ${#stopped[@]} builds: ${stopped[*]:-none}; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
timeout --signal=TERM "$MAX_S" "$@"
rc=$?
resume
exit $rc
