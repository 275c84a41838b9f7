package webhook

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

// The reference decoding: encoding/json into tagged copies of the payload
// types. ParseGitea must read every body the same way, except where
// TestParseGiteaDiffers pins the intended difference.
type (
	refUser   struct{ Login, Email string }
	refBranch struct {
		Ref, SHA string
		RepoID   int64 `json:"repo_id"`
		Repo     refRepo
	}
	refPR struct {
		Number      int
		Title, Body string
		HTMLURL     string `json:"html_url"`
		Head, Base  refBranch
		ClosedAt    string `json:"closed_at"`
		User        refUser
	}
	refRepo struct {
		FullName string `json:"full_name"`
	}
	refPREvent struct {
		Action      string
		PullRequest *refPR `json:"pull_request"`
		Review      *struct{ Content string }
		Repository  refRepo
		Sender      refUser
	}
	refCommentEvent struct {
		Action string
		Issue  *struct {
			Number      int
			Title, Body string
			HTMLURL     string `json:"html_url"`
			User        refUser
			PullRequest *struct{} `json:"pull_request"`
		}
		Comment *struct {
			ID        int64
			Body      string
			User      refUser
			CreatedAt string `json:"created_at"`
		}
		PullRequest *refPR `json:"pull_request"`
		IsPull      bool   `json:"is_pull"`
		Repository  refRepo
		Sender      refUser
	}
	refRunEvent struct {
		Action      string
		Workflow    *struct{ Name string }
		WorkflowRun *struct {
			ID           int64
			HTMLURL      string `json:"html_url"`
			DisplayTitle string `json:"display_title"`
			RunAttempt   int64  `json:"run_attempt"`
			HeadSHA      string `json:"head_sha"`
			HeadBranch   string `json:"head_branch"`
			Conclusion   string
			Event        string
			HeadRepo     refRepo `json:"head_repository"`
		} `json:"workflow_run"`
		Repository refRepo
		Sender     refUser
	}
)

func (p *refPR) conv() *GiteaPullRequest {
	if p == nil {
		return nil
	}
	return &GiteaPullRequest{Number: p.Number, Title: p.Title, Body: p.Body, HTMLURL: p.HTMLURL,
		Head: p.Head.conv(), Base: p.Base.conv(), ClosedAt: p.ClosedAt, User: GiteaUser(p.User)}
}

func (b refBranch) conv() GiteaBranch {
	return GiteaBranch{Ref: b.Ref, SHA: b.SHA, RepoID: b.RepoID, Repo: GiteaRepo(b.Repo)}
}

// refParse is ParseGitea as encoding/json reads it.
func refParse(eventType string, body []byte) (*GiteaEvent, error) {
	ev := &GiteaEvent{Type: eventType}
	switch eventType {
	case "pull_request", "pull_request_sync", "pull_request_review_rejected",
		"pull_request_review_approved", "pull_request_review_comment":
		var r refPREvent
		if err := json.Unmarshal(body, &r); err != nil || r.PullRequest == nil {
			return nil, errors.New("bad")
		}
		ev.PullRequest = &GiteaPullRequestEvent{Action: r.Action, PullRequest: r.PullRequest.conv(),
			Repository: GiteaRepo(r.Repository), Sender: GiteaUser(r.Sender)}
		if r.Review != nil {
			ev.PullRequest.Review = &GiteaReview{Content: r.Review.Content}
		}
	case "issue_comment", "pull_request_comment":
		var r refCommentEvent
		if err := json.Unmarshal(body, &r); err != nil || r.Issue == nil || r.Comment == nil {
			return nil, errors.New("bad")
		}
		ev.Comment = &GiteaCommentEvent{Action: r.Action, PullRequest: r.PullRequest.conv(), IsPull: r.IsPull,
			Repository: GiteaRepo(r.Repository), Sender: GiteaUser(r.Sender),
			Issue: &GiteaIssue{Number: r.Issue.Number, Title: r.Issue.Title, Body: r.Issue.Body,
				HTMLURL: r.Issue.HTMLURL, User: GiteaUser(r.Issue.User), IsPullRequest: r.Issue.PullRequest != nil},
			Comment: &GiteaComment{ID: r.Comment.ID, Body: r.Comment.Body, User: GiteaUser(r.Comment.User),
				CreatedAt: r.Comment.CreatedAt}}
	case "workflow_run":
		var r refRunEvent
		if err := json.Unmarshal(body, &r); err != nil || r.WorkflowRun == nil {
			return nil, errors.New("bad")
		}
		w := r.WorkflowRun
		ev.WorkflowRun = &GiteaWorkflowRunEvent{Action: r.Action, Repository: GiteaRepo(r.Repository),
			Sender: GiteaUser(r.Sender), WorkflowRun: &GiteaWorkflowRun{ID: w.ID, HTMLURL: w.HTMLURL,
				DisplayTitle: w.DisplayTitle, RunAttempt: w.RunAttempt, HeadSHA: w.HeadSHA, HeadBranch: w.HeadBranch,
				Conclusion: w.Conclusion, Event: w.Event, HeadRepository: GiteaRepo(w.HeadRepo)}}
		if r.Workflow != nil {
			ev.WorkflowRun.Workflow = &GiteaWorkflow{Name: r.Workflow.Name}
		}
	default:
		if !json.Valid(body) {
			return nil, errors.New("bad")
		}
	}
	return ev, nil
}

