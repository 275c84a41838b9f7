// Package registry reads projects.yaml, the list of projects orch serves.
// The gateway and the runner both load it; events of any other project are
// ignored.
package registry

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/orch-dev/orch/proto"
	"go.yaml.in/yaml/v3"
)

// Defaults of a project's optional keys.
const (
	LabelDefault   = "agent"
	MentionDefault = "@agent"
	BranchDefault  = "main"
)

// Project is one entry of projects.yaml.
type Project struct {
	// Key names the project in subjects and paths: [a-z0-9_-]+.
	Key string `yaml:"key"`
	// GiteaRepo is repository.full_name in Gitea payloads, e.g. "acme/api".
	GiteaRepo string `yaml:"gitea_repo"`
	// PlaneProject is the Plane project id (a UUID).
	PlaneProject string `yaml:"plane_project"`
	// CloneURL is what the runner clones: a URL or a local path.
	CloneURL string `yaml:"clone_url"`
	// DefaultBranch is where new task branches start. Default "main".
	DefaultBranch string `yaml:"default_branch"`
	// Label is the trigger label. Default "agent".
	Label string `yaml:"label"`
	// Mention is the trigger mention. Default "@agent".
	Mention string `yaml:"mention"`
	// AgentUser is the agent's Gitea login; its comments never trigger.
	AgentUser string `yaml:"agent_user"`
	// PlaneAgentMember is the agent's Plane member: its user id, the id
	// Plane's assignee ids and the editor's mentions (entity_identifier)
	// use, not the id of its workspace membership. Assigning it triggers
	// an implement job, mentioning it in a comment a respond job.
	PlaneAgentMember string `yaml:"plane_agent_member"`
	// PlaneAgentApp says the agent is installed in the workspace as a
	// Plane agent app (Plane's Agents API, beta): the agent runs Plane
	// creates when a person mentions or assigns it become jobs, and the
	// notifier reports on each run (thought, actions, response) with the
	// app's bot token. Needs plane_project and plane_workspace.
	PlaneAgentApp bool `yaml:"plane_agent_app"`
	// TrustedActors are the people whose words may start a job: each is
	// gitea:<login>, plane:<member id> or plane:<email>; an untyped entry
	// is a Gitea login or, when it holds an @, a Plane member's e-mail
	// (see parseTrusted). Display names never match.
	TrustedActors []string `yaml:"trusted_actors"`
	// AgentCommand overrides ORCH_AGENT_COMMAND for this project.
	AgentCommand []string `yaml:"agent_command"`
	// AgentTimeout overrides ORCH_AGENT_TIMEOUT for this project.
	AgentTimeout time.Duration `yaml:"agent_timeout"`
	// Pipeline maps a kind to the kind queued when it succeeds.
	Pipeline map[string]string `yaml:"pipeline"`
	// Templates overrides the task template of a kind: a file path,
	// relative to the registry file.
	Templates map[string]string `yaml:"templates"`
	// AgentPermissions is what Claude Code may do unattended; nil means
	// the runner's default of each kind. See Permissions.
	AgentPermissions *AgentPermissions `yaml:"agent_permissions"`
	// GitAuthor is the name and email of the agent's commits; nil leaves
	// the identity to the runner's environment and git configuration.
	GitAuthor *GitAuthor `yaml:"git_author"`
	// PlaneWorkspace is the slug of the Plane workspace of PlaneProject,
	// which Plane's API paths need: the notifier comments on work items
	// only where it is set.
	PlaneWorkspace string `yaml:"plane_workspace"`
	// SparseCheckout lists the directories a new worktree of the project
	// checks out (git's cone mode: those directories and the files at
	// the top); empty checks out everything. A worktree keeps what it was
	// made with.
	SparseCheckout []string `yaml:"sparse_checkout"`
	// SpareWorktree false keeps no spare worktree for the project's next
	// new task (a big repository's disk); unset or true keeps one.
	SpareWorktree *bool `yaml:"spare_worktree"`
	// Egress are more host[:port] entries (port 443 when left out) this
	// project's confined agents may reach, besides ORCH_AGENT_EGRESS, the
	// project's git host and the model API (a package registry).
	Egress []string `yaml:"egress"`
	// trust is TrustedActors parsed, as the triggers match them.
	trust trustSet
	// Writeback says what the notifier writes back to the tracker a job
	// came from: WritebackComment, WritebackStatus, WritebackBoth or
	// WritebackOff. Empty means WritebackBoth wherever the tracker's URL
	// and token are configured.
	Writeback string `yaml:"writeback"`
	// MaxConcurrency bounds how many of this project's agents run at once
	// across every runner; zero leaves only ORCH_MAX_CONCURRENCY. The
	// runners keep it exact with a slot per agent (docs/runner.md).
	MaxConcurrency int `yaml:"max_concurrency"`
	// Priority sets a kind's priority within the project (priority.go).
	Priority map[string]string `yaml:"priority"`
	// Budget limits the project's spend per day and month (spend.go).
	Budget *Budget `yaml:"budget"`
	// MaxCostUSD limits one job's spend, per kind where a map.
	MaxCostUSD CostCap `yaml:"max_cost_usd"`
	// MaxTurns limits one attempt's agent turns (Claude Code's
	// --max-turns); 0 is none.
	MaxTurns int `yaml:"max_turns"`
	// Supersede says which older jobs of a task and kind a newer one
	// cancels: SupersedeQueued (the default) or SupersedeRunning.
	Supersede string `yaml:"supersede"`
	// Session says whether an attempt resumes the agent's last session
	// of the task: SessionContinue (the default) or SessionFresh
	// (session.go).
	Session string `yaml:"session"`
}

