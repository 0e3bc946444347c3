#!/usr/bin/env bash
# The first command of the README: set up, then start Boxcar (`boxcar up`: a local nats-server,
# a dispatcher and two workers) and run one demo job through it, streamed live, with its result
# and artifacts. Everything stops when the job ends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# With a Docker engine, agents that ask for a container get one: build the images they use.
if docker info >/dev/null 2>&1; then bash scripts/build-images.sh; fi
exec ./bin/boxcar up --demo --port "${BOXCAR_DEMO_PORT:-4222}" "$@"
