#!/bin/sh
# The NATS servers' first process in the Compose cluster: runs nats-server, and runs it again
# when it stops on its own (the health check, nats-health.mjs, stops a server the cluster's
# JetStream group left out, so that it joins on its return) without the container exiting, so
# `docker-compose up` keeps waiting for it to be healthy. SIGTERM (docker-compose stop) stops
# the server, which drains as usual, and this loop with it.
stopping=""
trap 'stopping=1; kill -TERM "$pid" 2>/dev/null' TERM INT
while :; do
  nats-server -c /etc/nats/nats.conf &
  pid=$!
  wait "$pid"
  if [ -n "$stopping" ]; then
    wait "$pid" 2>/dev/null
    exit 0
  fi
  echo "nats-run: nats-server stopped; starting it again" >&2
  sleep 1
done
