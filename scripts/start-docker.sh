#!/usr/bin/env bash
# Makes sure a Docker engine answers (and docker-compose is there, for deploy/compose): where none does, installs Debian's docker.io if needed and
# starts dockerd in the background, letting it pick its storage driver (overlay2 where the kernel
# has overlayfs) and falling back to vfs, which works everywhere but copies whole images per
# container. BOXCAR_DOCKER_STORAGE_DRIVER forces one. Logs go to .boxcar/dockerd.log.
set -euo pipefail
cd "$(dirname "$0")/.."
# deploy/compose is tested with Debian's docker-compose (1.29); Compose v2 works as well.
if ! command -v docker-compose >/dev/null && ! docker compose version >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  echo "start-docker: installing docker-compose"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker-compose >/dev/null
fi
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null; then
  command -v apt-get >/dev/null || { echo "start-docker: no Docker engine and no apt-get to install one" >&2; exit 1; }
  echo "start-docker: installing docker.io"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io >/dev/null
fi
mkdir -p .boxcar

start() { # $@: extra dockerd flags; true once the engine answers
  echo "start-docker: starting dockerd $* (log: .boxcar/dockerd.log)"
  nohup dockerd "$@" >>.boxcar/dockerd.log 2>&1 &
  local pid=$!
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.5
  done
  kill "$pid" 2>/dev/null || true
  return 1
}

if [ -n "${BOXCAR_DOCKER_STORAGE_DRIVER:-}" ]; then
  start --storage-driver="$BOXCAR_DOCKER_STORAGE_DRIVER" && exit 0
else
  start && exit 0
  start --storage-driver=vfs && exit 0
fi
echo "start-docker: dockerd did not answer within 30 s; see .boxcar/dockerd.log" >&2
exit 1
