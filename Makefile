# orch: the three services and the local all-in-one.
# Every module is listed once here; go.work ties them together.
MODULES  := proto services/gateway services/runner services/notifier deployments/local
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

.PHONY: all build run test lint bench fuzz soak clean tidy

all: lint test

build:
	@mkdir -p $(BIN)
	@for s in $(SERVICES); do \
		echo "go build $$s"; \
		(cd services/$$s && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o ../../$(BIN)/$$s ./cmd/$$s) || exit 1; \
	done
	cd deployments/local && go build -o ../../$(BIN)/orch-local .

## run: the whole system on this machine (embedded JetStream + 3 services).
run:
	cd deployments/local && go build -o ../../$(BIN)/orch-local .
	./$(BIN)/orch-local

## test: every module's tests, race detector on.
test:
	@set -e; for m in $(MODULES); do \
		echo "== go test $$m"; \
		(cd $$m && go test -race -count=1 -timeout 15m ./...); \
	done

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
