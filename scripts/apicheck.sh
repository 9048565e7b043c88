#!/usr/bin/env bash
# apicheck: compares the exported API of every module of this repository
# with the last release's, and fails on an incompatible change that
# CHANGELOG.md does not announce.
#
# The last release is the newest "## vX.Y.Z" heading of CHANGELOG.md; its
# commit is the tag of that name when the repository carries tags, otherwise
# the commit that added the heading. Each module's API at that commit and in
# the work tree is read by golang.org/x/exp/cmd/apidiff (pinned below); an
# incompatible change (a removed or changed exported identifier) passes only
# when the "### Breaking" part of CHANGELOG.md's "## Unreleased" section
# names the identifier. A module the release did not have is new: nothing to
# compare. Run by `make apicheck` and `make lint`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
APIDIFF="go run golang.org/x/exp/cmd/apidiff@v0.0.0-20261113113407-e3970619a1a4"
# The modules a program depends on; examples/ and bench/ are not published.
MODULES=${APICHECK_MODULES:-". middleware/grpc middleware/rls observe/otel observe/prometheus"}

release=$(grep -m1 -oE '^## v[0-9]+\.[0-9]+\.[0-9]+' CHANGELOG.md | cut -c4- || true)
if [ -z "$release" ]; then
  echo "apicheck: CHANGELOG.md names no release yet: nothing to compare"
  exit 0
fi
commit=$(git rev-parse -q --verify "refs/tags/$release^{commit}" 2>/dev/null ||
  git log -1 --format=%H -S "## $release" -- CHANGELOG.md)
if [ -z "$commit" ]; then
  if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
    echo "apicheck: $release's commit is not in this shallow clone: nothing to compare (fetch the history to check)"
    exit 0
  fi
  echo "apicheck: no commit for $release (no tag, and no commit added its CHANGELOG heading)" >&2
  exit 1
fi

# What CHANGELOG.md announces as breaking since the release.
breaking=$(awk '/^## Unreleased/{u=1;next} /^## /{u=0} u && /^### /{b=($0 ~ /^### Breaking/);next} u && b' CHANGELOG.md)

base=$(mktemp -d)
trap 'rm -rf "$base"' EXIT
git archive "$commit" | tar -x -C "$base"

status=0
for m in $MODULES; do
  if [ ! -f "$base/$m/go.mod" ]; then
    echo "apicheck: $m: new since $release"
    continue
  fi
  path=$(cd "$m" && go list -m)
  name=$(echo "$m" | tr / _)
  (cd "$base/$m" && $APIDIFF -m -w "$base/$name.api" "$path" 2>&1 | grep -v '^Ignoring internal package' >&2 || true)
  if [ ! -s "$base/$name.api" ]; then
    echo "apicheck: $m: could not read $release's API" >&2
    status=1
    continue
  fi
  if ! report=$(cd "$m" && $APIDIFF -m -incompatible "$base/$name.api" "$path" 2>&1); then
    echo "apicheck: $m: apidiff failed:" >&2
    echo "$report" >&2
    status=1
    continue
  fi
  report=$(echo "$report" | grep -v '^Ignoring internal package' || true)
  pkg=""
  while IFS= read -r line; do
    case "$line" in
    "" | "Incompatible changes:") ;;
    "- "*)
      # "- ./throttler.Name: removed", or "- Name: …" under a package line.
      item=${line#- }
      ident=${item%%: *}
      ident=${ident#./}
      if [ -n "$pkg" ] && [ "${ident#*.}" = "$ident" ]; then
        ident="$pkg.$ident"
      fi
      dir=${ident%.*}
      short="${dir##*/}.${ident##*.}"
      if printf '%s\n' "$breaking" | grep -qF -e "$short" -e "$ident"; then
        echo "apicheck: $m: $ident: incompatible, announced"
      else
        echo "apicheck: $m: $item: an incompatible change since $release that CHANGELOG.md's Unreleased section does not announce under \"### Breaking\" (name it as \`$short\`)" >&2
        status=1
      fi
      ;;
    *) pkg=${line#./} ;;
    esac
  done <<<"$report"
done
if [ $status -eq 0 ]; then
  echo "apicheck: every module's API is compatible with $release, or its changes are announced"
fi
exit $status
