#!/usr/bin/env bash
# Installs what the real-server Unleash tests run: PostgreSQL 15 from
# Debian's packages (postgresql-15, when initdb is missing) and the
# unleash-server npm package, pinned, into the cache directory that
# internal/localserver looks in (~/.cache/throttlekit/unleash-server-<v>,
# or $THROTTLEKIT_UNLEASH_DIR). Node.js 20 and npm must be on PATH.
set -euo pipefail
version=$(sed -n 's/^const UnleashServerVersion = "\(.*\)"$/\1/p' "$(dirname "$0")/../internal/localserver/unleash.go")
dir=${THROTTLEKIT_UNLEASH_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/throttlekit/unleash-server-$version}

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "install-unleash: installing postgresql-15 with apt-get" >&2
  SUDO=; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null
  # The tests run their own cluster on a free loopback port. Reached only
  # when this run installed PostgreSQL (no initdb of any version was here),
  # so a server that was here before is never stopped.
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop postgresql >/dev/null 2>&1 || true; fi
fi

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  # Not an error: the tests that need the server skip with a line saying so.
  echo "install-unleash: no node/npm on PATH (Node.js 20 is needed); the real-Unleash tests will skip" >&2
  exit 0
fi
if [ ! -f "$dir/node_modules/unleash-server/package.json" ]; then
  mkdir -p "$dir"
  # Two installs into one cache at once break each other: one at a time.
  exec 9>"$dir.lock"
  flock 9
  if [ ! -f "$dir/node_modules/unleash-server/package.json" ]; then
    echo "install-unleash: npm install unleash-server@$version into $dir" >&2
    (cd "$dir" && npm install --no-audit --no-fund --omit=dev --loglevel=error "unleash-server@$version" >/dev/null)
  fi
fi
echo "unleash-server $version in $dir"
