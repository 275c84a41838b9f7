package check

import (
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// claimTemplate returns the volume claim template named volume of the
// StatefulSet named set, or nil.
func (o *k8sObjects) claimTemplate(set, volume string) *corev1.PersistentVolumeClaim {
	s := o.statefulSet(set)
	if s == nil {
		return nil
	}
	for i := range s.Spec.VolumeClaimTemplates {
		if c := &s.Spec.VolumeClaimTemplates[i]; c.Name == volume {
			return c
		}
	}
	return nil
}

func (o *k8sObjects) statefulSet(name string) *appsv1.StatefulSet { return named(o.statefulSets, name) }

// The gateway's spool (webhooks that came while JetStream was away) lives
// on a PersistentVolumeClaim that comes back with the pod, and a rollout
// keeps a replica answering: a rollout, drain or crash while NATS is down
// loses no spooled webhook. A NATS outage does not take the gateways out of
// the Service either, since they spool meanwhile.
func TestKubernetesGatewaySpoolIsPersistent(t *testing.T) {
	o := loadK8s(t)
	w := o.workload(t, "gateway")
	if w.kind != "StatefulSet" {
		t.Fatalf("the gateway is a %s: its spool needs a claim per pod that a rollout gives back (a StatefulSet)", w.kind)
	}
	set := o.statefulSet(w.name)
	c := w.template.Spec.Containers[0]
	env := o.containerEnv(t, "gateway", c)
	dataDir := env["ORCH_DATA_DIR"]
	if dataDir == "" {
		t.Fatal("the gateway does not set ORCH_DATA_DIR, where its spool lives")
	}
	spool := filepath.Join(dataDir, "spool")
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if rel, err := filepath.Rel(m.MountPath, spool); err == nil && !strings.HasPrefix(rel, "..") &&
			(mount == nil || len(m.MountPath) > len(mount.MountPath)) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("no volume holds the spool %s: it is in the container's own file system", spool)
	}
	claim := o.claimTemplate(set.Name, mount.Name)
	if claim == nil {
		t.Fatalf("the spool %s is on volume %s, which is no volume claim template: it goes with the pod", spool, mount.Name)
	}
	if _, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
		t.Errorf("claim template %s requests no storage", claim.Name)
	}
	if p := set.Spec.PersistentVolumeClaimRetentionPolicy; p != nil &&
		(p.WhenScaled == appsv1.DeletePersistentVolumeClaimRetentionPolicyType || p.WhenDeleted == appsv1.DeletePersistentVolumeClaimRetentionPolicyType) {
		t.Errorf("retention policy %+v deletes claims that may hold spooled webhooks", p)
	}
	if s := set.Spec.UpdateStrategy.Type; s != "" && s != appsv1.RollingUpdateStatefulSetStrategyType {
		t.Errorf("update strategy %s, want RollingUpdate: one pod at a time, the other answering", s)
	}
	if set.Spec.Replicas == nil || *set.Spec.Replicas < 2 {
		t.Errorf("gateway replicas %v, want at least 2, so that a rollout leaves one answering webhooks", set.Spec.Replicas)
	}
	if !slices.ContainsFunc(o.services, func(s *corev1.Service) bool {
		return s.Name == set.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone &&
			labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(w.template.Labels))
	}) {
		t.Errorf("serviceName %q names no headless Service of the gateway's pods", set.Spec.ServiceName)
	}
	// Probes: alive and ready while it serves HTTP. /readyz includes the
	// NATS connection, and an unready gateway gets no webhooks to spool.
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
			t.Errorf("gateway %s probe %+v, want GET /healthz", name, p)
		}
	}
}

// The alert's "details" link, ORCH_PUBLIC_URL/jobs/<id> (and the
// dashboard's /ui/jobs/<id>), and the webhook paths are served by the
// shipped Ingress, on the host of ORCH_PUBLIC_URL, by the gateway.
func TestKubernetesIngressServesAlertLinks(t *testing.T) {
	o := loadK8s(t)
	gw := o.workload(t, "gateway")
	for _, component := range []string{"gateway", "notifier"} {
		w := o.workload(t, component)
		public := o.containerEnv(t, component, w.template.Spec.Containers[0])["ORCH_PUBLIC_URL"]
		u, err := url.Parse(public)
		if public == "" || err != nil || u.Host == "" {
			t.Errorf("%s: ORCH_PUBLIC_URL %q is no base URL (%v)", component, public, err)
			continue
		}
		for _, path := range []string{"/jobs/d09f622b8e7a5d0f5709f89c", "/ui/jobs/d09f622b8e7a5d0f5709f89c", "/webhooks/gitea", "/webhooks/plane"} {
			link := strings.TrimRight(u.Path, "/") + path
			svc := o.ingressRoute(u, link)
			if svc == "" {
				t.Errorf("%s%s (from the %s's ORCH_PUBLIC_URL): no Ingress serves it", public, path, component)
				continue
			}
			if !slices.ContainsFunc(o.services, func(s *corev1.Service) bool {
				return s.Name == svc && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(gw.template.Labels))
			}) {
				t.Errorf("%s%s goes to Service %s, which is not the gateway's", public, path, svc)
			}
		}
	}
}

// ingressRoute returns the Service an Ingress sends a request for path on
// u's host to, "" if none, with Kubernetes' matching: Exact paths whole,
// Prefix paths by whole path elements; an https URL needs its host in the
// Ingress's TLS hosts.
func (o *k8sObjects) ingressRoute(u *url.URL, path string) string {
	for _, ing := range o.ingresses {
		if u.Scheme == "https" && !slices.ContainsFunc(ing.Spec.TLS, func(tls networkingv1.IngressTLS) bool {
			return slices.Contains(tls.Hosts, u.Hostname())
		}) {
			continue
		}
		for _, r := range ing.Spec.Rules {
			if (r.Host != "" && r.Host != u.Hostname()) || r.HTTP == nil {
				continue
			}
			for _, p := range r.HTTP.Paths {
				if p.PathType == nil || p.Backend.Service == nil {
					continue
				}
				switch *p.PathType {
				case networkingv1.PathTypeExact:
					if p.Path == path {
						return p.Backend.Service.Name
					}
				case networkingv1.PathTypePrefix:
					prefix := strings.TrimRight(p.Path, "/")
					if prefix == "" || path == prefix || strings.HasPrefix(path, prefix+"/") {
						return p.Backend.Service.Name
					}
				}
			}
		}
	}
	return ""
}
