// Package joblog is the format of an agent's output in the stream
// JOBS_LOGS: the header that names a message's view, the kinds, and the
// shape of the end message. Reading a log back (whole, followed live, or
// its tail) is kit/logread's job, since it is a JetStream client and not
// part of the contract.
//
// Every attempt of a job has its own subject, proto.LogSubject. Each
// message is one batch of output, and its header HeaderKind says which
// view it belongs to:
//
//   - KindText: the readable form only (Claude Code's stream-json events
//     rendered as lines a person reads; invalid UTF-8 escaped as \xNN);
//   - KindRaw: the agent's bytes as it printed them, for the same span of
//     output as the text message just before it;
//   - KindBoth: output whose readable form is the raw form itself (plain
//     text lines), published once for both views;
//   - KindEnd: the last message of the attempt. Its body repeats the end
//     of the readable view (TrimToLines), so an alert needs one message,
//     not the log.
//
// The bodies of one view, concatenated in stream order, are that view of
// the output: a long line may be cut across messages, and a reader just
// joins them. No body exceeds the server's max payload.
package joblog

import "bytes"

// HeaderKind names the view a log message belongs to.
const HeaderKind = "Orch-Log-Kind"

// The kinds of log message, the values of HeaderKind.
const (
	KindText = "text"
	KindRaw  = "raw"
	KindBoth = "both"
	KindEnd  = "end"
)

// InView reports whether a message of kind belongs to the raw view (raw
// true) or the readable one. A message without a kind is plain output.
func InView(kind string, raw bool) bool {
	switch kind {
	case KindBoth, "":
		return true
	case KindText:
		return !raw
	case KindRaw:
		return raw
	}
	return false
}

// TrimToLines keeps at most the last maxBytes of b, starting after a line
// break when there is one in the part it keeps, without a trailing break.
// It is the shape of the end message's body, and of any tail a reader
// shows.
func TrimToLines(b []byte, maxBytes int) []byte {
	b = bytes.TrimRight(b, "\n")
	if len(b) > maxBytes {
		b = b[len(b)-maxBytes:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return b
}
