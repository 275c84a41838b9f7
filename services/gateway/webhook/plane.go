package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"strings"
)

// Plane headers.
const (
	// PlaneSignature is the hex HMAC-SHA256 of the raw body.
	PlaneSignature = "X-Plane-Signature"
	// PlaneEventHeader names the event: issue, issue_comment, project, ...
	PlaneEventHeader = "X-Plane-Event"
	// PlaneDelivery is the delivery id; it changes on every attempt.
	PlaneDelivery = "X-Plane-Delivery"
)

// ErrMalformed is wrapped by the parse errors of a body that is not the
// JSON its event promises.
var ErrMalformed = errors.New("malformed payload")

// PlaneActor is who made a change.
type PlaneActor struct {
	ID          string `json:"id"`
	Email       string `json:"email"`
	DisplayName string `json:"display_name"`
}

// PlaneActivity says which field an update changed. Plane sends one
// delivery per changed field; the web app names fields state_id,
// label_ids, assignee_ids, the API state, labels, assignees. The values
// are ids, names or lists of them, so they are kept raw.
type PlaneActivity struct {
	Field         string          `json:"field"`
	NewValue      json.RawMessage `json:"new_value"`
	OldValue      json.RawMessage `json:"old_value"`
	NewIdentifier json.RawMessage `json:"new_identifier"`
	OldIdentifier json.RawMessage `json:"old_identifier"`
	Actor         PlaneActor      `json:"actor"`
}

// PlaneEventBody is the envelope of every Plane delivery. Data is the
// item as it is now, kept raw until the event says what it is.
type PlaneEventBody struct {
	Event       string          `json:"event"`
	Action      string          `json:"action"`
	WebhookID   string          `json:"webhook_id"`
	WorkspaceID string          `json:"workspace_id"`
	Data        json.RawMessage `json:"data"`
	Activity    PlaneActivity   `json:"activity"`
}

// PlaneRef is a label, an assignee or a state: Plane sends either the
// expanded object or only its id.
type PlaneRef struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Group string `json:"group"`
}

// UnmarshalJSON accepts an object or a bare id.
func (r *PlaneRef) UnmarshalJSON(b []byte) error {
	var id string
	if err := json.Unmarshal(b, &id); err == nil {
		*r = PlaneRef{ID: id}
		return nil
	}
	type plain PlaneRef
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*r = PlaneRef(p)
	return nil
}

// PlaneIssue is a work item.
type PlaneIssue struct {
	ID                  string     `json:"id"`
	Name                string     `json:"name"`
	DescriptionStripped string     `json:"description_stripped"`
	DescriptionHTML     string     `json:"description_html"`
	SequenceID          int        `json:"sequence_id"`
	Project             string     `json:"project"`
	Labels              []PlaneRef `json:"labels"`
	LabelIDs            []string   `json:"label_ids"`
	Assignees           []PlaneRef `json:"assignees"`
	AssigneeIDs         []string   `json:"assignee_ids"`
	State               *PlaneRef  `json:"state"`
	StateDetail         *PlaneRef  `json:"state_detail"`
	UpdatedAt           string     `json:"updated_at"`
	UpdatedBy           string     `json:"updated_by"`
	CreatedBy           string     `json:"created_by"`
	// ProjectDetail and ProjectIdentifier carry the project's short
	// identifier (e.g. WID) where the payload has it.
	ProjectDetail *struct {
		Identifier string `json:"identifier"`
	} `json:"project_detail"`
	ProjectIdentifier string `json:"project_identifier"`
}

// Identifier is the project identifier of the item, empty if the payload
// does not carry it.
func (i *PlaneIssue) Identifier() string {
	if i.ProjectDetail != nil && i.ProjectDetail.Identifier != "" {
		return i.ProjectDetail.Identifier
	}
	return i.ProjectIdentifier
}

// PlaneComment is a comment on a work item.
type PlaneComment struct {
	ID              string `json:"id"`
	CommentHTML     string `json:"comment_html"`
	CommentStripped string `json:"comment_stripped"`
	Issue           string `json:"issue"`
	Project         string `json:"project"`
	Actor           string `json:"actor"`
	CreatedBy       string `json:"created_by"`
	UpdatedAt       string `json:"updated_at"`
	// ExternalSource is "orch" on orch's own tracking comments.
	ExternalSource string `json:"external_source"`
}

// PlaneEvent is one parsed Plane delivery: Issue or Comment is set for the
// events orch reads.
type PlaneEvent struct {
	PlaneEventBody
	Issue   *PlaneIssue
	Comment *PlaneComment
}

