#!/usr/bin/env bash
# setup-browser.sh — install what the real-browser test (e2e/browser_test.go) needs, once.
#
# Idempotent; safe to run again (it only does what is missing):
#   - Debian packages chromium and chromium-driver (/usr/bin/chromium), and nodejs + npm
#   - `npm ci` in e2e/browser: playwright-core, axe-core (TestBrowserAccessibility) and the
#     @xterm/* packages at the exact versions of e2e/browser/package-lock.json (no browser
#     download: playwright-core drives the Debian Chromium)
# Not root: reports the missing packages and still runs npm ci if npm is there.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "setup-browser: $*" >&2; }

pkgs=(chromium chromium-driver nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm may come from elsewhere than Debian: only install them when absent.
command -v node >/dev/null && missing=("${missing[@]/nodejs/}")
command -v npm >/dev/null && missing=("${missing[@]/npm/}")
read -r -a missing <<<"${missing[*]}"
if ((${#missing[@]})); then
	if [ "$(id -u)" != 0 ]; then
		log "missing Debian packages: ${missing[*]} (run as root to install them)"
	else
		log "installing ${missing[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
			{ apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
	fi
fi

if ! command -v npm >/dev/null; then
	log "no npm: skipping e2e/browser/node_modules"
	exit 0
fi
lock=e2e/browser/package-lock.json
stamp=e2e/browser/node_modules/.kloud-lock.sha256
want=$(sha256sum "$lock" | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
	log "e2e/browser/node_modules is up to date"
else
	log "npm ci in e2e/browser"
	(cd e2e/browser && npm ci --no-audit --no-fund >&2)
	echo "$want" >"$stamp"
fi
log "done"
