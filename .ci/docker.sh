#!/usr/bin/env bash
# A Docker engine for the tests' testcontainers path, on a machine that can
# reach no image registry:
#
#   .ci/docker.sh start   start dockerd on a socket of its own; prints the
#                         DOCKER_HOST line to export
#   .ci/docker.sh image   assemble the PostgreSQL image from the binaries
#                         installed here; prints its name
#   .ci/docker.sh stop    stop that dockerd and remove its files
#
# dockerd runs with --iptables=false --ip-masq=false and keeps its default
# bridge network: without one, testcontainers would create a bridge network
# of its own and attach containers to it. No container is ever attached to a
# bridge: the tests use host networking (PGLIMIT_TEST_DOCKER_NETWORK=host), so
# every connection stays on 127.0.0.1. Its own socket, data and state
# directories keep it apart from any other engine on the machine.
set -euo pipefail

state=${PGLIMIT_DOCKER_STATE:-/tmp/pglimit-docker}
sock="$state/docker.sock"
export DOCKER_HOST="unix://$sock"
pg_major=${PG_MAJOR:-15}
image="pglimit/postgres-local:$pg_major"

start() {
  command -v dockerd >/dev/null || { echo "dockerd not found: apt-get install docker.io" >&2; exit 1; }
  if docker version >/dev/null 2>&1; then
    echo "export DOCKER_HOST=$DOCKER_HOST"; return
  fi
  mkdir -p "$state"
  # setsid: the engine outlives this script, and a Ctrl-C aimed at the
  # tests does not reach it.
  setsid dockerd --host "$DOCKER_HOST" --data-root "$state/data" --exec-root "$state/exec" \
    --pidfile "$state/dockerd.pid" --iptables=false --ip-masq=false \
    >"$state/dockerd.log" 2>&1 </dev/null &
  for _ in $(seq 120); do
    if docker version >/dev/null 2>&1; then
      echo "docker: engine $(docker version -f '{{.Server.Version}}') ready, storage driver $(docker info -f '{{.Driver}}')" >&2
      echo "export DOCKER_HOST=$DOCKER_HOST"; return
    fi
    sleep 0.5
  done
  echo "dockerd did not answer within 60 s; its log:" >&2
  tail -30 "$state/dockerd.log" >&2
  exit 1
}

stop() {
  [ -f "$state/dockerd.pid" ] || return 0
  local pid
  pid=$(cat "$state/dockerd.pid")
  # Containers left by a crashed test would otherwise hold the data root.
  docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1 || true
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  # dockerd leaves mounts behind (its network namespace, overlays): deepest first.
  awk -v s="$state/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
  rm -rf "$state"
}

# image builds a root filesystem holding PostgreSQL's binaries, the shared
# libraries they link, a shell and an entrypoint that behaves like the
# official postgres image's for what testcontainers' postgres module uses,
# and imports it.
image() {
  local bin=/usr/lib/postgresql/$pg_major/bin
  [ -x "$bin/postgres" ] || { echo "no $bin/postgres: apt-get install postgresql-$pg_major" >&2; exit 1; }
  if docker image inspect "$image" >/dev/null 2>&1; then
    echo "$image"; return
  fi
  local root
  root=$(mktemp -d)

  local files=("$bin"/{postgres,initdb,pg_ctl,psql} /bin/sh /bin/dash)
  # Extensions and encodings; not the LLVM JIT (a few hundred MB of LLVM,
  # and PostgreSQL runs without it).
  for f in /usr/lib/postgresql/"$pg_major"/lib/*.so; do
    case "$f" in */llvmjit*) ;; *) files+=("$f") ;; esac
  done
  local libs
  libs=$(for f in "${files[@]}"; do ldd "$f" 2>/dev/null || true; done |
    awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }' | sort -u)
  # From /, with relative paths: cp --parents then recreates the same paths
  # under $root.
  (
    cd /
    for f in "${files[@]}" $libs; do
      cp --parents -L "${f#/}" "$root"
    done
    cp -a --parents usr/share/postgresql/"$pg_major" usr/share/zoneinfo "$root"
  )

  mkdir -p "$root"/{etc,tmp,var/run/postgresql,var/lib/postgresql/data,usr/local/bin}
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\npostgres:x:999:999:PostgreSQL:/var/lib/postgresql:/bin/sh\n' >"$root/etc/passwd"
  printf 'root:x:0:\npostgres:x:999:\n' >"$root/etc/group"
  chown -R 999:999 "$root/var/run/postgresql" "$root/var/lib/postgresql"
  chmod 700 "$root/var/lib/postgresql/data"
  cat >"$root/usr/local/bin/docker-entrypoint.sh" <<'SH'
#!/bin/sh
# The official image's contract, as far as testcontainers uses it: the
# cluster is initialised on first start from POSTGRES_USER,
# POSTGRES_PASSWORD and POSTGRES_DB through a temporary server, then the
# real server starts; so "database system is ready to accept connections"
# is logged twice. Arguments are postgres's (a leading "postgres" is
# dropped).
set -e
if [ "$1" = postgres ]; then shift; fi
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}" >/tmp/pwfile
  initdb -D "$PGDATA" -U "$user" --pwfile=/tmp/pwfile --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-locale
  : >/tmp/pwfile
  pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
  if [ "$db" != postgres ]; then
    psql -v ON_ERROR_STOP=1 -U "$user" -d postgres -c "CREATE DATABASE \"$db\""
  fi
  pg_ctl -D "$PGDATA" -m fast -w stop
fi
# docker stop sends SIGTERM, which postgres takes as a smart shutdown that
# waits for every client; the official image asks for SIGINT (a fast
# shutdown) with STOPSIGNAL, which docker import cannot set, so the shell
# stays as PID 1 to translate.
postgres -D "$PGDATA" "$@" &
pid=$!
trap 'kill -INT "$pid"' TERM INT
while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
SH
  chmod 755 "$root/usr/local/bin/docker-entrypoint.sh"

  tar --numeric-owner -C "$root" -c . | docker import \
    --change "ENV PATH=/usr/lib/postgresql/$pg_major/bin:/usr/local/bin:/usr/bin:/bin" \
    --change 'ENV PGDATA=/var/lib/postgresql/data' \
    --change 'USER postgres' \
    --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
    --change 'CMD ["postgres"]' \
    - "$image" >/dev/null
  rm -rf "$root"
  echo "docker: imported $image ($(docker image inspect -f '{{.Size}}' "$image") bytes) from $bin" >&2
  echo "$image"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  image) image ;;
  *) echo "usage: $0 start|image|stop" >&2; exit 2 ;;
esac
