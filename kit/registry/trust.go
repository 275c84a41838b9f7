package registry

import (
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// The systems a trusted_actors entry may name.
const (
	SystemGitea = "gitea"
	SystemPlane = "plane"
)

// trustSet is a project's trusted_actors as the triggers match them, each
// set keyed in lower case. A Gitea account is named only by its login:
// the e-mail in a Gitea payload is whatever the account typed (Gitea does
// not confirm it by default) or a placeholder, so it proves nothing. A
// Plane member is named by its id or its e-mail, never its display name,
// which any member may set to anything.
type trustSet struct {
	giteaLogins map[string]bool
	planeIDs    map[string]bool
	planeEmails map[string]bool
}

var (
	// giteaLogin is the character set of a Gitea user name.
	giteaLogin = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)
	// memberID is a Plane member id: a UUID.
	memberID = regexp.MustCompile(`^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$`)
	// email is loose on purpose: one @ with something on either side and
	// no spaces; the sender's own checks are stricter.
	email = regexp.MustCompile(`^[^@\s:]+@[^@\s]+$`)
)

// trustError is a bad trusted_actors entry; index says which, so the
// error can name its line.
type trustError struct {
	index int
	msg   string
}

func (e *trustError) Error() string { return e.msg }

// parseTrusted reads p.TrustedActors into p.trust. An entry is
//
//   - gitea:<login>: the Gitea account of that login, in any case (Gitea
//     logins are case-insensitive: no two accounts differ only in case);
//   - plane:<member id> or plane:<email>: the Plane member of that id or
//     e-mail (matched case-insensitively);
//   - untyped, as registries were written before types: an e-mail (it
//     has an @) is a Plane member's e-mail, a UUID is a Plane member id
//     (Plane makes those, no one chooses one, so no Gitea account may
//     claim it as a login), anything else a Gitea login.
//
// Anything else, such as "gitea:" or "github:x", is an error.
func (p *Project) parseTrusted() *trustError {
	t := trustSet{giteaLogins: map[string]bool{}, planeIDs: map[string]bool{}, planeEmails: map[string]bool{}}
	for i, entry := range p.TrustedActors {
		bad := func(why string) *trustError {
			return &trustError{index: i, msg: fmt.Sprintf("trusted_actors entry %q: %s", entry, why)}
		}
		system, name, typed := strings.Cut(strings.TrimSpace(entry), ":")
		if !typed {
			system, name = "", system
		}
		key := strings.ToLower(name)
		switch {
		case system == SystemGitea && giteaLogin.MatchString(name):
			t.giteaLogins[key] = true
		case system == SystemGitea:
			return bad("want gitea:<login>, a Gitea user name of letters, digits, '-', '_' and '.'")
		case system == SystemPlane && memberID.MatchString(name):
			t.planeIDs[key] = true
		case system == SystemPlane && email.MatchString(name):
			t.planeEmails[key] = true
		case system == SystemPlane:
			return bad("want plane:<member id> (a UUID) or plane:<email>; display names are never matched")
		case typed:
			return bad(fmt.Sprintf("unknown system %q: want gitea:<login>, plane:<member id> or plane:<email>", system))
		case email.MatchString(name):
			t.planeEmails[key] = true
		case memberID.MatchString(name):
			t.planeIDs[key] = true
		case giteaLogin.MatchString(name):
			t.giteaLogins[key] = true
		default:
			return bad("want a Gitea login, an e-mail, gitea:<login>, plane:<member id> or plane:<email>; display names are never matched")
		}
	}
	p.trust = t
	return nil
}

// TrustsGitea reports whether the Gitea account of login is a trusted
// actor of the project.
func (p *Project) TrustsGitea(login string) bool {
	return login != "" && p.trust.giteaLogins[strings.ToLower(login)]
}

// TrustsPlane reports whether the Plane member of id or email (either may
// be empty) is a trusted actor of the project. There is no display name
// argument on purpose.
func (p *Project) TrustsPlane(id, email string) bool {
	return id != "" && p.trust.planeIDs[strings.ToLower(id)] ||
		email != "" && p.trust.planeEmails[strings.ToLower(email)]
}

// entryLine is the line of item i of the sequence under key in a
// project's node, or the project's own line if it cannot be found.
func entryLine(project *yaml.Node, key string, i int) int {
	for j := 0; j+1 < len(project.Content); j += 2 {
		if k, v := project.Content[j], project.Content[j+1]; k.Value == key && v.Kind == yaml.SequenceNode && i < len(v.Content) {
			return v.Content[i].Line
		}
	}
	return project.Line
}
