package check

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

var k8sDir = filepath.Join(repoRoot, "deployments", "k8s")

// kustomization is the part of kustomize's Kustomization and Component
// this repository uses, decoded strictly: a misspelt key fails. (The
// kustomize API module would pull in much of kustomize for two structs.)
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	Components []string `json:"components,omitempty"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
	} `json:"labels,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// k8sObjects is every object of every manifest, decoded into the
// Kubernetes API types.
type k8sObjects struct {
	deployments  []*appsv1.Deployment
	statefulSets []*appsv1.StatefulSet
	services     []*corev1.Service
	configMaps   []*corev1.ConfigMap
	secrets      []*corev1.Secret
	pdbs         []*policyv1.PodDisruptionBudget
	ingresses    []*networkingv1.Ingress
	namespaces   []*corev1.Namespace
	// files is every manifest file read, for the kustomization check.
	files []string
}

// loadK8s decodes every YAML file under deployments/k8s but the
// kustomizations and the Helm values (nats/), failing on an unknown kind
// or field.
func loadK8s(t *testing.T) *k8sObjects {
	t.Helper()
	objs := &k8sObjects{}
	err := filepath.WalkDir(k8sDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "nats" {
				return filepath.SkipDir // Helm values, not a manifest
			}
			return nil
		}
		if !strings.HasSuffix(path, ".yaml") || d.Name() == "kustomization.yaml" {
			return nil
		}
		objs.files = append(objs.files, path)
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, doc := range splitYAML(data) {
			if err := objs.decode(doc); err != nil {
				return fmt.Errorf("%s, document %d: %w", path, i+1, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// splitYAML splits a multi-document YAML file on its "---" lines.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	for doc := range bytes.SplitSeq(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
	return docs
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for line := range bytes.SplitSeq(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func (o *k8sObjects) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	add, ok := map[string]func() any{
		"apps/v1 Deployment":            func() any { return appendNew(&o.deployments) },
		"apps/v1 StatefulSet":           func() any { return appendNew(&o.statefulSets) },
		"v1 Service":                    func() any { return appendNew(&o.services) },
		"v1 ConfigMap":                  func() any { return appendNew(&o.configMaps) },
		"v1 Secret":                     func() any { return appendNew(&o.secrets) },
		"policy/v1 PodDisruptionBudget": func() any { return appendNew(&o.pdbs) },
		"networking.k8s.io/v1 Ingress":  func() any { return appendNew(&o.ingresses) },
		"v1 Namespace":                  func() any { return appendNew(&o.namespaces) },
	}[tm.APIVersion+" "+tm.Kind]
	if !ok {
		return fmt.Errorf("unexpected kind %q %q", tm.APIVersion, tm.Kind)
	}
	target := add()
	// Strict: a field the API type does not have is an error, as
	// `kubectl apply --validate=strict` would report it.
	return yaml.UnmarshalStrict(doc, target)
}

// appendNew appends a new, empty object to list and returns it, for the
// decoder to fill.
func appendNew[T any](list *[]*T) *T {
	v := new(T)
	*list = append(*list, v)
	return v
}

// named returns the object called name in list, or nil.
func named[T metav1.Object](list []T, name string) T {
	for _, o := range list {
		if o.GetName() == name {
			return o
		}
	}
	var none T
	return none
}

// workload is a Deployment or a StatefulSet: what runs a service's pods.
type workload struct {
	kind, name string
	selector   *metav1.LabelSelector
	template   *corev1.PodTemplateSpec
}

// component is the service a workload runs: gateway, runner or notifier.
func (w workload) component() string { return w.template.Labels["app.kubernetes.io/component"] }

func (o *k8sObjects) workloads() []workload {
	var ws []workload
	for _, d := range o.deployments {
		ws = append(ws, workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template})
	}
	for _, s := range o.statefulSets {
		ws = append(ws, workload{"StatefulSet", s.Name, s.Spec.Selector, &s.Spec.Template})
	}
	return ws
}

// workload returns the workload that runs component.
func (o *k8sObjects) workload(t *testing.T, component string) workload {
	t.Helper()
	for _, w := range o.workloads() {
		if w.component() == component {
			return w
		}
	}
	t.Fatalf("no Deployment or StatefulSet of the %s", component)
	return workload{}
}

func (o *k8sObjects) configMap(name string) *corev1.ConfigMap { return named(o.configMaps, name) }

func (o *k8sObjects) secret(name string) *corev1.Secret { return named(o.secrets, name) }

// containerEnv resolves a container's environment as the kubelet would:
// envFrom ConfigMaps first, then env, with Secret values and field
// references filled in.
func (o *k8sObjects) containerEnv(t *testing.T, where string, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm := o.configMap(from.ConfigMapRef.Name)
			if cm == nil {
				t.Errorf("%s: envFrom names ConfigMap %s, which no manifest defines", where, from.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		default:
			t.Errorf("%s: envFrom other than a ConfigMap is not checked", where)
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s := o.secret(ref.Name)
			if s == nil {
				t.Errorf("%s: %s names Secret %s, which no manifest defines", where, e.Name, ref.Name)
				continue
			}
			v, ok := s.StringData[ref.Key]
			if !ok {
				t.Errorf("%s: %s names key %s, which Secret %s does not have", where, e.Name, ref.Key, ref.Name)
			}
			env[e.Name] = v
		case e.ValueFrom.FieldRef != nil:
			env[e.Name] = "value-of-" + e.ValueFrom.FieldRef.FieldPath
		default:
			t.Errorf("%s: %s: valueFrom kind not checked", where, e.Name)
		}
	}
	return env
}

// containerFiles lists the files a container's ConfigMap and Secret
// volumes hold, by their path in the container.
func (o *k8sObjects) containerFiles(t *testing.T, where string, spec corev1.PodSpec, c corev1.Container) map[string]deployedFile {
	t.Helper()
	files := map[string]deployedFile{}
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			continue
		}
		v := spec.Volumes[i]
		var kind, name string
		var data map[string]string
		var items []corev1.KeyToPath
		switch {
		case v.ConfigMap != nil:
			kind, name, items = "ConfigMap", v.ConfigMap.Name, v.ConfigMap.Items
			if cm := o.configMap(name); cm != nil {
				data = cm.Data
			}
		case v.Secret != nil:
			kind, name, items = "Secret", v.Secret.SecretName, v.Secret.Items
			if s := o.secret(name); s != nil {
				data = s.StringData
			}
		default:
			continue
		}
		if data == nil {
			t.Errorf("%s: volume %s names %s %s, which no manifest defines", where, v.Name, kind, name)
			continue
		}
		if len(items) == 0 {
			for k := range data {
				items = append(items, corev1.KeyToPath{Key: k, Path: k})
			}
		}
		for _, it := range items {
			content, ok := data[it.Key]
			if !ok {
				t.Errorf("%s: volume %s names key %s, which %s %s does not have", where, v.Name, it.Key, kind, name)
			}
			files[path.Join(m.MountPath, it.Path)] = deployedFile{
				origin: kind + " " + name + " key " + it.Key, secret: kind == "Secret", content: content,
			}
		}
	}
	return files
}

func kubernetesEnvs(t *testing.T) []deploymentEnv {
	t.Helper()
	o := loadK8s(t)
	var envs []deploymentEnv
	for _, w := range o.workloads() {
		for _, c := range w.template.Spec.Containers {
			where := "k8s/" + w.kind + " " + w.name
			envs = append(envs, deploymentEnv{where: where, service: w.component(), env: o.containerEnv(t, where, c), files: o.containerFiles(t, where, w.template.Spec, c)})
		}
	}
	return envs
}

func TestKubernetesManifests(t *testing.T) {
	o := loadK8s(t)
	if n := len(o.workloads()); n != 3 {
		t.Fatalf("%d Deployments and StatefulSets, want one per service", n)
	}

	for _, w := range o.workloads() {
		where := w.kind + " " + w.name
		spec := w.template.Spec
		sel, err := metav1.LabelSelectorAsSelector(w.selector)
		if err != nil || !sel.Matches(labels.Set(w.template.Labels)) {
			t.Errorf("%s: selector does not match its pods (%v)", where, err)
		}
		// No orch pod runs as root; the runner's agents must not, since
		// Claude Code refuses to bypass permissions as root.
		if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
			t.Errorf("%s: pods may run as root (want runAsNonRoot and a non-zero runAsUser)", where)
		}
		for _, c := range spec.Containers {
			if sc := c.SecurityContext; sc != nil && ((sc.RunAsUser != nil && *sc.RunAsUser == 0) || (sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot)) {
				t.Errorf("%s, container %s: runs as root", where, c.Name)
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				if _, ok := c.Resources.Requests[r]; !ok {
					t.Errorf("%s, container %s: no %s request", where, c.Name, r)
				}
			}
			for _, m := range c.VolumeMounts {
				if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name }) && o.claimTemplate(w.name, m.Name) == nil {
					t.Errorf("%s: mount of undeclared volume %s", where, m.Name)
				}
			}
		}
		for _, v := range spec.Volumes {
			if v.ConfigMap != nil && o.configMap(v.ConfigMap.Name) == nil {
				t.Errorf("%s: volume %s names ConfigMap %s, which no manifest defines", where, v.Name, v.ConfigMap.Name)
			}
		}
	}

	// The runner: the kubelet waits longer than the runner's own grace
	// period before it kills the pod, so running agents get all of it.
	rd := o.workload(t, "runner").template.Spec
	renv := o.containerEnv(t, "runner", rd.Containers[0])
	stop := runnerStopTime(t, renv)
	tgps := rd.TerminationGracePeriodSeconds
	if tgps == nil {
		t.Errorf("runner has no terminationGracePeriodSeconds (default 30s), want more than its stop time %v", stop)
	} else if time.Duration(*tgps)*time.Second <= stop {
		t.Errorf("runner terminationGracePeriodSeconds %d not above the runner's stop time %v", *tgps, stop)
	}

	// The streams are replicated on the three NATS pods, which every
	// service names.
	for _, w := range o.workloads() {
		env := o.containerEnv(t, w.name, w.template.Spec.Containers[0])
		if env["ORCH_STREAM_REPLICAS"] != "3" {
			t.Errorf("%s %s: ORCH_STREAM_REPLICAS=%q, want 3", w.kind, w.name, env["ORCH_STREAM_REPLICAS"])
		}
		if n := len(strings.Split(env["ORCH_NATS_URL"], ",")); n != 3 {
			t.Errorf("%s %s: ORCH_NATS_URL names %d servers, want 3", w.kind, w.name, n)
		}
	}

	// Services, Ingresses and budgets select pods that exist.
	podLabels := func(sel labels.Selector) bool {
		return slices.ContainsFunc(o.workloads(), func(w workload) bool {
			return sel.Matches(labels.Set(w.template.Labels))
		})
	}
	for _, s := range o.services {
		if len(s.Spec.Selector) == 0 || !podLabels(labels.SelectorFromSet(s.Spec.Selector)) {
			t.Errorf("Service %s selects no pods", s.Name)
		}
	}
	for _, p := range o.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil || !podLabels(sel) {
			t.Errorf("PodDisruptionBudget %s selects no pods (%v)", p.Name, err)
		}
	}
	for _, component := range []string{"gateway", "runner"} {
		w := o.workload(t, component)
		if !slices.ContainsFunc(o.pdbs, func(p *policyv1.PodDisruptionBudget) bool {
			sel, _ := metav1.LabelSelectorAsSelector(p.Spec.Selector)
			return sel.Matches(labels.Set(w.template.Labels))
		}) {
			t.Errorf("no PodDisruptionBudget for the %s", component)
		}
	}
	for _, ing := range o.ingresses {
		for _, r := range ing.Spec.Rules {
			for _, p := range r.HTTP.Paths {
				name := p.Backend.Service.Name
				if !slices.ContainsFunc(o.services, func(s *corev1.Service) bool { return s.Name == name }) {
					t.Errorf("Ingress %s routes %s to Service %s, which no manifest defines", ing.Name, p.Path, name)
				}
			}
		}
	}
	if len(o.ingresses) == 0 {
		t.Error("no Ingress")
	}

	// The Secret is a placeholder to replace, and says so.
	for _, s := range o.secrets {
		data, _ := os.ReadFile(filepath.Join(k8sDir, "secret.yaml"))
		if !strings.Contains(string(data), "PLACEHOLDER") {
			t.Errorf("Secret %s: secret.yaml does not say its values are placeholders", s.Name)
		}
	}
}

