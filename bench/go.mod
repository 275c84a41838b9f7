module github.com/orch-dev/orch/bench

go 1.26.8

replace (
	github.com/orch-dev/orch/kit => ../kit
	github.com/orch-dev/orch/proto => ../proto
	github.com/orch-dev/orch/services/gateway => ../services/gateway
	github.com/orch-dev/orch/services/notifier => ../services/notifier
	github.com/orch-dev/orch/services/runner => ../services/runner
)

require (
	github.com/nats-io/nats.go v1.55.0
	github.com/orch-dev/orch/kit v0.0.0
	github.com/orch-dev/orch/proto v0.0.0
	github.com/orch-dev/orch/services/runner v0.0.0
	golang.org/x/sync v0.24.0
)

require (
	github.com/antithesishq/antithesis-sdk-go v0.8.0-default-no-op // indirect
	github.com/google/go-tpm v0.9.8 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/minio/highwayhash v1.0.4 // indirect
	github.com/nats-io/jwt/v2 v2.8.2 // indirect
	github.com/nats-io/nats-server/v2 v2.15.2 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	go.uber.org/zap v1.28.0 // indirect
	golang.org/x/crypto v0.58.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/time v0.16.0 // indirect
)
