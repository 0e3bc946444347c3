#!/usr/bin/env bash
# Sets up everything Boxcar needs on a fresh Debian 12 machine with Node.js 20: pnpm 10, the
# workspace's packages, a build, and a nats-server >= 2.10. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 20 ] || { echo "setup: Node.js 20 or newer is needed, found $(node --version)" >&2; exit 1; }

if ! command -v pnpm >/dev/null || [ "$(pnpm --version | cut -d. -f1)" != "10" ]; then
  echo "setup: installing pnpm 10"
  npm install -g pnpm@10 >/dev/null
fi

pnpm install --frozen-lockfile
pnpm run build
bash scripts/install-nats-server.sh
