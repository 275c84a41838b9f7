// Package bench holds orch's benchmarks and soak test: figures measured
// against raw JetStream on the same server in the same run.
package bench
