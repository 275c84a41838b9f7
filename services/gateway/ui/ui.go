// Package ui is orch's dashboard: server-rendered pages under /ui/ that
// show the queue, every job with its agent's log, and the dead letters,
// and cancel or retry a job. The templates, the stylesheet and the one
// small script are embedded in the binary; nothing is fetched from
// elsewhere, so the dashboard works offline and needs no build step.
//
// Every page works without JavaScript; the script only adds live updates
// (it re-reads the page and swaps the parts marked data-live) and follows
// a running attempt's log as it grows. Its re-reads carry X-Orch-Live,
// and the job page answers them without the logs' text (see jobPage), so
// a page left open costs a status read every 2 s, not a log read.
//
// What the pages show and do comes from package jobs, as the JSON API's
// answers do; this package only renders.
package ui

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io"
	"io/fs"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/orch-dev/orch/kit/logread"
	"github.com/orch-dev/orch/proto"
	"github.com/orch-dev/orch/services/gateway/bearer"
	"github.com/orch-dev/orch/services/gateway/index"
	"github.com/orch-dev/orch/services/gateway/jobs"
	"github.com/orch-dev/orch/services/gateway/throttle"
)

// Prefix is the path under which the dashboard is served.
const Prefix = "/ui/"

// PageSize is how many jobs the queue page lists at a time.
const PageSize = 50

// DeadLetterLimit is how many dead letters the dead-letter page lists.
const DeadLetterLimit = 200

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Jobs is what the dashboard reads and does; *jobs.Service is it, the
// very code the JSON API runs, so a cancel or retry from a page is one
// from curl.
type Jobs interface {
	Counts() map[proto.State]int
	List(f index.Filter, offset, limit int) ([]index.Recent, int)
	Figures(ctx context.Context) (*jobs.StreamFigures, *jobs.ConsumerFigures)
	Spool() jobs.SpoolFigures
	Projects() []string
	Job(ctx context.Context, id string) (*proto.Status, error)
	LogTail(ctx context.Context, st *proto.Status, n, maxBytes int) (logread.TailOf, error)
	CopyLog(ctx context.Context, st *proto.Status, n int, w io.Writer, o jobs.LogOptions) error
	Cancel(ctx context.Context, id string) (*jobs.Change, error)
	Retry(ctx context.Context, id string) (*jobs.Change, error)
	DeadLetters(ctx context.Context, limit int) ([]jobs.DeadLetter, error)
	ProjectFigures(ctx context.Context) []jobs.ProjectFigures
	Pause(ctx context.Context, key, by, note string) (jobs.ProjectChange, error)
	Resume(ctx context.Context, key string) (jobs.ProjectChange, error)
	MaxAttempts(ctx context.Context) int
	Release(ctx context.Context, id, by string) (*jobs.Change, error)
	Spend(ctx context.Context) []jobs.ProjectSpend
	UsagePauses(ctx context.Context) []jobs.UsagePause
}

var _ Jobs = (*jobs.Service)(nil)