// The values of Project.Writeback.
const (
	// WritebackComment keeps one tracking comment per job on the pull
	// request or work item.
	WritebackComment = "comment"
	// WritebackStatus sets a Gitea commit status on a pull request's head.
	WritebackStatus = "status"
	// WritebackBoth does both.
	WritebackBoth = "both"
	// WritebackOff writes nothing back.
	WritebackOff = "off"
)

// WritesComment reports whether the project wants tracking comments.
func (p *Project) WritesComment() bool {
	return p.Writeback == "" || p.Writeback == WritebackComment || p.Writeback == WritebackBoth
}

// WritesStatus reports whether the project wants Gitea commit statuses.
func (p *Project) WritesStatus() bool {
	return p.Writeback == "" || p.Writeback == WritebackStatus || p.Writeback == WritebackBoth
}

// Registry is the set of projects, looked up by key, Gitea repository or
// Plane project id.
type Registry struct {
	// Path is the file it was read from.
	Path     string
	projects []*Project
	byKey    map[string]*Project
	byRepo   map[string]*Project
	byPlane  map[string]*Project
}

var keyPattern = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// Load reads and checks the registry file at path. Its errors name the
// file and the line.
func Load(path string) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading registry: %w", err)
	}
	r, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	r.Path = path
	return r, nil
}

