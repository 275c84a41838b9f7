package check

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// listenPort is the port of an ORCH_HTTP_ADDR value such as ":8081".
func listenPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0
	}
	p, _ := strconv.Atoi(addr[i+1:])
	return p
}

// TestK8sScrapeAndProbes checks, for every Deployment and StatefulSet, that Prometheus can find every service
// and the kubelet can probe it: the pod's scrape annotations name the
// container port ORCH_HTTP_ADDR listens on, and every service has a
// readiness probe (readyPath) and a liveness probe on /healthz on that
// port.
func TestK8sScrapeAndProbes(t *testing.T) {
	o := loadK8s(t)
	seen := map[string]bool{}
	for _, d := range o.workloads() {
		seen[d.component()] = true
		ann := d.template.Annotations
		if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s %s: pod annotations %v, want prometheus.io/scrape \"true\" and path /metrics", d.kind, d.name, ann)
		}
		if len(d.template.Spec.Containers) == 0 {
			t.Fatalf("%s %s has no container", d.kind, d.name)
		}
		c := d.template.Spec.Containers[0]
		var addr string
		for _, e := range c.Env {
			if e.Name == "ORCH_HTTP_ADDR" {
				addr = e.Value
			}
		}
		port := listenPort(addr)
		if port == 0 {
			t.Errorf("%s %s: ORCH_HTTP_ADDR %q names no port", d.kind, d.name, addr)
			continue
		}
		var http *corev1.ContainerPort
		for i := range c.Ports {
			if c.Ports[i].Name == "http" {
				http = &c.Ports[i]
			}
		}
		if http == nil || int(http.ContainerPort) != port {
			t.Errorf("%s %s: container port \"http\" %v, want %d (ORCH_HTTP_ADDR)", d.kind, d.name, http, port)
		}
		if ann["prometheus.io/port"] != strconv.Itoa(port) {
			t.Errorf("%s %s: prometheus.io/port %q, want %d (ORCH_HTTP_ADDR)", d.kind, d.name, ann["prometheus.io/port"], port)
		}
		for _, p := range []struct {
			name string
			pr   *corev1.Probe
			path string
		}{{"readiness", c.ReadinessProbe, readyPath(d.component())}, {"liveness", c.LivenessProbe, "/healthz"}} {
			if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.String() != "http" {
				t.Errorf("%s %s: %s probe %+v, want GET %s on port http", d.kind, d.name, p.name, p.pr, p.path)
			}
		}
	}
	for _, svc := range []string{"gateway", "runner", "notifier"} {
		if !seen[svc] {
			t.Errorf("no workload runs the %s", svc)
		}
	}
}

// readyPath is the readiness probe's path of a service. The gateway is
// ready as soon as it serves (it spools webhooks while NATS is away, and
// must keep getting them); the runner and the notifier only once NATS
// answers and their consumer is bound.
func readyPath(component string) string {
	if component == "gateway" {
		return "/healthz"
	}
	return "/readyz"
}

// TestNATSHelmExporter checks the NATS chart values turn on the chart's
// Prometheus exporter and make its port scraped.
func TestNATSHelmExporter(t *testing.T) {
	var v struct {
		Config struct {
			Monitor struct {
				Enabled bool `json:"enabled"`
			} `json:"monitor"`
		} `json:"config"`
		PromExporter struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"promExporter"`
		PodTemplate struct {
			Merge struct {
				Metadata struct {
					Annotations map[string]string `json:"annotations"`
				} `json:"metadata"`
			} `json:"merge"`
		} `json:"podTemplate"`
	}
	readYAML(t, filepath.Join(k8sDir, "nats", "values.yaml"), &v)
	if !v.Config.Monitor.Enabled || !v.PromExporter.Enabled {
		t.Errorf("monitor %v, promExporter %v: want both enabled (the exporter reads the monitor port)", v.Config.Monitor.Enabled, v.PromExporter.Enabled)
	}
	ann := v.PodTemplate.Merge.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(v.PromExporter.Port) {
		t.Errorf("NATS pod annotations %v, want the exporter's port %d scraped", ann, v.PromExporter.Port)
	}
}
