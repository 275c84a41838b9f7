package check

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/orch-dev/orch/kit/metricstest"
	"github.com/orch-dev/orch/kit/testkit"
)

var observabilityDir = filepath.Join(repoRoot, "deployments", "observability")

// TestPrometheusRules runs promtool over the shipped rules: `check rules`
// and the unit tests of rules_test.yaml. promtool comes from Debian's
// prometheus package, which .ci/run installs; where it is missing the test
// is skipped, except in CI (CI=true), where it fails.
func TestPrometheusRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testkit.Unavailable(t, "promtool not found: install Debian's prometheus package (apt-get install prometheus), as .ci/run does")
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = observabilityDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// ruleFile is the part of a Prometheus rule file these checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Record string `json:"record"`
			Alert  string `json:"alert"`
			Expr   string `json:"expr"`
		} `json:"rules"`
	} `json:"groups"`
}

// ruleTests is the part of a promtool unit test file these checks read.
type ruleTests struct {
	Tests []struct {
		AlertRuleTest []struct {
			Alertname string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readRules(t *testing.T) ruleFile {
	var rf ruleFile
	readYAML(t, filepath.Join(observabilityDir, "rules.yaml"), &rf)
	return rf
}

// TestEveryAlertIsTested checks rules_test.yaml has, for every alert, a
// case where it fires and one where it does not.
func TestEveryAlertIsTested(t *testing.T) {
	var rt ruleTests
	readYAML(t, filepath.Join(observabilityDir, "rules_test.yaml"), &rt)
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range rt.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				firing[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	alerts := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			if !firing[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: tested firing %v, not firing %v; want both", r.Alert, firing[r.Alert], quiet[r.Alert])
			}
		}
	}
	if alerts < 6 {
		t.Errorf("%d alerts in rules.yaml, want at least 6", alerts)
	}
}

// knownSeries is every name an expression may use: the metrics of the
// README's table (histograms with their _bucket, _sum and _count), the
// recording rules, and Prometheus's own `up`.
func knownSeries(t *testing.T) map[string]bool {
	rows, err := metricstest.ReadTable(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{"up": true}
	for _, r := range rows {
		known[r.Name] = true
		if r.Type == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[r.Name+s] = true
			}
		}
	}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	return known
}

// seriesName matches what in PromQL can only be a metric or recording
// rule name: orch_..., or level:metric:operation.
var seriesName = regexp.MustCompile(`\b(?:[a-z_]+:[a-z0-9_:]+|orch_[a-z0-9_]+)\b`)

// namesIn lists the series names in a PromQL expression, leaving out
// label matchers' values and strings.
func namesIn(expr string) []string {
	expr = regexp.MustCompile(`"[^"]*"`).ReplaceAllString(expr, `""`)
	return seriesName.FindAllString(expr, -1)
}

// TestRulesNameServedMetrics checks every series a rule reads is one
// the services serve or a recording rule.
func TestRulesNameServedMetrics(t *testing.T) {
	known := knownSeries(t)
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, n := range namesIn(r.Expr) {
				if !known[n] {
					t.Errorf("rule %s%s reads %s, which no service serves and no rule records", r.Record, r.Alert, n)
				}
			}
		}
	}
}

// TestGrafanaDashboard checks the dashboard is JSON Grafana can import,
// and every expression in it names series that exist.
func TestGrafanaDashboard(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(observabilityDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard.json: title %q, uid %q, %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	known := knownSeries(t)
	var used []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := namesIn(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: expression %q names no orch series", p.Title, tg.Expr)
			}
			for _, n := range names {
				if !known[n] {
					t.Errorf("panel %q reads %s, which no service serves and no rule records", p.Title, n)
				}
				used = append(used, n)
			}
		}
	}
	// The figures the issue asks to graph are all on it.
	for _, want := range []string{"orch:queue_oldest_pending_age_seconds:max", "orch:dlq_messages:max", "orch:spool_depth:sum",
		"project:orch_runner_cost_usd:increase1d", "orch_runner_agent_duration_seconds_bucket", "orch_runner_queue_wait_seconds_bucket"} {
		if !slices.Contains(used, want) {
			t.Errorf("dashboard does not graph %s", want)
		}
	}
}
