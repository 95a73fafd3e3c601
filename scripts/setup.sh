#!/usr/bin/env bash
# setup.sh — install everything kloud and its tests need on a fresh machine of this kind, once.
#
# Idempotent; safe to run again (it only does what is missing). Caches under
# ${KLOUD_CACHE:-/var/cache/kloud}:
#   - Debian packages: cloud-init (schema checks), mmdebstrap (base image), iproute2, util-linux,
#     curl, procps, docker.io (the docker provider; tests start their own dockerd), vagrant
#     (the vagrant provider, driving Vagrant's docker provider), prometheus (the metrics e2e
#     test starts its own; the package's service is not started), jq (scripts/testtimes.sh),
#     openssh-client, rsync and git (e2e's SSH test drives ssh, scp, sftp, rsync and git),
#     haproxy (the load balancer e2e's replicas test puts before three kloud replicas; its
#     service is not started)
#   - terraform (the one on PATH, else built from source) and the offline provider mirror
#     (scripts/tf-mirror.sh)
#   - the Debian root filesystem local machines boot from (scripts/base-image.sh), when root
#   - SeaweedFS's weed, the S3 server of stacks' buckets (scripts/build-seaweedfs.sh; KLOUD_WEED)
# Writes $KLOUD_CACHE/env (shell KEY=VALUE lines) that `make` sources.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${KLOUD_CACHE:-/var/cache/kloud}
mkdir -p "$cache"
log() { echo "setup: $*" >&2; }

pkgs=(cloud-init mmdebstrap iproute2 util-linux curl procps ca-certificates docker.io vagrant prometheus jq openssh-client rsync git haproxy)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	if [ "$(id -u)" != 0 ]; then
		log "missing Debian packages: ${missing[*]} (run as root to install them)"
	else
		log "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		# Installing packages starts no service (docker.io would start the host's dockerd, with
		# its firewall rules): tests start their own daemon; users start theirs when they want it.
		rcd=""
		if [ ! -e /usr/sbin/policy-rc.d ]; then
			rcd=/usr/sbin/policy-rc.d
			printf '#!/bin/sh\n# setup.sh: no service starts while packages install\nexit 101\n' >"$rcd"
			chmod 0755 "$rcd"
			trap 'rm -f "$rcd"' EXIT
		fi
		apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
			{ apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
		if [ -n "$rcd" ]; then
			rm -f "$rcd"
			trap - EXIT
		fi
	fi
fi

log "terraform and the offline provider mirror (with our kloudlocal and kloudvagrant providers)"
scripts/tf-mirror.sh >/dev/null
scripts/build-kloudlocal.sh >/dev/null
scripts/build-kloudvagrant.sh >/dev/null
log "the Docker Terraform provider (kreuzwerker/docker, built once and cached)"
scripts/build-docker-provider.sh >/dev/null

if [ "$(id -u)" = 0 ]; then
	log "base image for local machines"
	base=$(scripts/base-image.sh)
	echo "KLOUD_BASE_IMAGE=$base" >"$cache/base-image.env"
else
	log "not root: skipping the base image (local machines need root)"
fi

log "SeaweedFS's weed, the S3 server for buckets (built once and cached; about 3 minutes)"
weed=$(scripts/build-seaweedfs.sh | sed -n 's/^WEED=//p')
[ -x "$weed" ] || { log "scripts/build-seaweedfs.sh gave no weed binary"; exit 1; }

log "Chromium and the browser test's npm packages"
scripts/setup-browser.sh

{
	grep -E '^(TERRAFORM|TF_CLI_CONFIG_FILE|TF_MIRROR)=' "$cache/tf-mirror.env"
	[ -f "$cache/base-image.env" ] && cat "$cache/base-image.env"
	echo "KLOUD_WEED=$weed"
	echo "KLOUD_CACHE=$cache"
} >"$cache/env"
log "done; environment in $cache/env"
