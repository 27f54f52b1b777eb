#!/usr/bin/env bash
# Installs what stagefs's demo and tests need on a fresh Debian machine
# (as root): the `attr` tools (getfattr/setfattr), fuse3's helpers, Python's
# prometheus_client (the metrics test's parser), and the
# PostgreSQL and MariaDB servers and clients that the Hive metastore tests
# start private instances of (tests/common/dbserver.rs; the machine's own
# instances are never started or used).
# Safe to run again: it installs only what is missing.
set -euo pipefail

have_postgres_server() {
  compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null
}

missing=()
command -v getfattr >/dev/null 2>&1 || missing+=(attr)
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
have_postgres_server || missing+=(postgresql)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
# The metastore TLS tests (tests/metastore_tls.rs) make their CA and server
# certificates with the openssl command.
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# The metrics test (tests/metrics.rs) parses /metrics with the Prometheus
# client's own text-format parser, for /usr/bin/python3.
/usr/bin/python3 -c 'import prometheus_client.parser' >/dev/null 2>&1 || missing+=(python3-prometheus-client)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install: ${missing[*]} (needs root)" >&2
  else
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    # The packages' post-install scripts start the distribution's own server
    # instances; the tests never use them, so keep them from starting.
    policy=/usr/sbin/policy-rc.d
    created_policy=
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy"
      chmod +x "$policy"
      created_policy=1
    fi
    apt-get update -qq >/dev/null
    status=0
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || status=$?
    [ -n "$created_policy" ] && rm -f "$policy"
    [ "$status" -eq 0 ] || exit "$status"
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
# The non-root mount tests (tests/non_root.rs) mount as this ordinary user,
# and need `user_allow_other` for its --allow-other mount. fusermount3 must
# be setuid root (the fuse3 package installs it so).
if [ "$(id -u)" -eq 0 ]; then
  id stagefs-test >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin stagefs-test
  if [ -f /etc/fuse.conf ] && ! grep -q '^user_allow_other' /etc/fuse.conf; then
    echo user_allow_other >> /etc/fuse.conf
  fi
  # Debian's udev gives /dev/fuse mode 0666; machines without udev leave it
  # 0600, and then even the setuid fusermount3 cannot open it for a user.
  if [ -e /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" != 666 ]; then chmod 0666 /dev/fuse; fi
  fm=$(command -v fusermount3 || true)
  if [ -n "$fm" ] && [ ! -u "$fm" ]; then chmod u+s "$fm"; fi
fi