// comparable reports whether body avoids the pinned differences: every
// member name is lowercase ASCII (encoding/json also matches other
// cases), no lone surrogate escapes (encoding/json makes them U+FFFD,
// fastjson keeps the escape), nesting within fastjson.MaxDepth.
func comparable(body []byte) bool {
	if strings.Contains(strings.ToLower(string(body)), `\ud`) {
		return false
	}
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		return !strings.Contains(err.Error(), "depth")
	}
	ok := true
	var walk func(v *fastjson.Value)
	walk = func(v *fastjson.Value) {
		switch v.Type() {
		case fastjson.TypeObject:
			o, _ := v.Object()
			o.Visit(func(k []byte, v *fastjson.Value) {
				for _, c := range k {
					if c >= 'A' && c <= 'Z' || c >= 0x80 {
						ok = false
					}
				}
				walk(v)
			})
		case fastjson.TypeArray:
			a, _ := v.Array()
			for _, e := range a {
				walk(e)
			}
		}
	}
	walk(v)
	return ok
}

// ParseGitea reads what encoding/json reads, and refuses what it refuses.
func FuzzParseGiteaMatchesStdlib(f *testing.F) {
	for _, s := range seeds(f, "gitea", GiteaEventType) {
		f.Add(s[0], []byte(s[1]))
	}
	f.Add("pull_request", []byte(`{"pull_request":{"number":"1"}}`))
	f.Add("issue_comment", []byte(`{"issue":{"pull_request":{}},"comment":{"id":1.5}}`))
	f.Add("workflow_run", []byte("{\"workflow_run\":{\"head_sha\":\"a\x01\"}}"))
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		if event == "" || !comparable(body) {
			return
		}
		got, err := ParseGitea(event, body)
		want, wantErr := refParse(event, body)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("ParseGitea error %v, encoding/json error %v", err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseGitea read\n%+v\nencoding/json read\n%+v", got, want)
		}
	})
}

// The fixtures read as encoding/json reads them.
func TestParseGiteaFixtures(t *testing.T) {
	for _, s := range seeds(t, "gitea", GiteaEventType) {
		got, err := ParseGitea(s[0], []byte(s[1]))
		want, wantErr := refParse(s[0], []byte(s[1]))
		if err != nil || wantErr != nil {
			t.Fatalf("%s: %v, %v", s[0], err, wantErr)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: ParseGitea read\n%+v\nencoding/json read\n%+v", s[0], got, want)
		}
	}
}

// Where ParseGitea differs from encoding/json, on purpose.
func TestParseGiteaDiffers(t *testing.T) {
	deep := strings.Repeat("[", fastjson.MaxDepth+1) + strings.Repeat("]", fastjson.MaxDepth+1)
	for _, tc := range []struct {
		name, event, body string
		// err is part of the error, empty when the body parses.
		err string
		// check looks at a body that parses.
		check func(t *testing.T, ev *GiteaEvent)
	}{
		{name: "a field orch reads with the wrong type is refused, naming the field",
			event: "pull_request", body: `{"pull_request":{"head":{"sha":7}}}`,
			err: "pull_request.head.sha is number, want string"},
		{name: "a fractional number where orch reads an integer is refused",
			event: "issue_comment", body: `{"issue":{},"comment":{"id":1.5}}`,
			err: "comment.id is number, want an integer"},
		{name: "a field orch does not read may have any type (encoding/json refused a wrong type in its typed fields)",
			event: "pull_request", body: `{"pull_request":{"merged":"yes","id":"x","user":{"id":"x"}}}`,
			check: func(t *testing.T, ev *GiteaEvent) {
				if ev.PullRequest.PullRequest == nil {
					t.Fatal("no pull request")
				}
			}},
		{name: "member names match exactly: Gitea sends them lowercase (encoding/json also matched other cases)",
			event: "pull_request", body: `{"Action":"opened","pull_request":{}}`,
			check: func(t *testing.T, ev *GiteaEvent) {
				if ev.PullRequest.Action != "" {
					t.Fatalf("action %q read from Action", ev.PullRequest.Action)
				}
			}},
		{name: "of two members with the same name the last wins, as in encoding/json",
			event: "pull_request", body: `{"action":"opened","action":"closed","pull_request":{}}`,
			check: func(t *testing.T, ev *GiteaEvent) {
				if ev.PullRequest.Action != "closed" {
					t.Fatalf("action %q", ev.PullRequest.Action)
				}
			}},
		{name: "a raw control character in a string is not JSON",
			event: "push", body: "{\"ref\":\"a\x01\"}", err: "not JSON"},
		{name: "nesting deeper than fastjson.MaxDepth is refused (encoding/json allowed 10000)",
			event: "push", body: `{"a":` + deep + `}`, err: "not JSON"},
		{name: "invalid UTF-8 becomes U+FFFD, as in encoding/json",
			event: "pull_request", body: "{\"pull_request\":{\"title\":\"a\xffb\"}}",
			check: func(t *testing.T, ev *GiteaEvent) {
				if got := ev.PullRequest.PullRequest.Title; got != "a\uFFFDb" {
					t.Fatalf("title %q", got)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := ParseGitea(tc.event, []byte(tc.body))
			if tc.err != "" {
				if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want ErrMalformed with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, ev)
		})
	}
}

// validJSON agrees with encoding/json.Valid.
func FuzzValidJSON(f *testing.F) {
	for _, s := range seeds(f, "gitea", GiteaEventType) {
		f.Add([]byte(s[1]))
	}
	f.Add([]byte(`{"a":"\"\\","b":[1,-2.5e3,true,null]}`))
	f.Add([]byte("{\"\":[\"\x1c\\b\"]}"))
	f.Fuzz(func(t *testing.T, body []byte) {
		if strings.Count(string(body), "[")+strings.Count(string(body), "{") > fastjson.MaxDepth {
			return
		}
		if got, want := validJSON(body), json.Valid(body); got != want {
			t.Fatalf("validJSON %v, encoding/json %v", got, want)
		}
	})
}
