# Kloud. `make help` lists the targets.
SHELL := /bin/bash
export KLOUD_CACHE ?= /var/cache/kloud
GO ?= go
BIN := bin
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# Build tags of the binaries (internal/testutil.BuildTags builds the tests' binaries with the same):
# ferretdb_no_postgresql leaves FerretDB's PostgreSQL backend out of kloud (the store embeds SQLite).
TAGS := ferretdb_no_postgresql
LDFLAGS := -X github.com/kloud-dev/kloud/internal/version.Version=$(VERSION)
# Load what setup.sh found (terraform, mirror config, base image) into every recipe.
ENV = set -a; [ -f $(KLOUD_CACHE)/env ] && . $(KLOUD_CACHE)/env; set +a;

.PHONY: help setup build run test test-short bench lint fuzz load chaos

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

setup: ## install what kloud and its tests need (idempotent; cached under $(KLOUD_CACHE))
	scripts/setup.sh

build: ## build bin/kloud, bin/terraformer, bin/klient
	$(GO) build -tags "$(TAGS)" -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...

run: setup build ## set up, then run kloud in the foreground (data in ~/.kloud; docker machines when DOCKER_HOST or the local socket answers)
	$(ENV) $(BIN)/kloud serve

# The tests mostly wait (terraform, agents, cloud-init, daemons), they do not compute: run more
# packages at once (-p) than the 2 cores, and more of a package's parallel tests at once
# (-parallel) than GOMAXPROCS (docs/CONTRIBUTING.md, "Where the suite's time goes").
TESTPARALLEL ?= -p 4 -parallel 4
# go test starts packages in the order it is given them: the longest first, by a full run's
# package times (scripts/testtimes.sh; docs/CONTRIBUTING.md, "Where the suite's time goes"), then
# the rest, so that no long package starts last; e2e is the long pole, the others fill beside it.
TESTPKGS ?= ./e2e ./kloud ./providers/docker ./chaos ./providers/local ./providers/vagrant ./providers/local/sandbox \
	./klient/vagrant ./klient ./examples/provider-example/example ./kloud/cli ./kloud/store ./providers/dummy \
	./providers/docker/dockertest ./terraformer/tfrun ./providers/local/tfprovider ./bench/storegrowth \
	./internal/layersnap ./terraformer ./userdata ./kloud/stackbuild ./terraformer/tfsandbox ./...

# The race detector instruments every package but SQLite: modernc.org/sqlite is SQLite's C
# translated to Go (with its own C runtime, modernc.org/libc), every statement millions of
# pointer operations; instrumented and pointer-checked (checkptr, which -race turns on), it was
# 16% of the kloud package's CPU for races no Go code of ours or FerretDB's can have
# (docs/CONTRIBUTING.md, "Where the suite's time goes").
RACEFLAGS ?= -race -gcflags='modernc.org/...=-race=false -d=checkptr=0'
# Test binaries are linked without DWARF (-w), which tests never read (stack traces and t.Log
# positions come from the binary's own tables): 40% less CPU to link the 100 test binaries.
# The timeout is per test binary: on a slow 2-core host (a PVM guest, docs/CONTRIBUTING.md) the
# e2e package alone runs more than an hour beside the others.
TESTFLAGS ?= $(RACEFLAGS) -ldflags=-w -timeout 85m

# The output also goes to TESTLOG; when a test failed, scripts/failsummary.sh ends the output
# with each failed test and its first lines, where a CI page that shows only the end sees them.
TESTLOG ?= $(KLOUD_CACHE)/make-test.log
test: setup ## set up, then run every test (CI runs this with CI=true)
	@$(TMPCHECK) $(ENV) set -o pipefail; \
	$(GO) test $(TESTFLAGS) $(TESTPARALLEL) $(TESTPKGS) 2>&1 | tee $(TESTLOG) || { scripts/failsummary.sh $(TESTLOG); exit 1; }

test-short: ## run the tests without setup
	@$(TMPCHECK) $(ENV) $(GO) test -timeout 20m $(TESTPARALLEL) $(TESTPKGS)

# TMPCHECK runs the command after it and then fails if the tests left entries of this project
# (kloud*, the helpers' webterm-*, tfapply-*, bench-* names) in the system temp dir that were
# not there before. Tests use t.TempDir() or the project's cache (internal/testutil: BuildBinary,
# RunDir), never /tmp directly.
TMPCHECK = tmpcheck() { ls -A "$${TMPDIR:-/tmp}" | grep -E '^(kloud|webterm-|tfapply-|bench-)' | sort; }; \
	before="$$(tmpcheck)"; trap 'left="$$(comm -13 <(echo "$$before") <(tmpcheck))"; \
	if [ -n "$$left" ]; then echo "FAIL: the tests left this in $${TMPDIR:-/tmp}:"; echo "$$left"; exit 1; fi' EXIT;

fuzz: setup ## run every fuzz target for FUZZTIME each (default 10m: targets × 10 min in all; FUZZ=regexp picks targets)
	@$(TMPCHECK) $(ENV) scripts/fuzz.sh

# The fault suite (chaos/, docs/RELIABILITY.md "Fault suite"): each scenario CHAOS_N times with a
# seeded random SIGKILL (CHAOS_SEED to repeat a run; the table also goes to CHAOS_REPORT).
# `make test` runs its short version (CHAOS_N=1).
CHAOS_N ?= 20
chaos: setup ## run the fault suite: SIGKILL of kloud, terraformer, a plugin, klient at random moments, and network cuts of 30 s and 60 s, CHAOS_N=20 times each (as root)
	$(ENV) CHAOS_N=$(CHAOS_N) CHAOS_TARGETS=1 $(GO) test -p 1 -count=1 -parallel 7 -timeout 150m -run '^TestChaos$$' -v ./chaos
	$(ENV) CHAOS_N=$(CHAOS_N) $(GO) test -count=1 -timeout 150m -run '^TestNetworkCut$$' -v ./e2e

bench: setup build ## run the benchmarks against their baselines (see bench/RESULTS.md)
	$(ENV) bench/run.sh

# The load suite (load/, docs/RELIABILITY.md "Load suite"): full sizes, one scenario at a time (each
# measures itself); LOAD_DURATION=10s shortens the API phase. make test runs its tiny version.
load: setup ## run the load suite at full size and print its figures as Markdown rows (LOAD_DURATION=60s)
	@$(TMPCHECK) $(ENV) LOAD=full $(GO) test -count=1 -v -parallel 1 -timeout 60m -run '^TestLoad' ./load

lint: ## gofmt, go vet, and go.mod/go.sum tidy (go mod tidy -diff)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

.PHONY: vendor-xterm
vendor-xterm: ## refresh kloud/web/static/vendor/xterm from the npm versions pinned in e2e/browser
	cd e2e/browser && npm ci --no-audit --no-fund
	mkdir -p kloud/web/static/vendor/xterm
	for f in xterm/lib/xterm.mjs xterm/css/xterm.css addon-fit/lib/addon-fit.mjs; do \
		sed '/^\/\/# sourceMappingURL=/d' e2e/browser/node_modules/@xterm/$$f >kloud/web/static/vendor/xterm/$${f##*/}; done
	cp e2e/browser/node_modules/@xterm/xterm/LICENSE kloud/web/static/vendor/xterm/LICENSE
	cd e2e/browser && node -e 'for (const p of ["@xterm/xterm", "@xterm/addon-fit"]) console.log(p + " " + require(p + "/package.json").version)' \
		>../../kloud/web/static/vendor/xterm/VERSIONS
