// Package proto is orch's wire contract: the names of streams, subjects,
// consumers, headers and the KV bucket, the JSON messages that travel
// between the gateway, the runners and the notifier, and the JetStream
// topology every service ensures at start. What the services share beyond
// the wire (the status store and job lifecycle, the registry, start-up,
// test helpers) is in the module kit.
//
// These names are public. Operators type them into the nats CLI, and each
// service may run at a different version, so a change here needs a
// migration note in the README. Messages carry a schema version; readers
// accept older versions and ignore fields they do not know.
package proto
