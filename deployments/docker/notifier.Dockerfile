# syntax=docker/dockerfile:1
# orch notifier: turns terminal failures into Telegram alerts.
#
# Build from the repository root (the context must hold proto/, kit/ and services/):
#   docker build -f deployments/docker/notifier.Dockerfile \
#     --build-arg VERSION=$(git describe --always --dirty) -t orch-notifier .

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
# The module services/notifier has "replace" directives to ../../proto and ../../kit, so the
# image keeps the repository's layout: /src/proto, /src/kit and /src/services/notifier.
# go.work names modules this image does not copy (bench, deployments/...):
# GOWORK=off builds the service from its own go.mod and go.sum, exactly the
# versions the module pins.
ENV GOWORK=off CGO_ENABLED=0 GOFLAGS=-trimpath
WORKDIR /src/services/notifier
# Dependencies first, so a code change does not download them again.
COPY proto/go.mod proto/go.sum /src/proto/
COPY kit/go.mod kit/go.sum /src/kit/
COPY services/notifier/go.mod services/notifier/go.sum /src/services/notifier/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY proto/ /src/proto/
COPY kit/ /src/kit/
COPY services/notifier/ /src/services/notifier/
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -ldflags "-s -w -X main.version=${VERSION}" -o /out/notifier ./cmd/notifier \
 && /out/notifier -version \
 && mkdir -p /out/data

# A static binary needs no libc: distroless static has CA certificates and
# tzdata, no shell, and runs as uid 65532 (nonroot).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/notifier /usr/local/bin/notifier
# Owned by nonroot, so a named volume mounted here starts writable.
COPY --from=build --chown=65532:65532 /out/data /var/lib/orch
ENV ORCH_DATA_DIR=/var/lib/orch ORCH_LOG_FORMAT=json
WORKDIR /var/lib/orch
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/notifier"]
