#!/usr/bin/env bash
# Installs Debian's redis-server for `pnpm bench`'s BullMQ path, unless one is on PATH already.
# Without apt-get (not Debian, or not root) it says so and the bench skips BullMQ, saying so too.
set -euo pipefail
if command -v redis-server >/dev/null; then exit 0; fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" -ne 0 ]; then
  echo "install-redis: no redis-server on PATH and no apt-get as root to install it; the bench skips BullMQ" >&2
  exit 0
fi
apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null
# The package starts a system service; the bench starts a redis-server of its own.
(service redis-server stop || true) >/dev/null 2>&1
echo "install-redis: $(redis-server --version | head -1)"