// TestKustomizations checks that every kustomization names files and
// directories that exist, and that every manifest is in one of them.
func TestKustomizations(t *testing.T) {
	o := loadK8s(t)
	listed := map[string]bool{}
	var kinds []string
	err := filepath.WalkDir(k8sDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var k kustomization
		if err := yaml.UnmarshalStrict(data, &k); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		kinds = append(kinds, k.Kind)
		switch {
		case k.Kind == "Kustomization" && k.APIVersion == "kustomize.config.k8s.io/v1beta1":
		case k.Kind == "Component" && k.APIVersion == "kustomize.config.k8s.io/v1alpha1":
		default:
			t.Errorf("%s: unexpected %s %s", path, k.APIVersion, k.Kind)
		}
		dir := filepath.Dir(path)
		for _, r := range k.Resources {
			p := filepath.Join(dir, r)
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s: resource %s: %v", path, r, err)
			}
			listed[p] = true
		}
		for _, c := range k.Components {
			if _, err := os.Stat(filepath.Join(dir, c, "kustomization.yaml")); err != nil {
				t.Errorf("%s: component %s: %v", path, c, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(kinds, "Kustomization") || !slices.Contains(kinds, "Component") {
		t.Errorf("kustomizations %v, want the base and the ingress component", kinds)
	}
	for _, f := range o.files {
		if !listed[f] {
			t.Errorf("%s is in no kustomization", f)
		}
	}
}

// TestNATSHelmValues checks the values for the official NATS chart ask
// for what orch's R3 streams need: three clustered JetStream nodes on
// persistent file storage.
func TestNATSHelmValues(t *testing.T) {
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
			} `json:"cluster"`
			JetStream struct {
				Enabled   bool `json:"enabled"`
				FileStore struct {
					Enabled bool `json:"enabled"`
					PVC     struct {
						Enabled bool   `json:"enabled"`
						Size    string `json:"size"`
					} `json:"pvc"`
				} `json:"fileStore"`
			} `json:"jetstream"`
		} `json:"config"`
	}
	readYAML(t, filepath.Join(k8sDir, "nats", "values.yaml"), &v)
	c := v.Config
	if !c.Cluster.Enabled || c.Cluster.Replicas != 3 {
		t.Errorf("cluster %+v, want enabled with 3 replicas", c.Cluster)
	}
	if !c.JetStream.Enabled || !c.JetStream.FileStore.Enabled || !c.JetStream.FileStore.PVC.Enabled || c.JetStream.FileStore.PVC.Size == "" {
		t.Errorf("jetstream %+v, want enabled on a file store with a persistent volume", c.JetStream)
	}
}
