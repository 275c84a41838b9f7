package natsauth

import "github.com/orch-dev/orch/proto"

// grants is who may do what, by service: each line one stream, bucket,
// consumer or subject, and why the service needs it. Adding a bucket is
// one line here (Bucket(name, access)); docs/deploy.md shows this table
// to operators, and deployments/check holds the shipped nats-server
// configs to it.
var grants = map[string][]Grant{
	Gateway: join(
		base,
		// The gateway owns the topology: it creates and updates it.
		Topology(Own&^Write&^Read&^Get),
		[]Grant{
			// Webhooks, POST /jobs and POST /jobs/{id}/retry queue jobs.
			Publish(proto.SubjectJobsAll, "queue jobs"),
			// Status records: written on cancel and supersede, read by
			// /jobs, watched by the index behind /queue.
			Bucket(proto.BucketJobs, Own),
			// The jobs waiting in JOBS, which have no status record yet:
			// read by sequence for the index, /jobs and cancels.
			Stream(proto.StreamJobs, Get),
			// /queue's stream and consumer figures.
			ConsumerInfo(proto.StreamJobs, proto.ConsumerRunner),
			// /queue's DLQ figures; retry reads the dead-lettered job.
			Stream(proto.StreamDLQ, Info|Get),
			// GET /jobs/{id}/log reads an attempt's output, following it live.
			Stream(proto.StreamLogs, Info|Get|Read),
			// Delivery dedupe keys and dashboard logins: the gateway's alone.
			Bucket(proto.BucketDedupe, Own),
			Bucket(proto.BucketUISessions, Own),
			// Spend per project and window: the dashboard and /queue show it.
			Bucket(proto.BucketSpend, Get|Read|Info),
			// Pauses: shown on the dashboard; an operator pauses and resumes
			// a project (POST /projects/{key}/pause and /resume).
			Bucket(proto.BucketPauses, Own),
		}),
	Runner: join(
		base,
		// Every service ensures the topology at start; the runner only
		// creates what is missing, never changes a configuration.
		Topology(Ensure),
		[]Grant{
			// Pulls jobs, acks, naks, terminates, tells JetStream it works.
			Consume(proto.StreamJobs, proto.ConsumerRunner),
			// The pipeline queues a job's next kind when it succeeds.
			Publish(proto.SubjectJobsAll, "queue the pipeline's next job"),
			// Status records: running, retrying, done; a watch per job
			// for cancels.
			Bucket(proto.BucketJobs, Get|Read|Write|Info),
			// Task locks: one job per worktree; the stream's info gives
			// the server's clock.
			Bucket(proto.BucketTaskLocks, Get|Read|Write|Info),
			// The agent's output.
			Publish(proto.SubjectLogsAll, "the agent's output"),
			// Spend per project and window: added to after every attempt,
			// read before a job starts (budgets).
			Bucket(proto.BucketSpend, Get|Read|Write|Info),
			// Pauses: a usage limit met pauses its credential; read before
			// a job starts, watched by the releaser of held jobs.
			Bucket(proto.BucketPauses, Get|Read|Write|Info),
			// Task states: saved as an attempt runs and ends, restored
			// by the runner that takes the task next, deleted by cleanup.
			ObjectStore(proto.ObjectStoreTaskState, Get|Read|Write|Info),
		}),
	Notifier: join(
		base,
		Topology(Ensure),
		[]Grant{
			// Advisories of jobs that failed for good.
			Consume(proto.StreamAdvisories, proto.ConsumerNotifier),
			// The advisory of a job whose deliveries are used up, when
			// JetStream's own was lost (a leader lost as it was sent).
			Publish(proto.SubjectRunnerMaxDeliveries, "stand in for a lost advisory"),
			// The failed job: read by sequence, deleted once dead-lettered;
			// the queue figures of /metrics.
			Stream(proto.StreamJobs, Info|Get|DeleteMsg),
			ConsumerInfo(proto.StreamJobs, proto.ConsumerRunner),
			// Dead-lettering, and the DLQ's size in /metrics.
			Publish(proto.SubjectDLQAll, "dead-letter a job"),
			Stream(proto.StreamDLQ, Info),
			// Status records: failed; watched by the tracker write-back.
			Bucket(proto.BucketJobs, Get|Read|Write|Info),
			// The tail of the log in an alert.
			Stream(proto.StreamLogs, Info|Get|Read),
			// The write-back's records: the notifier's alone.
			Bucket(proto.BucketWriteback, Own),
			// What the budget and pause alerts tell of.
			Bucket(proto.BucketSpend, Get|Read|Info),
			Bucket(proto.BucketPauses, Get|Read|Info),
		}),
}

// base is what every service asks: JetStream's account info, which the
// client reads before it makes a bucket (its limits and API level, no
// data).
var base = []Grant{Publish("$JS.API.INFO", "JetStream account info")}

func join(gs ...[]Grant) []Grant {
	var out []Grant
	for _, g := range gs {
		out = append(out, g...)
	}
	return out
}
