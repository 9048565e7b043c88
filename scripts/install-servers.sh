#!/usr/bin/env bash
# Installs the real servers the tests and the demo run (redis-server 7.x,
# redis-cli, memcached) from Debian's packages when they are missing.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-servers: installing ${missing[*]} with apt-get" >&2
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-servers: need root (or sudo) to apt-get install ${missing[*]}; install them yourself, or run 'make demo-embedded'" >&2
    exit 1
  fi
else SUDO=; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-servers: no apt-get here; install ${missing[*]} with your package manager, or run 'make demo-embedded'" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged services; the project runs its own instances on
# free loopback ports, so the system ones are not needed. Stop only a service
# whose package this run installed: one that was here before (a developer's
# own memcached, say) is left as it was. redis-tools has no service.
for pkg in "${missing[@]}"; do
  case $pkg in redis-server | memcached) ;; *) continue ;; esac
  if command -v systemctl >/dev/null 2>&1; then
    echo "install-servers: stopping the $pkg service this run installed" >&2
    $SUDO systemctl stop "$pkg" >/dev/null 2>&1 || true
  fi
done
redis-server --version
