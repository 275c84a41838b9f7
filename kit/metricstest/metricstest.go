// Package metricstest reads a service's /metrics in tests: it lints the
// exposition as `promtool check metrics` does, and looks up families,
// series and label values in it.
package metricstest

import (
	"bufio"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// Exposition is one scrape in the Prometheus text format.
type Exposition struct {
	// Text is the scrape as served.
	Text string
	// Types maps each family's name to its type (counter, gauge, ...).
	Types map[string]string
	// Samples maps each series, written as it is served
	// (`name{a="x",b="y"}`), to its value.
	Samples map[string]float64
}

// client keeps no idle connection, so a test that checks for leaked
// goroutines finds none of its.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

// Get gets url and returns the status code and body; code 0 when nothing
// answered.
func Get(url string) (int, string) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// Scrape gets url (a /metrics endpoint) and parses the answer.
func Scrape(t testing.TB, url string) *Exposition {
	t.Helper()
	code, body := Get(url)
	if code != http.StatusOK {
		t.Fatalf("scraping %s: %d %s", url, code, body)
	}
	return Parse(body)
}

// Parse reads an exposition in the text format.
func Parse(text string) *Exposition {
	e := &Exposition{Text: text, Types: map[string]string{}, Samples: map[string]float64{}}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if name, typ, ok := strings.Cut(rest, " "); ok {
				e.Types[name] = typ
			}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			e.Samples[line[:i]] = v
		}
	}
	return e
}

// Lint fails the test for every problem promlint finds, the checks of
// `promtool check metrics`.
func (e *Exposition) Lint(t testing.TB) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(e.Text)).Lint()
	if err != nil {
		t.Fatalf("linting metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("metrics lint: %s: %s", p.Metric, p.Text)
	}
}

// Value is the value of a series, written as it is served, labels in
// alphabetical order: `orch_runner_jobs_finished_total{kind="review",outcome="done",project="widgets"}`.
func (e *Exposition) Value(series string) (float64, bool) {
	v, ok := e.Samples[series]
	return v, ok
}

// Series lists the series of a metric (histograms: of its _bucket, _sum
// and _count too).
func (e *Exposition) Series(metric string) []string {
	var out []string
	for s := range e.Samples {
		name, _, _ := strings.Cut(s, "{")
		if name == metric || strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count") == metric {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

// LabelValues lists the values label takes across every series of metric.
func (e *Exposition) LabelValues(metric, label string) []string {
	var out []string
	for _, s := range e.Series(metric) {
		_, labels, _ := strings.Cut(s, "{")
		for kv := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k == label {
				if v, err := strconv.Unquote(v); err == nil && !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}