// Config is what the dashboard needs.
type Config struct {
	// Jobs answers the dashboard's reads and actions, its logs included.
	Jobs Jobs
	// APIToken is ORCH_API_TOKEN: what POST /ui/login-links and the login
	// form take, and the root of the CSRF key. Empty turns the dashboard
	// off.
	APIToken string
	// PublicURL is ORCH_PUBLIC_URL: login links are absolute under it when
	// it is set, else paths.
	PublicURL string
	// Throttle refuses a client with too many failed logins (429); the
	// API's bearer token shares it. Nil throttles nothing.
	Throttle *throttle.Limiter
	// Log is the dashboard's logger.
	Log *zap.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Handler serves the dashboard.
type Handler struct {
	cfg    Config
	keys   keys
	store  store
	pages  map[string]*template.Template
	router *mux.Router
}

// New returns the dashboard's handler.
func New(cfg Config) *Handler {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	h := &Handler{cfg: cfg, keys: newKeys(cfg.APIToken), pages: parsePages()}
	r := mux.NewRouter()
	static, _ := fs.Sub(staticFS, "static")
	r.PathPrefix(Prefix + "static/").Handler(staticHandler(http.StripPrefix(Prefix+"static/", http.FileServerFS(static))))
	r.HandleFunc(Prefix+"login", h.loginPage).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"login", h.login).Methods(http.MethodPost)
	r.HandleFunc(Prefix+"login/{secret}", h.useLink).Methods(http.MethodGet)
	r.Handle(Prefix+"login-links", bearer.Require(cfg.APIToken, cfg.Throttle, http.HandlerFunc(h.makeLink))).Methods(http.MethodPost)
	r.HandleFunc(Prefix+"logout", h.post(h.logout)).Methods(http.MethodPost)
	r.HandleFunc(Prefix, h.get(h.queuePage)).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"dead-letters", h.get(h.deadLettersPage)).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"jobs/{id}", h.get(h.jobPage)).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"jobs/{id}/log", h.get(h.logText)).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"jobs/{id}/{action:cancel|retry|release}", h.get(h.confirmPage)).Methods(http.MethodGet)
	r.HandleFunc(Prefix+"jobs/{id}/{action:cancel|retry|release}", h.post(h.act)).Methods(http.MethodPost)
	r.HandleFunc(Prefix+"projects/{key}/{action:pause|resume}", h.post(h.projectAct)).Methods(http.MethodPost)
	r.NotFoundHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.errorPage(w, r, http.StatusNotFound, "There is no such page.")
	})
	r.MethodNotAllowedHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.errorPage(w, r, http.StatusMethodNotAllowed, "Method "+r.Method+" is not allowed here.")
	})
	h.router = r
	return h
}

// ServeHTTP serves a dashboard request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// The pages load only their own script and stylesheet, are never
	// framed, and send no referrer to other sites (a URL may name a job).
	// Same-origin requests keep theirs: with no-referrer a browser sends
	// "Origin: null" on a form's POST, which sameOrigin refuses.
	hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("X-Frame-Options", "DENY")
	if h.cfg.APIToken == "" {
		h.errorPage(w, r, http.StatusForbidden, "The dashboard is off: set ORCH_API_TOKEN on the gateway to turn it on.")
		return
	}
	h.router.ServeHTTP(w, r)
}

// Connect gives the dashboard the bucket of its logins
// (proto.BucketUISessions), once NATS is reachable. Until then nobody can
// log in (503).
func (h *Handler) Connect(kv jetstream.KeyValue) { h.store.connect(kv) }

func (h *Handler) now() time.Time {
	if h.cfg.Now != nil {
		return h.cfg.Now()
	}
	return time.Now()
}

// staticHandler lets browsers keep the stylesheet and script for an hour.
func staticHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		next.ServeHTTP(w, r)
	})
}

type sessionKey struct{}

// get guards a page: without a session it sends the browser to the login,
// which brings it back here afterwards.
func (h *Handler) get(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret, err := h.sessionOf(r)
		if errors.Is(err, errUnavailable) {
			h.unavailable(w, r, err)
			return
		}
		if err != nil {
			// A link followed from another site (a chat, a mail) arrives
			// without the SameSite=Strict cookie even when there is one.
			// Reloading from this page makes the request same-site, and
			// the cookie comes along.
			if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
				h.render(w, r, http.StatusOK, "bounce", page{Title: "orch", Data: r.URL.RequestURI()})
				return
			}
			http.Redirect(w, r, Prefix+"login?next="+urlQueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, secret)))
	}
}

// post guards an action: a session, a same-origin request and the
// session's CSRF token, or 403.
func (h *Handler) post(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret, err := h.sessionOf(r)
		if errors.Is(err, errUnavailable) {
			h.unavailable(w, r, err)
			return
		}
		if err != nil {
			h.errorPage(w, r, http.StatusUnauthorized, "Your session has ended. Log in again and repeat the action.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
		if !sameOrigin(r) || !h.keys.csrfOK(secret, r.PostFormValue(csrfField)) {
			h.cfg.Log.Warn("dashboard action refused: CSRF check failed", zap.String("path", r.URL.Path))
			h.errorPage(w, r, http.StatusForbidden, "This form has expired or did not come from this dashboard (CSRF check failed). Reload the page and try again.")
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, secret)))
	}
}

// csrfOf is the CSRF token for the forms of the request's page.
func (h *Handler) csrfOf(r *http.Request) string {
	secret, _ := r.Context().Value(sessionKey{}).(string)
	if secret == "" {
		return ""
	}
	return h.keys.csrf(secret)
}
