// Package check verifies the deployment files (compose, Kubernetes,
// systemd, NATS configs) and the README against the tree (its
// configuration table, its layout), and runs orch against a real
// three-node JetStream cluster.
package check
