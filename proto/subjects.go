package proto

import (
	"strconv"
	"strings"
)

// Stream, consumer and bucket names.
const (
	// StreamJobs holds one message per queued job, on JobSubject subjects.
	// It has WorkQueue retention: a job leaves it when a runner acks it.
	StreamJobs = "JOBS"
	// StreamAdvisories captures JetStream's terminal-failure advisories for
	// StreamJobs, so none is lost while the notifier is down.
	StreamAdvisories = "JOBS_ADVISORIES"
	// StreamDLQ keeps jobs that failed for good, on DLQSubject subjects.
	StreamDLQ = "JOBS_DLQ"
	// ConsumerRunner is the durable pull consumer the runners share.
	ConsumerRunner = "runner"
	// ConsumerNotifier is the durable pull consumer the notifiers share.
	ConsumerNotifier = "notifier"
	// BucketJobs is the KV bucket of status records, keyed by job id.
	BucketJobs = "jobs"
	// StreamLogs holds the agents' output, on LogSubject subjects.
	StreamLogs = "JOBS_LOGS"
)

// Subjects and subject patterns.
const (
	// SubjectJobsAll matches every job subject.
	SubjectJobsAll = "jobs.>"
	// SubjectDLQAll matches every dead-letter subject.
	SubjectDLQAll = "dlq.>"
	// SubjectLogsAll matches every log subject.
	SubjectLogsAll = "logs.>"
	// SubjectAdvisoryMaxDeliveries is published by JetStream when a job has
	// been delivered MaxDeliver times without an ack.
	SubjectAdvisoryMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamJobs + ".*"
	// SubjectRunnerMaxDeliveries is SubjectAdvisoryMaxDeliveries of the
	// runners' consumer: the notifier publishes there too, for an
	// advisory JetStream lost.
	SubjectRunnerMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamJobs + "." + ConsumerRunner
	// SubjectAdvisoryTerminated is published by JetStream when a runner
	// terminates a job (msg.Term), for example one it cannot decode.
	SubjectAdvisoryTerminated = "$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + StreamJobs + ".*"
)

// Headers.
const (
	// HeaderMsgID is JetStream's dedupe header. orch fills it with the job
	// id, which is derived from the triggering event's content.
	HeaderMsgID = "Nats-Msg-Id"
	// HeaderDLQReason, HeaderDLQAttempts and HeaderDLQTime describe why and
	// when a job was dead-lettered.
	HeaderDLQReason   = "Orch-Dlq-Reason"
	HeaderDLQAttempts = "Orch-Dlq-Attempts"
	HeaderDLQTime     = "Orch-Dlq-Time"
	// HeaderDeferred counts how often a runner put a job back at the end
	// of JOBS for another project's or a higher priority's job (fair
	// share, docs/runner.md); a job deferred a few times is not deferred
	// again, so none waits forever.
	HeaderDeferred = "Orch-Deferred"
)

// JobSubject is the subject of one job: jobs.<project>.<kind>.
func JobSubject(project string, kind Kind) string {
	return "jobs." + Token(project) + "." + Token(string(kind))
}

// DLQSubject is the subject of one dead-lettered job: dlq.<project>.<kind>.
func DLQSubject(project string, kind Kind) string {
	return "dlq." + Token(project) + "." + Token(string(kind))
}

// LogSubject is the subject of one attempt's output: logs.<job-id>.<attempt>.
func LogSubject(jobID string, attempt int) string {
	return "logs." + Token(jobID) + "." + strconv.Itoa(attempt)
}

// Token maps s onto the characters that are safe in a subject token, a KV
// key, a file name and a git branch: [a-z0-9_-]. Upper case is folded;
// anything else becomes '-'. An empty result becomes "_".
func Token(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	t := strings.Trim(b.String(), "-")
	if t == "" {
		return "_"
	}
	if len(t) > 64 {
		// Cut, then trim again: the cut may end on a dash.
		t = strings.TrimRight(t[:64], "-")
	}
	return t
}
