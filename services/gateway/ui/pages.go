package ui

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/jobs"
)

// queueData is what the queue page shows.
type queueData struct {
	Counts   []stateCount
	Stream   *jobs.StreamFigures
	Consumer *jobs.ConsumerFigures
	Spool    int
	// Lines is each project's queued, running and held jobs and pause.
	Lines    []jobs.ProjectFigures
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
	// Spend is each budgeted project's spend today and this month;
	// UsagePauses the credentials waiting for their usage limit's reset.
	Spend       []jobs.ProjectSpend
	UsagePauses []jobs.UsagePause
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
	b := h.cfg.Jobs
	d := queueData{Filter: f, Projects: b.Projects(), States: proto.States, Kinds: kinds, Spool: b.Spool().Depth, Page: pageNo}
	d.Jobs, d.Total = b.List(f, (pageNo-1)*PageSize, PageSize)
	d.Pages = max(1, (d.Total+PageSize-1)/PageSize)
	counts := b.Counts()
	for _, s := range proto.States {
		d.Counts = append(d.Counts, stateCount{State: s, N: counts[s], Link: filterURL(index.Filter{State: s}, 1)})
	}
	d.Stream, d.Consumer = b.Figures(r.Context())
	d.Lines = b.ProjectFigures(r.Context())
	d.Spend, d.UsagePauses = b.Spend(r.Context()), b.UsagePauses(r.Context())
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
	St         *proto.Status
	CanCancel  bool
	CanRetry   bool
	CanRelease bool
	Attempts   []attemptLog
	// MaxAttempts is the record's, or the runners' for a queued job.
	MaxAttempts int
	// Partial says the answer is a live poll's: the logs section carries
	// its key only, not the logs (see jobPage).
	Partial bool
}

// HeaderLive marks the page script's re-reads of a page (live polls).
const HeaderLive = "X-Orch-Live"

// jobPage shows a job, its status and the tail of each attempt's log. A
// live poll (HeaderLive) is answered without reading any log: the script
// swaps the logs section only when its key (attempt and state) changes,
// and then reads the whole page once for it, so a page left open reads
// the status every 2 s and the logs only when an attempt starts or ends.
// A running attempt's log grows through its followed stream meanwhile.
func (h *Handler) jobPage(w http.ResponseWriter, r *http.Request) {
	st, ok := h.status(w, r)
	if !ok {
		return
	}
	d := jobData{St: st, CanCancel: !st.State.Terminal(), CanRetry: st.DLQSeq != 0, CanRelease: st.State == proto.StateHeld,
		Partial: r.Header.Get(HeaderLive) == "1"}
	// A queued job's record has no attempt limit yet: the runners' is
	// their consumer's.
	if d.MaxAttempts = st.MaxAttempts; d.MaxAttempts == 0 {
		d.MaxAttempts = h.cfg.Jobs.MaxAttempts(r.Context())
	}
	if !d.Partial {
		for n := st.Attempt; n >= 1; n-- {
			d.Attempts = append(d.Attempts, h.attemptLog(r, st, n))
		}
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
	st, err := h.cfg.Jobs.Job(r.Context(), mux.Vars(r)["id"])
	if err != nil {
		h.refusal(w, r, err)
		return nil, false
	}
	return st, true
}

// refusal shows a refusal of the job service as a page with its status
// code.
func (h *Handler) refusal(w http.ResponseWriter, r *http.Request, err error) {
	ref := jobs.RefusalOf(err)
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

// act cancels, retries or releases, then shows the job: the cancelled or
// released one, or the new job a retry made.
func (h *Handler) act(w http.ResponseWriter, r *http.Request) {
	id := mux.Vars(r)["id"]
	var change *jobs.Change
	var err error
	switch mux.Vars(r)["action"] {
	case "cancel":
		change, err = h.cfg.Jobs.Cancel(r.Context(), id)
	case "release":
		change, err = h.cfg.Jobs.Release(r.Context(), id, "dashboard")
	default:
		change, err = h.cfg.Jobs.Retry(r.Context(), id)
	}
	if err != nil {
		h.refusal(w, r, err)
		return
	}
	http.Redirect(w, r, Prefix+"jobs/"+url.PathEscape(change.Job.ID), http.StatusSeeOther)
}

// projectAct pauses or resumes the project {key}, then shows the queue.
func (h *Handler) projectAct(w http.ResponseWriter, r *http.Request) {
	key := mux.Vars(r)["key"]
	var err error
	if mux.Vars(r)["action"] == "pause" {
		_, err = h.cfg.Jobs.Pause(r.Context(), key, "dashboard", "")
	} else {
		_, err = h.cfg.Jobs.Resume(r.Context(), key)
	}
	if err != nil {
		h.refusal(w, r, err)
		return
	}
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

func (h *Handler) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	dl, err := h.cfg.Jobs.DeadLetters(r.Context(), DeadLetterLimit)
	if err != nil {
		h.refusal(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "dead", page{Title: "Dead letters", Nav: "dead", Live: true, Data: dl})
}
