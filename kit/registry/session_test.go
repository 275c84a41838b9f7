package registry

import "testing"

// session is continue by default, fresh when asked; anything else is
// refused at load.
func TestSessionKey(t *testing.T) {
	r, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: acme/a\n  - key: b\n    gitea_repo: acme/b\n    session: fresh\n  - key: c\n    gitea_repo: acme/c\n    session: continue\n"))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if p, _ := r.ByKey(key); p.Resumes() != want {
			t.Errorf("project %s: Resumes %v, want %v", key, p.Resumes(), want)
		}
	}
	if _, err := Parse([]byte("projects:\n  - key: a\n    gitea_repo: acme/a\n    session: resume\n")); err == nil {
		t.Error("session: resume accepted")
	}
}
