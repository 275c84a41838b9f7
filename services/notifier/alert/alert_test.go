package alert

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/notifier/telegram"
)

func failure() Failure {
	code := 2
	return Failure{
		Status: &proto.Status{
			Job: proto.Job{ID: "abc123", Kind: proto.KindFix, Project: "acme",
				Task: proto.Task{ID: "task-7", Title: "Fix <login> & “signup” 🚀 Починить", URL: "https://plane.example.com/acme/issues/7?a=1&b=2"}},
			MaxAttempts: 3, ExitCode: &code, Error: "exit 2: <nil> & ошибка", CostUSD: 1.5, SpentUSD: 4.25,
		},
		Attempts: 3, Reason: "failed on every attempt",
		LogTail: "line 1\nline <2> & 🚀",
		JobURL:  "https://orch.example.com/ui/jobs/abc123",
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	got := Render(failure())
	for _, want := range []string{
		"<b>orch: fix failed</b> in <b>acme</b>",
		`Task: <a href="https://plane.example.com/acme/issues/7?a=1&amp;b=2">Fix &lt;login&gt; &amp; “signup” 🚀 Починить</a> (task-7)`,
		"Attempts: 3 of 3\n",
		"Exit code: 2\n",
		"Reason: failed on every attempt\n",
		"Cost: $1.50\n",
		"Cost of all attempts: $4.25\n",
		`Job: <code>abc123</code> · <a href="https://orch.example.com/ui/jobs/abc123">details</a>`,
		"Error: exit 2: &lt;nil&gt; &amp; ошибка",
		"<pre>line 1\nline &lt;2&gt; &amp; 🚀</pre>",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Render lacks %q:\n%s", want, got)
		}
	}
}

func TestRenderUnreadableLog(t *testing.T) {
	t.Parallel()
	f := failure()
	f.LogTail, f.Status.Log = "", "/var/orch/logs/abc123-3.log"
	got := Render(f)
	if !strings.Contains(got, "Log: <code>/var/orch/logs/abc123-3.log</code> (not readable here)") || strings.Contains(got, "<pre>") {
		t.Errorf("Render without a readable log:\n%s", got)
	}
	if !strings.Contains(got, "Error: exit 2") {
		t.Errorf("Render without a log lacks the error text:\n%s", got)
	}
}

// entity matches what may follow '&' in the output.
var entity = regexp.MustCompile(`&(amp|lt|gt|quot);`)

func TestRenderCutsToFit(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*Failure){
		"huge everything": func(f *Failure) {
			f.Status.Job.Task.Title = strings.Repeat("<Заголовок & 🚀>", 500)
			f.Reason = strings.Repeat("r&<", 2000)
			f.Status.Error = strings.Repeat("ошибка <&> 💥 ", 3000)
			f.LogTail = strings.Repeat("лог строка <&> 🚀 & more\n", 3000)
		},
		"huge log only": func(f *Failure) { f.LogTail = strings.Repeat("&", 50000) },
		"huge error, no log": func(f *Failure) {
			f.LogTail = ""
			f.Status.Error = strings.Repeat("💥&", 10000)
		},
		"huge url": func(f *Failure) { f.Status.Job.Task.URL = "https://x/" + strings.Repeat("a", 5000) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := failure()
			mod(&f)
			got := Render(f)
			if n := telegram.Len(got); n > telegram.MaxMessageLen {
				t.Errorf("%d units, want at most %d", n, telegram.MaxMessageLen)
			}
			if name != "huge url" && !strings.Contains(got, CutMarker) {
				t.Errorf("no cut marker:\n%.300s", got)
			}
			rest := got
			for i := strings.IndexByte(rest, '&'); i >= 0; i = strings.IndexByte(rest, '&') {
				if !entity.MatchString(rest[i:min(len(rest), i+6)]) {
					t.Fatalf("a split or raw entity at %q", rest[i:min(len(rest), i+8)])
				}
				rest = rest[i+1:]
			}
			if !strings.Contains(got, "Job: <code>abc123</code>") || !strings.Contains(got, "Attempts: 3") {
				t.Errorf("cutting lost the header:\n%.500s", got)
			}
			if strings.Count(got, "<pre>") != strings.Count(got, "</pre>") {
				t.Error("unbalanced <pre>")
			}
		})
	}
}

func TestLogTail(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.log")
	var b strings.Builder
	for i := range 100 {
		b.WriteString(strings.Repeat("x", i) + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	got := LogTail(path, 3)
	if want := strings.Repeat("x", 97) + "\n" + strings.Repeat("x", 98) + "\n" + strings.Repeat("x", 99); got != want {
		t.Errorf("LogTail = %q", got)
	}
	if got := LogTail(filepath.Join(dir, "missing.log"), 3); got != "" {
		t.Errorf("LogTail of a missing file = %q", got)
	}
	if got := LogTail("", 3); got != "" {
		t.Errorf(`LogTail("") = %q`, got)
	}
}
