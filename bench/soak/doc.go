// Package soak holds orch's chaos soak: jobs through the real service
// binaries while agents fail at random, runners are SIGKILLed and JetStream
// restarts, checked for lost jobs, repeated alerts, unexplained agent runs
// and the concurrency limit. `make soak` runs it with ORCH_SOAK_N=10000;
// `make test` runs the short version.
package soak
