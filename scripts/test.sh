#!/usr/bin/env bash
# The second command of the README (and what CI runs): set up, then type-check, lint and run
# every test against real nats-servers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
pnpm run lint
pnpm test
