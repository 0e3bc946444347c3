#!/usr/bin/env bash
# The second command of the README (and what CI runs): set up, then type-check, lint and run
# every test against real nats-servers and a real Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Docker sandbox tests run against a real engine: start one where none answers (Debian's
# docker.io) and build the agent image. In CI they must not be skipped.
bash scripts/start-docker.sh
bash scripts/build-images.sh
# The lifeline's tests run its sentinel under busybox's sh and timeout too, as in an image of busybox.
if [ ! -x /bin/busybox ]; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox >/dev/null
fi
# The TLS tests make their certificates with openssl.
if ! command -v openssl >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >/dev/null
fi
# The Go example client (examples/clients/go) is built with Debian's Go and nats.go: no module
# download, no network beyond the Debian mirror.
if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/nats-io/nats.go ]; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go golang-github-nats-io-go-nats-dev >/dev/null
fi
# The dashboard's tests drive Debian's Chromium headless (playwright-core, no browser download).
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null
fi
# The session shell's tests drive `boxcar session shell` in Debian's tmux, as a person at a terminal.
if ! command -v tmux >/dev/null; then
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q tmux >/dev/null
fi
# The Kubernetes tests render deploy/kubernetes with `kubectl kustomize`, which needs Kustomize 5+:
# this machine image's kubectl (1.32) has it. Debian 12's kubernetes-client (1.20) would not do
# (its Kustomize 2.0.3 reads no folder as a resource), so there is nothing to install: where no
# such kubectl is found the rendering tests say so and are skipped (BOXCAR_REQUIRE_KUBECTL=1 makes
# that a failure).
if [ -n "${CI:-}" ]; then export BOXCAR_REQUIRE_DOCKER=1 BOXCAR_REQUIRE_GO=1 BOXCAR_REQUIRE_BROWSER=1 BOXCAR_REQUIRE_TMUX=1; fi
export TESTCONTAINERS_RYUK_DISABLED=true
pnpm run lint
pnpm test
