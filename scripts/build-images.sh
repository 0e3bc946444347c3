#!/usr/bin/env bash
# Builds the default agent image, boxcar-agent:latest, from Dockerfile.agent.
#
# The base image is a build argument. With a registry, use an official one:
#   BOXCAR_BASE_IMAGE=debian:bookworm-slim bash scripts/build-images.sh
# Without one (as here and in CI), a Debian base is made locally with debootstrap from the
# machine's own apt mirror and imported as boxcar-base:bookworm (about 25 s, once).
set -euo pipefail
cd "$(dirname "$0")/.."
agent_image=${BOXCAR_AGENT_IMAGE:-boxcar-agent:latest}
base=${BOXCAR_BASE_IMAGE:-}

if [ -z "$base" ]; then
  base=boxcar-base:bookworm
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || {
      echo "build-images: installing debootstrap"
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

if docker image inspect "$agent_image" >/dev/null 2>&1 && [ -z "${BOXCAR_REBUILD:-}" ] \
  && [ "$(docker image inspect -f '{{ index .Config.Labels "boxcar.dockerfile-sha256" }}' "$agent_image")" = "$(sha256sum Dockerfile.agent | cut -c1-64)" ]; then
  echo "build-images: $agent_image is up to date"
  exit 0
fi
echo "build-images: building $agent_image from $base"
docker build -q --build-arg BASE_IMAGE="$base" --label "boxcar.dockerfile-sha256=$(sha256sum Dockerfile.agent | cut -c1-64)" \
  -t "$agent_image" -f Dockerfile.agent . >/dev/null
echo "build-images: built $agent_image"
