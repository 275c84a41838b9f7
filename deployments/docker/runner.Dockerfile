# syntax=docker/dockerfile:1
# orch runner: pulls jobs and runs the agent CLI in a git worktree per task.
#
# Build from the repository root (the context must hold proto/, kit/ and services/):
#   docker build -f deployments/docker/runner.Dockerfile \
#     --build-arg VERSION=$(git describe --always --dirty) -t orch-runner .
# Without Claude Code (for an agent of your own in a derived image):
#   ... --build-arg CLAUDE_CODE_VERSION= ...

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
# The module services/runner has "replace" directives to ../../proto and ../../kit, so the
# image keeps the repository's layout: /src/proto, /src/kit and /src/services/runner.
# go.work names modules this image does not copy (bench, deployments/...):
# GOWORK=off builds the service from its own go.mod and go.sum, exactly the
# versions the module pins.
ENV GOWORK=off CGO_ENABLED=0 GOFLAGS=-trimpath
WORKDIR /src/services/runner
# Dependencies first, so a code change does not download them again.
COPY proto/go.mod proto/go.sum /src/proto/
COPY kit/go.mod kit/go.sum /src/kit/
COPY services/runner/go.mod services/runner/go.sum /src/services/runner/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY proto/ /src/proto/
COPY kit/ /src/kit/
COPY services/runner/ /src/services/runner/
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags "-s -w -X main.version=${VERSION}" -o /out/runner ./cmd/runner \
 && go build -ldflags "-s -w -X main.version=${VERSION}" -o /out/orch-sandbox-init ./cmd/orch-sandbox-init \
 && /out/runner -version && /out/orch-sandbox-init -version

# Not distroless, unlike the gateway and the notifier: the runner clones
# with git, and the agent it starts is a full program that expects a shell,
# git, ssh and CA certificates (Claude Code also needs Node.js). Debian slim
# is the smallest base where all of these are maintained packages with
# security updates. tini is PID 1 so that processes an agent leaves behind
# are reaped and SIGTERM reaches the runner, which then lets running agents
# finish within ORCH_SHUTDOWN_GRACE. bubblewrap confines each agent
# (ORCH_AGENT_SANDBOX=bwrap: the runner does not start without it); the
# container needs the seccomp, AppArmor and /proc settings of
# docs/deploy.md for it to work (compose.yaml and k8s/runner.yaml set them).
FROM debian:bookworm-slim
ARG CLAUDE_CODE_VERSION=latest
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ca-certificates git openssh-client tini \
 && if [ -n "${CLAUDE_CODE_VERSION}" ]; then \
      apt-get install -y --no-install-recommends nodejs npm \
      && npm install -g "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" \
      && npm cache clean --force; \
    fi \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /home/orch --create-home --shell /bin/sh orch \
 && install -d -o orch -g orch /var/lib/orch
# Beside the runner, where it finds it: each sandbox's init (docs/runner.md,
# "The sandbox's init"), a smaller program than the runner's own.
COPY --from=build /out/runner /out/orch-sandbox-init /usr/local/bin/
# The agent's HOME (Claude Code keeps its settings there) and the
# workspace (clones, worktrees, logs) are the volumes to keep.
ENV ORCH_DATA_DIR=/var/lib/orch ORCH_WORKSPACE_DIR=/var/lib/orch/workspace ORCH_LOG_FORMAT=json HOME=/home/orch \
    ORCH_AGENT_SANDBOX=bwrap
WORKDIR /var/lib/orch
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/runner"]
