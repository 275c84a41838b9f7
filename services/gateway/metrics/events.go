package metrics

// EventOther is the event label of every delivery whose event is not one
// of the known events, or whose signature was not verified.
const EventOther = "other"

// knownEvents are the events each sender can name, the only values the
// event label takes besides EventOther. Gitea's are its fine-grained
// X-Gitea-Event-Type values (Gitea 1.25), Plane's its X-Plane-Event values.
var knownEvents = map[string]map[string]bool{
	"gitea": set(
		"create", "delete", "fork", "push", "issues", "issue_assign", "issue_label", "issue_milestone",
		"issue_comment", "pull_request", "pull_request_assign", "pull_request_label", "pull_request_milestone",
		"pull_request_comment", "pull_request_review_approved", "pull_request_review_rejected",
		"pull_request_review_comment", "pull_request_sync", "pull_request_review_request", "wiki",
		"repository", "release", "package", "status", "workflow_run", "workflow_job",
	),
	"plane": set("issue", "issue_comment", "project", "cycle", "module"),
}

// Outcomes lists every value of the outcome label.
var Outcomes = []string{
	OutcomeQueued, OutcomeSpooled, OutcomeIgnored, OutcomeUnauthorized,
	OutcomeMalformed, OutcomeTooLarge, OutcomeUnsupported, OutcomeFailed, OutcomeBusy, OutcomeTimeout,
}

func set(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// EventLabel is the event label of a delivery from source naming event.
// Anyone who can reach the gateway can send any header, so an unverified
// delivery (verified false) is always EventOther, and a verified one names
// its event only when it is a known event of source: no input can add a
// time series.
func EventLabel(source, event string, verified bool) string {
	if verified && knownEvents[source][event] {
		return event
	}
	return EventOther
}

// Webhook counts one delivery.
func (m *Metrics) Webhook(source, event string, verified bool, outcome string) {
	m.Webhooks.WithLabelValues(source, EventLabel(source, event, verified), outcome).Inc()
}
