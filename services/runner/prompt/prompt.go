// Package prompt writes the task out for the agent: a Markdown text made
// from a template per kind of job. Each kind has an embedded default
// (templates/<kind>.md); a project may replace any of them with its own
// file, named in the registry's templates map relative to the registry file.
// The words of people (titles, descriptions, comments, reviews) are quoted
// in fenced blocks that the task tells the agent to read as data (see
// Data.Quote).
package prompt

import (
	"bytes"
	"embed"
	"fmt"
	"os"
	"path/filepath"
	"text/template"

	"github.com/orch-dev/orch/kit/registry"
	"github.com/orch-dev/orch/proto"
)

//go:embed templates/*.md templates/*.tmpl
var defaults embed.FS

// defaultName is the template of a kind that has none of its own.
const defaultName = "default.md"

// builtin holds the embedded templates, named <kind>.md, and the parts
// they share ("head", "trigger", "foot"), which overrides may use too.
var builtin = template.Must(template.ParseFS(defaults, "templates/*.md", "templates/*.tmpl"))

// Data is what a template sees.
type Data struct {
	Job *proto.Job
	// Attempt is this delivery of the job, from 1; Max is the last one.
	Attempt int
	Max     int
	// Branch is the branch checked out in the worktree Dir: agent/<task>,
	// or the head branch of a pull request that is not an agent branch.
	Branch string
	Dir    string
	// Head is the commit the worktree was prepared at. Upstream is the
	// remote branch Branch tracks (origin/<branch>), which a plain `git
	// push` updates; empty while the branch is not on the remote.
	Head     string
	Upstream string
	// Notes say where the worktree is not simply at the head the job is
	// about: kept work of an earlier job, a head that moved on.
	Notes []string

	// marker fences the texts people wrote (see Quote); Render sets it.
	marker string
}

// Templates are the task templates of every project.
type Templates struct {
	// overrides maps project key, then kind, to a parsed template.
	overrides map[string]map[proto.Kind]*template.Template
}

// Load reads the per-project overrides named in reg. A missing or broken
// template file is an error that names it, so it shows at start and not on
// the first job.
func Load(reg *registry.Registry) (*Templates, error) {
	t := &Templates{overrides: map[string]map[proto.Kind]*template.Template{}}
	if reg == nil {
		return t, nil
	}
	base := filepath.Dir(reg.Path)
	for _, p := range reg.Projects() {
		for kind, file := range p.Templates {
			if !proto.Kind(kind).Valid() {
				return nil, fmt.Errorf("project %s: template for unknown kind %q", p.Key, kind)
			}
			path := file
			if !filepath.IsAbs(path) {
				path = filepath.Join(base, file)
			}
			text, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("project %s: template %s: %w", p.Key, kind, err)
			}
			tmpl, err := template.Must(builtin.Clone()).New(path).Parse(string(text))
			if err != nil {
				return nil, fmt.Errorf("project %s: template %s: %w", p.Key, kind, err)
			}
			if t.overrides[p.Key] == nil {
				t.overrides[p.Key] = map[proto.Kind]*template.Template{}
			}
			t.overrides[p.Key][proto.Kind(kind)] = tmpl
		}
	}
	return t, nil
}

// Render returns the task text for d.Job: the project's template of its
// kind if there is one, else the embedded default.
func (t *Templates) Render(d Data) (string, error) {
	d.marker = chooseMarker(d)
	var buf bytes.Buffer
	var err error
	if tmpl := t.override(d.Job.Project, d.Job.Kind); tmpl != nil {
		err = tmpl.Execute(&buf, d)
	} else {
		name := string(d.Job.Kind) + ".md"
		if builtin.Lookup(name) == nil {
			name = defaultName
		}
		err = builtin.ExecuteTemplate(&buf, name, d)
	}
	if err != nil {
		return "", fmt.Errorf("rendering task of job %s: %w", d.Job.ID, err)
	}
	return buf.String(), nil
}

func (t *Templates) override(project string, kind proto.Kind) *template.Template {
	if t == nil {
		return nil
	}
	return t.overrides[project][kind]
}
