#!/usr/bin/env bash
# tf-mirror.sh — make Terraform usable offline for kloud and its tests.
#
# Idempotent; everything is cached under ${KLOUD_CACHE:-/var/cache/kloud}:
#   bin/terraform          only when no terraform is on PATH (or with --build-terraform):
#                          built from github.com/hashicorp/terraform@v1.5.7 (the last MPL release)
#   tf-mirror/             a Terraform filesystem mirror (unpacked layout) holding
#                          registry.terraform.io/hashicorp/local/1.4.0, built from
#                          github.com/terraform-providers/terraform-provider-local@v1.4.0 (the
#                          hashicorp/... module path does not resolve), plus any extra providers given
#   terraform.tfrc         a CLI config (TF_CLI_CONFIG_FILE) whose provider_installation uses only that
#                          mirror, so `terraform init` never touches the network
#
# Usage:
#   scripts/tf-mirror.sh [--build-terraform] [NAMESPACE/TYPE/VERSION=BINARY ...]
# Each extra argument installs a provider binary you built, for example
#   scripts/tf-mirror.sh kloud/kloudlocal/0.1.0=bin/terraform-provider-kloudlocal
# lands at tf-mirror/registry.terraform.io/kloud/kloudlocal/0.1.0/<os>_<arch>/terraform-provider-kloudlocal_v0.1.0
# (replaced when the binary changed).
#
# Prints, on stdout, KEY=VALUE lines (TERRAFORM, TF_CLI_CONFIG_FILE, TF_MIRROR, PROVIDER) naming what it
# produced; the same lines are kept in $KLOUD_CACHE/tf-mirror.env. Progress goes to stderr.
set -euo pipefail

TERRAFORM_VERSION=1.5.7
LOCAL_PROVIDER_VERSION=1.4.0

build_terraform=0
[[ "${TF_MIRROR_BUILD_TERRAFORM:-}" == 1 ]] && build_terraform=1
extras=()
for arg in "$@"; do
	case "$arg" in
	--build-terraform) build_terraform=1 ;;
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*=*) extras+=("$arg") ;;
	*)
		echo "tf-mirror: bad argument $arg (want NAMESPACE/TYPE/VERSION=BINARY)" >&2
		exit 2
		;;
	esac
done

cache=${KLOUD_CACHE:-/var/cache/kloud}
mkdir -p "$cache/bin" "$cache/tf-mirror"
cache=$(cd "$cache" && pwd)
mirror=$cache/tf-mirror
tfrc=$cache/terraform.tfrc
platform=$(go env GOOS)_$(go env GOARCH)

log() { echo "tf-mirror: $*" >&2; }

# One run at a time per cache: parallel test packages may all call this.
exec 9>"$cache/.tf-mirror.lock"
flock 9

tmp=$(mktemp -d "$cache/.tf-mirror.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# go install outside any module, with its own GOBIN; the binary is moved into place only when complete.
go_install() { # pkg@version
	(cd "$tmp" && GOBIN="$tmp/gobin" GOFLAGS=-mod=mod go install "$1")
}

# --- terraform ---------------------------------------------------------------------------------
terraform=""
if [[ $build_terraform == 0 ]] && command -v terraform >/dev/null 2>&1; then
	terraform=$(command -v terraform)
	log "using terraform on PATH: $terraform"
elif [[ -x "$cache/bin/terraform" ]] && "$cache/bin/terraform" version 2>/dev/null | grep -q "^Terraform v$TERRAFORM_VERSION\$"; then
	terraform=$cache/bin/terraform
	log "using cached $terraform"
else
	log "building github.com/hashicorp/terraform@v$TERRAFORM_VERSION (takes a few minutes)"
	go_install "github.com/hashicorp/terraform@v$TERRAFORM_VERSION"
	mv -f "$tmp/gobin/terraform" "$cache/bin/terraform"
	terraform=$cache/bin/terraform
fi

# --- providers ---------------------------------------------------------------------------------
install_provider() { # namespace type version binary
	local ns=$1 typ=$2 ver=$3 bin=$4
	local dir=$mirror/registry.terraform.io/$ns/$typ/$ver/$platform
	local dst=$dir/terraform-provider-${typ}_v$ver
	mkdir -p "$dir"
	if [[ -f "$dst" ]] && cmp -s "$bin" "$dst"; then
		log "up to date: $dst"
	else
		cp "$bin" "$dir/.tmp-$typ"
		chmod 0755 "$dir/.tmp-$typ"
		mv -f "$dir/.tmp-$typ" "$dst"
		log "installed: $dst"
	fi
}

local_dst=$mirror/registry.terraform.io/hashicorp/local/$LOCAL_PROVIDER_VERSION/$platform/terraform-provider-local_v$LOCAL_PROVIDER_VERSION
if [[ -x "$local_dst" ]]; then
	log "up to date: $local_dst"
else
	log "building github.com/terraform-providers/terraform-provider-local@v$LOCAL_PROVIDER_VERSION"
	go_install "github.com/terraform-providers/terraform-provider-local@v$LOCAL_PROVIDER_VERSION"
	install_provider hashicorp local "$LOCAL_PROVIDER_VERSION" "$tmp/gobin/terraform-provider-local"
fi

for spec in "${extras[@]}"; do
	addr=${spec%%=*}
	bin=${spec#*=}
	IFS=/ read -r ns typ ver rest <<<"$addr"
	if [[ -z "$ns" || -z "$typ" || -z "$ver" || -n "${rest:-}" ]]; then
		echo "tf-mirror: bad provider address $addr (want NAMESPACE/TYPE/VERSION)" >&2
		exit 2
	fi
	ver=${ver#v}
	if [[ ! -f "$bin" ]]; then
		echo "tf-mirror: $bin: no such file" >&2
		exit 2
	fi
	install_provider "$ns" "$typ" "$ver" "$bin"
done

# --- CLI config --------------------------------------------------------------------------------
cat >"$tmp/terraform.tfrc" <<TFRC
# Written by scripts/tf-mirror.sh: providers come only from the filesystem mirror below.
provider_installation {
  filesystem_mirror {
    path    = "$mirror"
    include = ["registry.terraform.io/*/*"]
  }
  direct {
    exclude = ["registry.terraform.io/*/*"]
  }
}
disable_checkpoint = true
TFRC
if ! cmp -s "$tmp/terraform.tfrc" "$tfrc"; then
	mv -f "$tmp/terraform.tfrc" "$tfrc"
	log "wrote $tfrc"
fi

{
	echo "TERRAFORM=$terraform"
	echo "TF_CLI_CONFIG_FILE=$tfrc"
	echo "TF_MIRROR=$mirror"
	# Every provider in the mirror, also those an earlier run installed.
	(cd "$mirror" && find . -path "*/$platform/terraform-provider-*" -type f | sort) | while read -r rel; do
		rel=${rel#./}
		echo "PROVIDER=${rel%/"$platform"/*} $mirror/$rel"
	done
} >"$tmp/env"
mv -f "$tmp/env" "$cache/tf-mirror.env"
cat "$cache/tf-mirror.env"
