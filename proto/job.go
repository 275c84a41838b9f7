package proto

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// SchemaVersion is the version of Job and Status that this code writes.
// Readers accept any version up to their own and ignore unknown fields.
const SchemaVersion = 1

// Kind is what an agent is asked to do.
type Kind string

// The kinds of job.
const (
	KindImplement Kind = "implement"
	KindReview    Kind = "review"
	KindFix       Kind = "fix"
	KindRespond   Kind = "respond"
	// KindCleanup runs no agent: the runner removes the task's worktree
	// (queued by the gateway when the task's pull request closes).
	KindCleanup Kind = "cleanup"
)

// Kinds lists every kind of job, the one list of them.
var Kinds = []Kind{KindImplement, KindReview, KindFix, KindRespond, KindCleanup}

// Valid reports whether k is one of the known kinds.
func (k Kind) Valid() bool { return slices.Contains(Kinds, k) }

// RunsAgent reports whether a job of kind k runs an agent: every known
// kind but KindCleanup. Only these may be named in a project's pipeline
// and agent permissions.
func (k Kind) RunsAgent() bool { return k.Valid() && k != KindCleanup }

// Job is one unit of work for an agent, the body of a message on
// JobSubject(Project, Kind).
type Job struct {
	Schema    int       `json:"schema"`
	ID        string    `json:"id"`
	Kind      Kind      `json:"kind"`
	Project   string    `json:"project"`
	Task      Task      `json:"task"`
	Source    Source    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
	// Trigger is the text that caused the job where there is one: the
	// comment, the review body, the failed workflow's name.
	Trigger string `json:"trigger,omitempty"`
	// RetryOf names the dead-lettered job this one re-runs.
	RetryOf string `json:"retry_of,omitempty"`
}

// Task is what the job is about: a work item or a pull request.
type Task struct {
	// ID is token-safe (see Token) and names the worktree and the branch
	// agent/<ID>.
	ID     string `json:"id"`
	Title  string `json:"title,omitempty"`
	Body   string `json:"body,omitempty"`
	URL    string `json:"url,omitempty"`
	Branch string `json:"branch,omitempty"`
	PR     int    `json:"pr,omitempty"`
	// HeadSHA is the commit the event names as the head of Branch (a pull
	// request's head, a workflow run's commit), where it names one. The
	// runner brings the worktree to it, or to a newer head on the remote,
	// before the job runs.
	HeadSHA string `json:"head_sha,omitempty"`
	// PlaneItem is the Plane work item's id (a UUID) for a task that came
	// from Plane: the notifier writes its tracking comment there. ID may
	// be the item's readable identifier instead, which Plane's API does
	// not take.
	PlaneItem string `json:"plane_item,omitempty"`
	// PlaneRun is the id of the Plane agent run (Plane's Agents API) the
	// job answers, for a project with plane_agent_app: the notifier posts
	// the run's activities there (a thought at once, the agent's tool
	// calls, the response or the error), and the run's stop cancels it.
	PlaneRun string `json:"plane_run,omitempty"`
	// FromFork says a pull request's head is not in the repository
	// itself: a fork's, or one the payload does not place. Branch is then
	// only the fork's name for its branch, which the repository may have a
	// branch of its own by (even agent/<task>): the head is the pull
	// request's refs/pull/<PR>/head, never origin/<Branch>.
	FromFork bool `json:"from_fork,omitempty"`
	// Author is who wrote Title and Body, where the trigger knows it: a
	// pull request's or issue's author (a Gitea login), a work item's
	// creator (a Plane member id). Title and Body are that person's
	// words, to be read as data, not as instructions.
	Author string `json:"author,omitempty"`
	// AuthorTrusted says Author is one of the project's trusted_actors.
	// Anyone may open a pull request, so a review's task is often a
	// stranger's; false (or absent, in jobs written before it) is the
	// safe reading.
	AuthorTrusted bool `json:"author_trusted,omitempty"`
}

// Source says which event made the job.
type Source struct {
	// System is "gitea", "plane", "api" or "runner" (pipeline advance).
	System   string `json:"system"`
	Event    string `json:"event,omitempty"`
	Delivery string `json:"delivery,omitempty"`
	// Actor is who caused the job, and wrote Job.Trigger where it is a
	// comment or a review: a Gitea login, or a Plane member's e-mail (or
	// id when the payload has no e-mail).
	Actor string `json:"actor,omitempty"`
	// Trusted says Actor is one of the project's trusted_actors. The
	// gateway starts a job from a person's words (a review, a mention, a
	// label or an assignment) only for a trusted actor; a pull request
	// event or a failed workflow run starts one for anyone, with Trusted
	// false. False (or absent, in jobs written before it) is the safe
	// reading.
	Trusted bool `json:"trusted,omitempty"`
}

// JobID derives a job id from a dedupe key built from an event's content,
// so the same event delivered twice names the same job.
func JobID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:12])
}

// Validate reports what makes j unusable by a runner.
func (j *Job) Validate() error {
	switch {
	case j.ID == "":
		return fmt.Errorf("job has no id")
	case j.Schema > SchemaVersion:
		// A newer writer may rely on fields this reader ignores; still
		// run it, the rule is that new fields are additive.
		return nil
	case !j.Kind.Valid():
		return fmt.Errorf("job %s: unknown kind %q", j.ID, j.Kind)
	case j.Project == "" || Token(j.Project) != j.Project:
		return fmt.Errorf("job %s: bad project %q", j.ID, j.Project)
	case j.Task.ID == "" || Token(j.Task.ID) != j.Task.ID:
		return fmt.Errorf("job %s: bad task id %q", j.ID, j.Task.ID)
	}
	return nil
}

// DecodeJob parses a job message and validates it.
func DecodeJob(data []byte) (*Job, error) {
	var j Job
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("decoding job: %w", err)
	}
	if err := j.Validate(); err != nil {
		return &j, err
	}
	return &j, nil
}
