#!/usr/bin/env bash
# Installs what stagefs's demo and tests need on a fresh Debian machine
# (as root): the `attr` tools (getfattr/setfattr) and fuse3's helpers.
# Safe to run again: it installs only what is missing.
set -euo pipefail

missing=()
command -v getfattr >/dev/null 2>&1 || missing+=(attr)
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install: ${missing[*]} (needs root)" >&2
  else
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
if [ ! -e /dev/fuse ]; then
  echo "setup: /dev/fuse is missing; load the fuse module (modprobe fuse)" >&2
  exit 1
fi
# The fuse control filesystem lets tests abort a stuck connection.
if [ -d /sys/fs/fuse/connections ] && ! mountpoint -q /sys/fs/fuse/connections; then
  mount -t fusectl none /sys/fs/fuse/connections 2>/dev/null || true
fi
