#!/usr/bin/env bash
# build-module.sh — build a command of a Go module that `go install` refuses (a pseudo-version
# whose go.mod names another module path, or one with replace directives) from its source: the
# module is downloaded (go mod download, from the module proxy), copied somewhere writable and
# built there with its own go.mod (GOFLAGS=-mod=mod), CGO off, trimmed and stripped.
#
# Usage: scripts/build-module.sh MODULE@VERSION PACKAGE OUT [LDFLAGS]
#   PACKAGE is relative to the module's root ("." or "./weed"); OUT is replaced only when the build
#   succeeded. Progress goes to stderr. The callers (build-docker-provider.sh,
#   build-seaweedfs.sh) cache OUT and lock their cache.
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 MODULE@VERSION PACKAGE OUT [LDFLAGS]" >&2; exit 2; }
modver=$1 pkg=$2 out=$3 ldflags=${4:-}
log() { echo "build-module: $*" >&2; }

tmp=$(mktemp -d "$(dirname "$out")/.build-module.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
log "downloading $modver"
dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$modver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n "$dir" && -d "$dir" ]] || { log "go mod download of $modver gave no source directory"; exit 1; }
cp -r "$dir" "$tmp/src"
chmod -R u+w "$tmp/src"
log "building $pkg of $modver into $out"
(cd "$tmp/src" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -buildvcs=false \
	-ldflags "-s -w $ldflags" -o "$tmp/out" "$pkg")
mv -f "$tmp/out" "$out"
