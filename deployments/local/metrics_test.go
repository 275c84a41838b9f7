package main

import (
	"bufio"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/proto/metricstest"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// metricRow is one row of the README's metrics table.
type metricRow struct {
	name, service, typ string
	labels             []string
}

// readmeMetrics parses the metrics table of the README: the rows whose
// first cell is a backquoted orch_ name.
func readmeMetrics(t *testing.T) []metricRow {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(orch_[a-z0-9_]+)` \\| ([a-z]+) \\| ([a-z]+) \\|([^|]*)\\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	var rows []metricRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		r := metricRow{name: m[1], service: m[2], typ: m[3]}
		for _, l := range label.FindAllStringSubmatch(m[4], -1) {
			r.labels = append(r.labels, l[1])
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) < 20 {
		t.Fatalf("found %d metric rows in README.md: has the table moved or changed its shape?", len(rows))
	}
	return rows
}

// checkMetricsTable scrapes every service (name -> base URL), lints what
// it serves, and checks it against the README's table both ways: every
// listed metric is served, with its type and labels, and every orch_
// metric served is listed.
func checkMetricsTable(t *testing.T, services map[string]string) {
	rows := readmeMetrics(t)
	for svc, base := range services {
		m := metricstest.Scrape(t, base+"/metrics")
		m.Lint(t)
		listed := map[string]bool{}
		for _, r := range rows {
			if r.service != svc && r.service != "all" {
				continue
			}
			listed[r.name] = true
			typ, ok := m.Types[r.name]
			if !ok {
				t.Errorf("%s: README lists %s, which /metrics does not serve", svc, r.name)
				continue
			}
			if typ != r.typ {
				t.Errorf("%s: %s is a %s, README says %s", svc, r.name, typ, r.typ)
			}
			for _, s := range m.Series(r.name) {
				_, labels, _ := strings.Cut(s, "{")
				var got []string
				for kv := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
					if k, _, ok := strings.Cut(kv, "="); ok && k != "le" {
						got = append(got, k)
					}
				}
				if !slices.Equal(got, slices.Sorted(slices.Values(r.labels))) {
					t.Errorf("%s: series %s has labels %v, README lists %v", svc, s, got, r.labels)
					break
				}
			}
		}
		for name := range m.Types {
			if strings.HasPrefix(name, "orch_") && !listed[name] {
				t.Errorf("%s serves %s, which the README's metrics table does not list", svc, name)
			}
		}
	}
}
