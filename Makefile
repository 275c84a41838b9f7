# orch: the three services and the local all-in-one.
# Every module is listed once here; go.work ties them together.
MODULES  := proto kit services/gateway services/runner services/notifier deployments/local deployments/check bench
SERVICES := gateway runner notifier
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
BIN      := bin

# `make run` defaults; any ORCH_ variable already in the environment wins.
export ORCH_GITEA_SECRET   ?= fixture-secret
export ORCH_PLANE_SECRET   ?= plane_wh_5f1c0d6b8e2a4c7f9b3d1e0a6c8b2f47
export ORCH_PROJECTS_FILE  ?= deployments/local/projects.yaml
export ORCH_AGENT_COMMAND  ?= sh $(CURDIR)/deployments/local/agent.sh
export ORCH_LOG_FORMAT     ?= console
export ORCH_RETRY_DELAY    ?= 5s
# The stand-in agent's knobs pass the runner's allow-list of variables.
export ORCH_AGENT_ENV      ?= ORCH_STANDIN_EXIT,ORCH_STANDIN_SLEEP

.PHONY: all build run sample test test-unit fuzz-short lint bench bench-big fuzz soak soak-cluster clean tidy browser

all: lint test

build:
	@mkdir -p $(BIN)
	@for s in $(SERVICES); do \
		echo "go build $$s"; \
		(cd services/$$s && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o ../../$(BIN)/$$s ./cmd/$$s) || exit 1; \
	done
	@echo "go build orch-sandbox-init (the runner's, beside it)"
	@cd services/runner && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o ../../$(BIN)/orch-sandbox-init ./cmd/orch-sandbox-init
	cd deployments/local && go build -o ../../$(BIN)/orch-local .

## run: the whole system on this machine (embedded JetStream + 3 services).
run:
	cd deployments/local && go build -o ../../$(BIN)/orch-local .
	./$(BIN)/orch-local

## sample: send the sample Gitea webhook to `make run`, signed as Gitea
## signs it; SAMPLE_FLAGS=-new makes it a new event (a new head commit).
SAMPLE_FLAGS ?=
sample:
	@cd deployments/local && go run ./cmd/sample $(SAMPLE_FLAGS)

## test: every module's tests, race detector on, then each fuzz target briefly.
test: test-unit fuzz-short

test-unit:
	@set -e; for m in $(MODULES); do \
		echo "== go test $$m"; \
		(cd $$m && go test -race -count=1 -timeout 20m ./...); \
	done

# Fuzz targets as module-dir:package-dir:FuzzName, one per line of +=.
FUZZ_TARGETS :=
# --- gateway fuzz targets ---
FUZZ_TARGETS += services/gateway:webhook:FuzzVerify
FUZZ_TARGETS += services/gateway:webhook:FuzzParseGitea
FUZZ_TARGETS += services/gateway:webhook:FuzzParseGiteaMatchesStdlib
FUZZ_TARGETS += services/gateway:webhook:FuzzValidJSON
FUZZ_TARGETS += services/gateway:webhook:FuzzParsePlane
FUZZ_TARGETS += services/gateway:trigger:FuzzGitea
FUZZ_TARGETS += services/gateway:trigger:FuzzPlane
# --- end gateway fuzz targets ---
# Budgets are counts of executions, not durations: with a duration, Go
# 1.26's fuzz coordinator can fail a clean run with "context deadline
# exceeded" at the deadline (go.dev/issue/75804, fixed in Go 1.27). On two
# cores 100000x takes about ten seconds for the slowest target.
FUZZ_SHORT ?= 100000x
FUZZ_LONG  ?= 2000000x

fuzz-short:
	@set -e; for t in $(FUZZ_TARGETS); do \
		m=$${t%%:*}; rest=$${t#*:}; p=$${rest%%:*}; f=$${rest#*:}; \
		echo "== fuzz $$m/$$p $$f ($(FUZZ_SHORT))"; \
		(cd $$m && go test -run='^$$' -fuzz="^$$f\$$" -fuzztime=$(FUZZ_SHORT) ./$$p); \
	done

## fuzz: each fuzz target for FUZZ_LONG.
fuzz:
	@$(MAKE) --no-print-directory fuzz-short FUZZ_SHORT=$(FUZZ_LONG)

# --- bench and soak ---
# bench: one table of orch against the least the same work needs (raw
# JetStream, raw git) on the same embedded server in the same run;
# BENCH_FLAGS passes flags to orchbench (see `go run ./cmd/orchbench -h`).
BENCH_FLAGS ?=
bench:
	cd bench && go run ./cmd/orchbench $(BENCH_FLAGS)

# bench-big: the big-repository bench alone (a generated repository of
# 50,000 files and 10,000 commits): first job of a task against raw git,
# disk per worktree, partial clone and sparse checkout measured.
bench-big:
	cd bench && go run ./cmd/orchbench -big $(BENCH_FLAGS)

# soak: SOAK_N jobs through the real binaries under chaos (runner SIGKILLs,
# a JetStream restart, failing agents); a tenth of them first without
# chaos, whose drain rate sets the chaos phase's deadline. The short version (300 jobs) runs
# in `make test`. No race detector here: the services are built without
# it, and it would only slow the JetStream server in the test process.
SOAK_N ?= 10000
soak:
	cd bench && ORCH_SOAK_N=$(SOAK_N) go test -count=1 -timeout 90m -run '^TestSoak$$' -v ./soak

# soak-cluster: SOAK_CLUSTER_N jobs at SOAK_RATE a second through the real
# binaries on a three-server JetStream cluster (nats-server processes
# built from the module, every stream and bucket R3, kit/natsauth's
# logins, routes through proxies): make soak's runner kills and failing
# agents, a server SIGKILLed and restarted every 20 s (the leaders of
# JOBS, its consumer, KV jobs and the task locks among the victims), and
# one server cut off from the others for 30 s.
SOAK_CLUSTER_N ?= 5000
SOAK_RATE      ?= 5
soak-cluster:
	cd bench && ORCH_SOAK_CLUSTER_N=$(SOAK_CLUSTER_N) ORCH_SOAK_RATE=$(SOAK_RATE) go test -count=1 -timeout 60m -run '^TestSoakCluster$$' -v ./soak
# --- end bench and soak ---

## browser: install Debian's chromium, which the dashboard's browser tests
## drive (they are skipped without it, except in CI).
browser:
	@command -v chromium >/dev/null 2>&1 && echo "chromium is installed: $$(command -v chromium)" || \
		{ SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

lint:
	@set -e; for m in $(MODULES); do \
		echo "== go vet $$m"; \
		(cd $$m && go vet ./...); \
	done
	@test -z "$$(gofmt -l $(MODULES))" || (gofmt -l $(MODULES); echo "gofmt needed"; exit 1)

tidy:
	@for m in $(MODULES); do (cd $$m && go mod tidy); done

clean:
	rm -rf $(BIN) .data
