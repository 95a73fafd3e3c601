#!/usr/bin/env bash
# build-docker-provider.sh — build the community Docker Terraform provider (kreuzwerker/docker
# 4.6.0) from its module source and install it into the offline provider mirror, so a template
# with `docker = { source = "kreuzwerker/docker", version = "4.6.0" }` inits without a network.
#
# The module proxy has the provider only as a pseudo-version whose go.mod names another module
# path (github.com/terraform-providers/terraform-provider-docker), so `go install` refuses it:
# scripts/build-module.sh builds it from its downloaded source.
#
# Idempotent: the binary is cached as ${KLOUD_CACHE:-/var/cache/kloud}/bin/terraform-provider-docker_v4.6.0
# (a build takes ~1.5 min on 2 cores; CI builds it once per cache), and tf-mirror.sh replaces the
# mirrored copy only when its bytes changed. Prints tf-mirror.sh's KEY=VALUE lines on stdout;
# progress goes to stderr.
#
# Usage: scripts/build-docker-provider.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=4.6.0 # keep in step with providers/docker.TerraformVersion
MODULE=github.com/kreuzwerker/terraform-provider-docker
PSEUDO=v0.0.0-20260916201441-96d331c98ff4 # the proxy's only version; CHANGELOG: v4.6.0

cache=${KLOUD_CACHE:-/var/cache/kloud}
mkdir -p "$cache/bin"
cache=$(cd "$cache" && pwd)
out=$cache/bin/terraform-provider-docker_v$VERSION
log() { echo "build-docker-provider: $*" >&2; }

exec 9>"$cache/.docker-provider.lock"
flock 9

if [[ -x "$out" ]] && [[ -f "$out.src" ]] && [[ "$(cat "$out.src")" == "$MODULE@$PSEUDO" ]]; then
	log "cached: $out"
else
	log "building $out (takes a minute or two)"
	scripts/build-module.sh "$MODULE@$PSEUDO" . "$out" "-X main.version=$VERSION"
	echo "$MODULE@$PSEUDO" >"$out.src"
fi
exec scripts/tf-mirror.sh "kreuzwerker/docker/$VERSION=$out"
