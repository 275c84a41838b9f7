// Package kit holds nothing itself: its packages are the internals the
// gateway, the runner and the notifier share that are not the wire
// contract (that is package proto). status has the job lifecycle and the
// status store, registry the projects.yaml format, service the common
// configuration and start-up, natsauth the NATS user of each service and
// what it may do, backoff the waits between tries, logread an agent's
// output read back from JOBS_LOGS, tail the end of a file, scrub the
// secrets taken out of text people read, embedded an in-process JetStream
// server; natstest, testkit, trackertest, metricstest and status/statustest
// are for tests.
package kit
