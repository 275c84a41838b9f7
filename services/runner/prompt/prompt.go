// Package prompt writes the task out for the agent: a Markdown text made
// from a template per kind of job.
package prompt

import (
	"bytes"
	"embed"
	"fmt"
	"text/template"

	"github.com/orch-dev/orch/proto"
)

//go:embed templates/*.md
var defaults embed.FS

var templates = template.Must(template.ParseFS(defaults, "templates/*.md"))

// Data is what a template sees.
type Data struct {
	Job     *proto.Job
	Attempt int
	Max     int
}

// Render returns the task text for attempt of job.
func Render(job *proto.Job, attempt, maxAttempts int) (string, error) {
	var buf bytes.Buffer
	name := string(job.Kind) + ".md"
	if templates.Lookup(name) == nil {
		name = "default.md"
	}
	if err := templates.ExecuteTemplate(&buf, name, Data{Job: job, Attempt: attempt, Max: maxAttempts}); err != nil {
		return "", fmt.Errorf("rendering task of job %s: %w", job.ID, err)
	}
	return buf.String(), nil
}
