package ui

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/api"
	"github.com/orch-dev/orch/services/gateway/index"
)

// queueData is what the queue page shows.
type queueData struct {
	Counts   []stateCount
	Stream   *api.StreamFigures
	Consumer *api.ConsumerFigures
	Spool    int
	Filter   index.Filter
	Projects []string
	States   []proto.State
	Kinds    []proto.Kind
	Jobs     []index.Recent
	Total    int
	Page     int
	Pages    int
	Prev     string
	Next     string
}

type stateCount struct {
	State proto.State
	N     int
	Link  string
}

var kinds = proto.Kinds

func (h *Handler) queuePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := index.Filter{State: proto.State(q.Get("state")), Project: q.Get("project"), Kind: proto.Kind(q.Get("kind"))}
	if f.State != "" && !slices.Contains(proto.States, f.State) {
		f.State = ""
	}
	if f.Kind != "" && !f.Kind.Valid() {
		f.Kind = ""
	}
	pageNo, err := strconv.Atoi(q.Get("page"))
	if err != nil || pageNo < 1 {
		pageNo = 1
	}
	b := h.cfg.Backend
	d := queueData{Filter: f, Projects: b.Projects(), States: proto.States, Kinds: kinds, Spool: b.SpoolDepth(), Page: pageNo}
	d.Jobs, d.Total = b.Jobs(f, (pageNo-1)*PageSize, PageSize)
	d.Pages = max(1, (d.Total+PageSize-1)/PageSize)
	counts := b.Counts()
	for _, s := range proto.States {
		d.Counts = append(d.Counts, stateCount{State: s, N: counts[s], Link: filterURL(index.Filter{State: s}, 1)})
	}
	d.Stream, d.Consumer = b.Figures(r.Context())
	if pageNo > 1 {
		d.Prev = filterURL(f, pageNo-1)
	}
	if pageNo < d.Pages {
		d.Next = filterURL(f, pageNo+1)
	}
	h.render(w, r, http.StatusOK, "queue", page{Title: "Queue", Nav: "queue", Live: true, Data: d})
}

// filterURL is the queue page with filter f, at page n.
func filterURL(f index.Filter, n int) string {
	v := url.Values{}
	if f.State != "" {
		v.Set("state", string(f.State))
	}
	if f.Project != "" {
		v.Set("project", f.Project)
	}
	if f.Kind != "" {
		v.Set("kind", string(f.Kind))
	}
	if n > 1 {
		v.Set("page", strconv.Itoa(n))
	}
	if len(v) == 0 {
		return Prefix
	}
	return Prefix + "?" + v.Encode()
}

// jobData is what the job page shows.
type jobData struct {
	St        *proto.Status
	CanCancel bool
	CanRetry  bool
	Attempts  []attemptLog
}

func (h *Handler) jobPage(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	d := jobData{St: st, CanCancel: !st.State.Terminal(), CanRetry: st.DLQSeq != 0}
	for n := st.Attempt; n >= 1; n-- {
		d.Attempts = append(d.Attempts, h.attemptLog(r, st, n))
	}
	title := st.Job.Task.Title
	if title == "" {
		title = st.Job.Task.ID
	}
	h.render(w, r, http.StatusOK, "job", page{Title: title, Nav: "job", Live: true, Data: d})
}

// status reads the job of the request's {id}, answering the error page
// when there is none.
func (h *Handler) status(w http.ResponseWriter, r *http.Request) (*proto.Status, bool) {
	st, err := h.cfg.Backend.Status(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		h.refusal(w, r, err)
		return nil, false
	}
	return st, true
}

// refusal shows an error of the backend as a page with its status code.
func (h *Handler) refusal(w http.ResponseWriter, r *http.Request, err error) {
	var ref *api.Refusal
	if !errors.As(err, &ref) {
		ref = &api.Refusal{Code: http.StatusServiceUnavailable, Msg: err.Error()}
	}
	h.errorPage(w, r, ref.Code, ref.Msg)
}

// confirmData is the question before an action.
type confirmData struct {
	St     *proto.Status
	Action string
}

// confirmPage asks before a cancel or a retry. It is a page of its own,
// not a script's dialog, so it works without JavaScript too.
func (h *Handler) confirmPage(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	action := mux.Vars(r)["action"]
	h.render(w, r, http.StatusOK, "confirm", page{Title: action + " job", Nav: "job", Data: confirmData{St: st, Action: action}})
}

// act cancels or retries, then shows the job: the cancelled one, or the
// new job a retry made.
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	var change *api.JobChange
	var err error
	if mux.Vars(r)["action"] == "cancel" {
		change, err = h.cfg.Backend.Cancel(r.Context(), id)
	} else {
		change, err = h.cfg.Backend.Retry(r.Context(), id)
	}
	if err != nil {
		h.refusal(w, r, err)
		return
	}
	http.Redirect(w, r, Prefix+"jobs/"+url.PathEscape(change.Job.ID), http.StatusSeeOther)
}

func (h *Handler) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	dl, err := h.cfg.Backend.DeadLetters(r.Context(), DeadLetterLimit)
	if err != nil {
		h.refusal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "dead", page{Title: "Dead letters", Nav: "dead", Live: true, Data: dl})
}
