#!/usr/bin/env bash
# build-seaweedfs.sh — build SeaweedFS's `weed` (Apache-2.0), the S3 server kloud starts for
# stacks' buckets (kloud/buckets), from its module source.
#
# The module proxy serves SeaweedFS as a pseudo-version whose source builds with
# GOFLAGS=-mod=mod (its own go.mod resolves its dependencies); `go install` of a command of a
# module with replace directives is refused: scripts/build-module.sh builds it from its
# downloaded source.
#
# Idempotent: the binary is cached as ${KLOUD_CACHE:-/var/cache/kloud}/bin/weed-<pseudo-version>
# (a build takes 3 to 6 minutes on 2 cores; CI builds it once per cache). Prints
# WEED=<path> on stdout; progress goes to stderr.
#
# Usage: scripts/build-seaweedfs.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODULE=github.com/seaweedfs/seaweedfs
PSEUDO=v0.0.0-20261109003541-7506e5f91cd6 # the proxy's version (tried: feasibility notes in docs/buckets.md)

cache=${KLOUD_CACHE:-/var/cache/kloud}
mkdir -p "$cache/bin"
cache=$(cd "$cache" && pwd)
out=$cache/bin/weed-$PSEUDO
log() { echo "build-seaweedfs: $*" >&2; }

exec 9>"$cache/.seaweedfs.lock"
flock 9

if [[ -x "$out" ]]; then
	log "cached: $out"
else
	log "building $out (takes about 3 to 6 minutes)"
	scripts/build-module.sh "$MODULE@$PSEUDO" ./weed "$out"
fi
echo "WEED=$out"
