#!/usr/bin/env bash
# Installs a nats-server >= 2.10 into BOXCAR_TOOLS (default: .boxcar/tools/bin in the repo)
# unless one is already on PATH or there. Debian 12 ships 2.9; Debian 13's 2.10 binary runs on
# Debian 12, so we download the .deb from the trixie suite of the mirror this machine already
# uses (read from its own apt sources) and unpack it without installing it system-wide.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${BOXCAR_TOOLS:-$root/.boxcar/tools}/bin
mkdir -p "$dest"

version_ok() { # $1 = binary; true when it reports >= 2.10
  local v
  v=$("$1" --version 2>/dev/null | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -1) || return 1
  [ -n "$v" ] || return 1
  local major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  [ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 10 ]; }
}

for candidate in "$dest/nats-server" "$(command -v nats-server 2>/dev/null || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && version_ok "$candidate"; then
    echo "nats-server: $candidate ($("$candidate" --version))"
    exit 0
  fi
done

command -v apt-get >/dev/null || { echo "install-nats-server: no nats-server >= 2.10 on PATH and no apt-get to fetch one; install nats-server 2.10+ and retry" >&2; exit 1; }

# The mirror this machine already trusts, from its own apt configuration.
mirror=$(grep -hoE '^(URIs:|deb)[[:space:]]+[^[:space:]]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | awk '{print $2}' | grep -vE "security|nodesource|google" | grep -E "/debian/?$" | head -1 || true)
[ -n "$mirror" ] || { echo "install-nats-server: cannot find a Debian mirror in /etc/apt sources" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
echo "deb $mirror trixie main" > "$work/trixie.list"
apt_opts=(-o Dir::Etc::SourceList="$work/trixie.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root -q)
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$work" && apt-get "${apt_opts[@]}" download nats-server >/dev/null 2>&1)
dpkg -x "$work"/nats-server_*.deb "$work/x"
install -m 0755 "$work/x/usr/sbin/nats-server" "$dest/nats-server"
version_ok "$dest/nats-server" || { echo "install-nats-server: downloaded binary is older than 2.10" >&2; exit 1; }
echo "nats-server: $dest/nats-server ($("$dest/nats-server" --version))"
