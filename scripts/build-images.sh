#!/usr/bin/env bash
# Builds the images Boxcar uses: boxcar-agent:latest (Dockerfile.agent), the default image agents
# run in, and boxcar-worker:latest (Dockerfile.worker), Boxcar's roles in a container.
#
# The base image is a build argument. With a registry, use an official one:
#   BOXCAR_BASE_IMAGE=debian:bookworm-slim bash scripts/build-images.sh
# Without one (as here and in CI), a Debian base is made locally with debootstrap from the
# machine's own apt mirror and imported as boxcar-base:bookworm (about 25 s, once).
set -euo pipefail
cd "$(dirname "$0")/.."

# docker build, quiet unless it fails (the legacy builder prints a deprecation notice every time).
build() {
  local out
  out=$(docker build -q "$@" 2>&1) || { echo "$out" >&2; return 1; }
}
agent_image=${BOXCAR_AGENT_IMAGE:-boxcar-agent:latest}
base=${BOXCAR_BASE_IMAGE:-}

if [ -z "$base" ]; then
  base=boxcar-base:bookworm
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || {
      echo "build-images: installing debootstrap"
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    }
    mirror=$(grep -hoE '^(URIs:|deb)[[:space:]]+[^[:space:]]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
      | awk '{print $2}' | grep -vE "security|nodesource|google" | grep -E "/debian/?$" | head -1 || true)
    [ -n "$mirror" ] || { echo "build-images: no Debian mirror in /etc/apt sources; set BOXCAR_BASE_IMAGE" >&2; exit 1; }
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    echo "build-images: debootstrap bookworm from $mirror"
    debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    chmod 0755 "$rootfs" # mktemp made it 0700: the image's / must be traversable by its users
    tar -C "$rootfs" -c . | docker import - "$base" >/dev/null
    echo "build-images: imported $base"
  fi
fi

# The image is rebuilt when its Dockerfile or the file it copies changes.
dockerfile_sum=$(cat Dockerfile.agent scripts/boxcar-usage | sha256sum | cut -c1-64)
if [ -z "${BOXCAR_REBUILD:-}" ] && docker image inspect "$agent_image" >/dev/null 2>&1 \
  && [ "$(docker image inspect -f '{{ index .Config.Labels "boxcar.dockerfile-sha256" }}' "$agent_image")" = "$dockerfile_sum" ]; then
  echo "build-images: $agent_image is up to date"
else
  echo "build-images: building $agent_image from $base"
  build --build-arg BASE_IMAGE="$base" --label "boxcar.dockerfile-sha256=$dockerfile_sum" \
    -t "$agent_image" -f Dockerfile.agent .
  echo "build-images: built $agent_image"
fi

# The worker image (and the NATS image of deploy/compose) needs Node.js 20. Without a registry, copy this machine's node into the base.
node_image=${BOXCAR_NODE_IMAGE:-}
context=.boxcar/image
rm -rf "$context" && mkdir -p "$context"
if [ -z "$node_image" ]; then
  node_image=boxcar-node:20
  cp "$(command -v node)" "$context/node"
  printf 'ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nCOPY node /usr/local/bin/node\n' >"$context/Dockerfile.node"
  build --build-arg BASE_IMAGE="$base" -t "$node_image" -f "$context/Dockerfile.node" "$context"
  rm "$context/node" "$context/Dockerfile.node"
fi
pnpm --silent --filter @boxcar/cli deploy --prod --legacy "$context/app" >/dev/null
build --build-arg NODE_IMAGE="$node_image" -t "${BOXCAR_WORKER_IMAGE:-boxcar-worker:latest}" -f Dockerfile.worker "$context"
echo "build-images: built ${BOXCAR_WORKER_IMAGE:-boxcar-worker:latest} on $node_image"

# nats-server in an image, for the Compose cluster (deploy/compose): the binary the set-up fetched.
nats_bin=${BOXCAR_NATS_SERVER:-.boxcar/tools/bin/nats-server}
[ -x "$nats_bin" ] || nats_bin=$(command -v nats-server || true)
[ -n "$nats_bin" ] || { echo "build-images: no nats-server for the NATS image; run scripts/install-nats-server.sh" >&2; exit 1; }
rm -rf "$context" && mkdir -p "$context"
cp "$nats_bin" "$context/nats-server"
build --build-arg BASE_IMAGE="$node_image" -t "${BOXCAR_NATS_IMAGE:-boxcar-nats:latest}" -f Dockerfile.nats "$context"
rm -rf "$context"
echo "build-images: built ${BOXCAR_NATS_IMAGE:-boxcar-nats:latest} ($("$nats_bin" --version))"
