#!/usr/bin/env bash
# bench/webterm/run.sh — the web terminal against gotty (see bench/webterm/main.go).
set -euo pipefail
cd "$(dirname "$0")/../.."
exec go run ./bench/webterm "$@"
