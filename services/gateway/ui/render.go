package ui

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"go.uber.org/zap"

	"github.com/orch-dev/orch/proto"
)

// pageNames are the templates under templates/, each rendered inside
// layout.html.
var pageNames = []string{"login", "queue", "job", "confirm", "dead", "error", "bounce"}

// page is what every template gets.
type page struct {
	Title string
	// Nav names the navigation entry of this page.
	Nav string
	// CSRF is the token the page's forms carry; empty without a session.
	CSRF string
	// Live asks the script to refresh the page's data-live parts.
	Live bool
	Data any
}

func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"age":      age,
		"duration": duration,
		"cost":     cost,
		"when":     when,
		"iso":      func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"terminal": func(s proto.State) bool { return s.Terminal() },
		"httpURL":  httpURL,
		"query":    url.QueryEscape,
		"firstTime": func(a, b time.Time) time.Time {
			if a.IsZero() {
				return b
			}
			return a
		},
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		out[name] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}

// render writes the page, buffered so that a template error becomes a 500
// instead of half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, code int, name string, p page) {
	if p.CSRF == "" {
		p.CSRF = h.csrfOf(r)
	}
	var buf bytes.Buffer
	if err := h.pages[name].Execute(&buf, p); err != nil {
		h.cfg.Log.Error("rendering dashboard page", zap.String("page", name), zap.Error(err))
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// errorPage answers with a page that says what went wrong.
func (h *Handler) errorPage(w http.ResponseWriter, r *http.Request, code int, msg string) {
	h.render(w, r, code, "error", page{Title: http.StatusText(code), Data: struct {
		Code int
		Text string
		Msg  string
	}{code, http.StatusText(code), msg}})
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// httpURL returns u when it is an http(s) URL, for links to the tracker;
// anything else (javascript:, data:) is no link at all.
func httpURL(u string) string {
	p, err := url.Parse(u)
	if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return ""
	}
	return u
}

// age is how long ago t was, in the largest whole unit.
func age(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := time.Since(t)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(0, int(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// duration is the time from a to b (to now while b is zero).
func duration(a, b time.Time) string {
	if a.IsZero() {
		return "—"
	}
	if b.IsZero() {
		b = time.Now()
	}
	d := b.Sub(a)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// cost shows a cost in dollars, or a dash when the agent reported none.
func cost(usd float64) string {
	if usd == 0 {
		return "—"
	}
	return fmt.Sprintf("$%.2f", usd)
}

// when shows a time in UTC, to the second.
func when(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format(time.DateTime) + " UTC"
}
