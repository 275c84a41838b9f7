package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/orch-dev/orch/kit/metricstest"
)

// checkMetricsTable scrapes every service (name -> base URL), lints what
// it serves, and checks it against the README's table both ways: every
// listed metric is served, with its type and labels, and every orch_
// metric served is listed.
func checkMetricsTable(t *testing.T, services map[string]string) {
	rows, err := metricstest.ReadTable("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for svc, base := range services {
		m := metricstest.Scrape(t, base+"/metrics")
		m.Lint(t)
		listed := map[string]bool{}
		for _, r := range rows {
			if r.Service != svc && r.Service != "all" {
				continue
			}
			listed[r.Name] = true
			typ, ok := m.Types[r.Name]
			if !ok {
				t.Errorf("%s: README lists %s, which /metrics does not serve", svc, r.Name)
				continue
			}
			if typ != r.Type {
				t.Errorf("%s: %s is a %s, README says %s", svc, r.Name, typ, r.Type)
			}
			for _, s := range m.Series(r.Name) {
				_, labels, _ := strings.Cut(s, "{")
				var got []string
				for kv := range strings.SplitSeq(strings.TrimSuffix(labels, "}"), ",") {
					if k, _, ok := strings.Cut(kv, "="); ok && k != "le" {
						got = append(got, k)
					}
				}
				if !slices.Equal(got, slices.Sorted(slices.Values(r.Labels))) {
					t.Errorf("%s: series %s has labels %v, README lists %v", svc, s, got, r.Labels)
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
