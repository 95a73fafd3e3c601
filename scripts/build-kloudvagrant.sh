#!/usr/bin/env bash
# build-kloudvagrant.sh — build the kloudvagrant Terraform provider (cmd/terraform-provider-kloudvagrant)
# and install it into the offline provider mirror, so `terraform init` finds
# registry.terraform.io/kloud/kloudvagrant without a network.
#
# Idempotent: the binary is built reproducibly (-trimpath, no VCS stamp) into
# ${KLOUD_CACHE:-/var/cache/kloud}/bin/terraform-provider-kloudvagrant, and tf-mirror.sh replaces the
# mirrored copy only when its bytes changed (so terraform's lock-file hashes stay valid).
# Prints tf-mirror.sh's KEY=VALUE lines on stdout; progress goes to stderr.
#
# Usage: scripts/build-kloudvagrant.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.1.0 # keep in step with tfprovider.Version

cache=${KLOUD_CACHE:-/var/cache/kloud}
mkdir -p "$cache/bin"
out=$cache/bin/terraform-provider-kloudvagrant
echo "build-kloudvagrant: building $out" >&2
go build -trimpath -buildvcs=false -o "$out.tmp" ./cmd/terraform-provider-kloudvagrant
if [[ -f "$out" ]] && cmp -s "$out.tmp" "$out"; then
	rm -f "$out.tmp"
else
	mv -f "$out.tmp" "$out"
fi
exec scripts/tf-mirror.sh "kloud/kloudvagrant/$VERSION=$out"
