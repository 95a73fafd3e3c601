#!/usr/bin/env bash
# Build (once) the Debian bookworm root filesystem that local machines boot from, and print its
# path. Idempotent: a cached image (under $KLOUD_CACHE, default /var/cache/kloud, keyed by a hash
# of the recipe in providers/local/sandbox/image.go) is found without rebuilding.
# Needs root and mmdebstrap (installed here if missing); reads the Debian mirror from
# /etc/apt/sources.list.d.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mmdebstrap >/dev/null; then
	echo "base-image: installing mmdebstrap" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2 ||
		{ apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mmdebstrap >&2; }
fi
exec go run ./providers/local/sandbox/mkbaseimage.go "$@"