// Parse reads a registry from YAML. Unknown keys are errors, so a typo does
// not silently disable a project.
func Parse(data []byte) (*Registry, error) {
	// Decode twice: strictly into Projects, so unknown keys fail with
	// their line, and into nodes, so checks below can name the line too.
	var doc struct {
		Projects []*Project `yaml:"projects"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	var nodes struct {
		Projects []yaml.Node `yaml:"projects"`
	}
	if err := yaml.Unmarshal(data, &nodes); err != nil {
		return nil, err
	}
	r := &Registry{
		byKey:   map[string]*Project{},
		byRepo:  map[string]*Project{},
		byPlane: map[string]*Project{},
	}
	for i, p := range doc.Projects {
		line := nodes.Projects[i].Line
		if p == nil {
			return nil, fmt.Errorf("line %d: empty project", line)
		}
		if err := p.parseTrusted(); err != nil {
			return nil, fmt.Errorf("line %d: project %q: %w", entryLine(&nodes.Projects[i], "trusted_actors", err.index), p.Key, err)
		}
		if err := p.AgentPermissions.check(); err != nil {
			return nil, fmt.Errorf("line %d: project %q: %w", permLine(&nodes.Projects[i], err.kind), p.Key, err)
		}
		if err := r.add(p); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
	}
	return r, nil
}

func (r *Registry) add(p *Project) error {
	if !keyPattern.MatchString(p.Key) {
		return fmt.Errorf("project key %q: want 1 to 64 of [a-z0-9_-]", p.Key)
	}
	if _, dup := r.byKey[p.Key]; dup {
		return fmt.Errorf("project key %q appears twice", p.Key)
	}
	if p.GiteaRepo == "" && p.PlaneProject == "" {
		return fmt.Errorf("project %q: needs gitea_repo or plane_project", p.Key)
	}
	if p.PlaneAgentApp && (p.PlaneProject == "" || p.PlaneWorkspace == "") {
		return fmt.Errorf("project %q: plane_agent_app needs plane_project and plane_workspace (the slug of the runs API's paths)", p.Key)
	}
	if a := p.GitAuthor; a != nil && (a.Name == "" || a.Email == "") {
		return fmt.Errorf("project %q: git_author needs both name and email", p.Key)
	}
	for kind, next := range p.Pipeline {
		if !proto.Kind(kind).RunsAgent() || !proto.Kind(next).RunsAgent() {
			return fmt.Errorf("project %q: pipeline %s: %s names an unknown kind", p.Key, kind, next)
		}
	}
	for _, d := range p.SparseCheckout {
		if !sparseDir(d) {
			return fmt.Errorf("project %q: sparse_checkout %q: want a directory of the repository, like src/api", p.Key, d)
		}
	}
	if err := p.checkSpend(); err != nil {
		return err
	}
	if err := p.checkSession(); err != nil {
		return err
	}
	if p.MaxConcurrency < 0 {
		return fmt.Errorf("project %q: max_concurrency %d: want 0 (no limit of its own) or more", p.Key, p.MaxConcurrency)
	}
	for kind, level := range p.Priority {
		if !proto.Kind(kind).Valid() {
			return fmt.Errorf("project %q: priority %s: unknown kind", p.Key, kind)
		}
		switch level {
		case PriorityHigh, PriorityNormal, PriorityLow:
		default:
			return fmt.Errorf("project %q: priority %s: %q: want high, normal or low", p.Key, kind, level)
		}
	}
	switch p.Writeback {
	case "", WritebackComment, WritebackStatus, WritebackBoth, WritebackOff:
	default:
		return fmt.Errorf("project %q: writeback %q: want comment, status, both or off", p.Key, p.Writeback)
	}
	if p.DefaultBranch == "" {
		p.DefaultBranch = BranchDefault
	}
	if p.Label == "" {
		p.Label = LabelDefault
	}
	if p.Mention == "" {
		p.Mention = MentionDefault
	}
	if p.GiteaRepo != "" {
		if other, dup := r.byRepo[p.GiteaRepo]; dup {
			return fmt.Errorf("project %q: gitea_repo %q is already project %q", p.Key, p.GiteaRepo, other.Key)
		}
		r.byRepo[p.GiteaRepo] = p
	}
	if p.PlaneProject != "" {
		if other, dup := r.byPlane[p.PlaneProject]; dup {
			return fmt.Errorf("project %q: plane_project %q is already project %q", p.Key, p.PlaneProject, other.Key)
		}
		r.byPlane[p.PlaneProject] = p
	}
	r.byKey[p.Key] = p
	r.projects = append(r.projects, p)
	return nil
}

// sparseDir reports whether d names a directory inside a repository as
// git's cone mode takes it: a relative path of plain components.
func sparseDir(d string) bool {
	if d == "" || strings.HasPrefix(d, "/") || strings.ContainsAny(d, "*?[\\!\n") {
		return false
	}
	for _, c := range strings.Split(strings.TrimSuffix(d, "/"), "/") {
		if c == "" || c == "." || c == ".." || c == ".git" {
			return false
		}
	}
	return true
}

// Projects returns every project in file order.
func (r *Registry) Projects() []*Project { return r.projects }

// ByKey returns the project with key k.
func (r *Registry) ByKey(k string) (*Project, bool) { p, ok := r.byKey[k]; return p, ok }

// ByGiteaRepo returns the project serving a Gitea repository full name.
func (r *Registry) ByGiteaRepo(repo string) (*Project, bool) { p, ok := r.byRepo[repo]; return p, ok }

// ByPlaneProject returns the project serving a Plane project id.
func (r *Registry) ByPlaneProject(id string) (*Project, bool) { p, ok := r.byPlane[id]; return p, ok }
