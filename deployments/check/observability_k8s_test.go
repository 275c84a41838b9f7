package check

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
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

// TestK8sScrapeAndProbes checks that Prometheus can find every service
// and the kubelet can probe it: the pod's scrape annotations name the
// container port ORCH_HTTP_ADDR listens on, and the runner and the
// notifier, like the gateway, have a readiness probe on /readyz and a
// liveness probe on /healthz on that port.
func TestK8sScrapeAndProbes(t *testing.T) {
	o := loadK8s(t)
	seen := map[string]bool{}
	for _, d := range o.deployments {
		svc := d.Spec.Template.Labels["app.kubernetes.io/component"]
		seen[svc] = true
		ann := d.Spec.Template.Annotations
		if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/path"] != "/metrics" {
			t.Errorf("Deployment %s: pod annotations %v, want prometheus.io/scrape \"true\" and path /metrics", d.Name, ann)
		}
		if len(d.Spec.Template.Spec.Containers) == 0 {
			t.Fatalf("Deployment %s has no container", d.Name)
		}
		c := d.Spec.Template.Spec.Containers[0]
		var addr string
		for _, e := range c.Env {
			if e.Name == "ORCH_HTTP_ADDR" {
				addr = e.Value
			}
		}
		port := listenPort(addr)
		if port == 0 {
			t.Errorf("Deployment %s: ORCH_HTTP_ADDR %q names no port", d.Name, addr)
			continue
		}
		var http *corev1.ContainerPort
		for i := range c.Ports {
			if c.Ports[i].Name == "http" {
				http = &c.Ports[i]
			}
		}
		if http == nil || int(http.ContainerPort) != port {
			t.Errorf("Deployment %s: container port \"http\" %v, want %d (ORCH_HTTP_ADDR)", d.Name, http, port)
		}
		if ann["prometheus.io/port"] != strconv.Itoa(port) {
			t.Errorf("Deployment %s: prometheus.io/port %q, want %d (ORCH_HTTP_ADDR)", d.Name, ann["prometheus.io/port"], port)
		}
		for _, p := range []struct {
			name string
			pr   *corev1.Probe
			path string
		}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}} {
			if p.pr == nil || p.pr.HTTPGet == nil || p.pr.HTTPGet.Path != p.path || p.pr.HTTPGet.Port.String() != "http" {
				t.Errorf("Deployment %s: %s probe %+v, want GET %s on port http", d.Name, p.name, p.pr, p.path)
			}
		}
	}
	for _, svc := range []string{"gateway", "runner", "notifier"} {
		if !seen[svc] {
			t.Errorf("no Deployment of the %s", svc)
		}
	}
}

// TestNATSHelmExporter checks the NATS chart values turn on the chart's
// Prometheus exporter and make its port scraped.
func TestNATSHelmExporter(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(k8sDir, "nats", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
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
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	if !v.Config.Monitor.Enabled || !v.PromExporter.Enabled {
		t.Errorf("monitor %v, promExporter %v: want both enabled (the exporter reads the monitor port)", v.Config.Monitor.Enabled, v.PromExporter.Enabled)
	}
	ann := v.PodTemplate.Merge.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(v.PromExporter.Port) {
		t.Errorf("NATS pod annotations %v, want the exporter's port %d scraped", ann, v.PromExporter.Port)
	}
}
