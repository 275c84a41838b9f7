// Package check verifies the deployment files (compose, Kubernetes,
// systemd, NATS configs) and runs orch against a real three-node JetStream
// cluster.
package check