// ParsePlane parses the body of a Plane delivery. The event is taken from
// the body, which Plane signs, and must match the X-Plane-Event header when
// one is given.
func ParsePlane(header string, body []byte) (*PlaneEvent, error) {
	var ev PlaneEvent
	if err := json.Unmarshal(body, &ev.PlaneEventBody); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if ev.Event == "" {
		ev.Event = header
	}
	if header != "" && header != ev.Event {
		return nil, fmt.Errorf("%w: %s header %q disagrees with body event %q", ErrMalformed, PlaneEventHeader, header, ev.Event)
	}
	switch ev.Event {
	case "":
		return nil, fmt.Errorf("%w: no event", ErrMalformed)
	case "issue":
		ev.Issue = &PlaneIssue{}
		if err := json.Unmarshal(ev.Data, ev.Issue); err != nil {
			return nil, fmt.Errorf("%w: issue data: %v", ErrMalformed, err)
		}
		if ev.Issue.ID == "" {
			return nil, fmt.Errorf("%w: issue without id", ErrMalformed)
		}
	case "issue_comment":
		ev.Comment = &PlaneComment{}
		if err := json.Unmarshal(ev.Data, ev.Comment); err != nil {
			return nil, fmt.Errorf("%w: comment data: %v", ErrMalformed, err)
		}
		if ev.Comment.ID == "" || ev.Comment.Issue == "" {
			return nil, fmt.Errorf("%w: comment without id or issue", ErrMalformed)
		}
	}
	return &ev, nil
}

// Values reads an activity value (an id, a name, a list of them, a list of
// objects, or null) as a set of strings: the ids and names it holds.
func Values(raw json.RawMessage) map[string]bool {
	out := map[string]bool{}
	if len(raw) == 0 {
		return out
	}
	var one PlaneRef
	if err := json.Unmarshal(raw, &one); err == nil {
		addRef(out, one)
		return out
	}
	var many []PlaneRef
	if err := json.Unmarshal(raw, &many); err == nil {
		for _, r := range many {
			addRef(out, r)
		}
	}
	return out
}

func addRef(set map[string]bool, r PlaneRef) {
	for _, s := range []string{r.ID, r.Name} {
		// The API spells a list as "a, b" in some activity values.
		for part := range strings.SplitSeq(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				set[part] = true
			}
		}
	}
}

// PlaneUserMention is the entity_name of a person in the mention-component
// Plane's editor writes.
const PlaneUserMention = "user_mention"

// MentionedUsers returns the member ids a comment's HTML mentions the way
// Plane's editor writes a mention picked from its list:
// <mention-component entity_identifier="<user id>"
// entity_name="user_mention"></mention-component> (the editor's mention
// extension, packages/editor/src/core/extensions/mentions). Such a mention
// carries no "@name" text. The tag and attribute names are matched in any
// case and order, values quoted with either quote or unquoted, the tag
// closed or self-closing; mentions of anything but a user are left out.
func MentionedUsers(commentHTML string) []string {
	var out []string
	const tag = "<mention-component"
	lower := asciiLower(commentHTML) // the same length: indexes agree
	for pos := 0; ; {
		i := strings.Index(lower[pos:], tag)
		if i < 0 {
			return out
		}
		pos += i + len(tag)
		if pos < len(lower) && !isSpace(lower[pos]) && lower[pos] != '>' && lower[pos] != '/' {
			continue // <mention-componentx ...>: another element
		}
		attrs, rest := tagAttrs(commentHTML[pos:])
		pos = len(commentHTML) - len(rest)
		if strings.EqualFold(attrs["entity_name"], PlaneUserMention) && attrs["entity_identifier"] != "" {
			out = append(out, attrs["entity_identifier"])
		}
	}
}

// tagAttrs reads a start tag's attributes up to its closing '>' (a '>'
// inside a quoted value does not close it) and returns them, names
// lowercased and values unescaped, with the text after the tag.
func tagAttrs(s string) (map[string]string, string) {
	attrs := map[string]string{}
	i := 0
	for i < len(s) {
		for i < len(s) && (isSpace(s[i]) || s[i] == '/') {
			i++
		}
		if i >= len(s) || s[i] == '>' {
			break
		}
		start := i
		for i < len(s) && !isSpace(s[i]) && s[i] != '=' && s[i] != '>' && s[i] != '/' {
			i++
		}
		name := strings.ToLower(s[start:i])
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		if i >= len(s) || s[i] != '=' {
			attrs[name] = ""
			continue
		}
		i++
		for i < len(s) && isSpace(s[i]) {
			i++
		}
		var val string
		if i < len(s) && (s[i] == '"' || s[i] == '\'') {
			q := s[i]
			end := strings.IndexByte(s[i+1:], q)
			if end < 0 {
				return attrs, ""
			}
			val, i = s[i+1:i+1+end], i+2+end
		} else {
			start := i
			for i < len(s) && !isSpace(s[i]) && s[i] != '>' {
				i++
			}
			val = s[start:i]
		}
		if _, seen := attrs[name]; !seen { // the first of a repeated name counts, as in a browser
			attrs[name] = strings.TrimSpace(html.UnescapeString(val))
		}
	}
	if i < len(s) {
		i++ // the '>'
	}
	return attrs, s[i:]
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' }

// asciiLower lowercases ASCII letters only, so that the result has the
// same byte offsets as s.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
