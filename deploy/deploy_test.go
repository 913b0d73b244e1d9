// Package deploy holds the files that run the sweeper elsewhere (compose,
// Kubernetes, Prometheus rules, a Grafana dashboard). Its test parses every one
// of them, so a file that its tool would refuse fails `make check-deploy`.
package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	yamlv3 "go.yaml.in/yaml/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"

	"github.com/outbox-sweeper/sweeper/admin"
)

func TestEveryFileParses(t *testing.T) {
	t.Parallel()
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yml", ".yaml":
			n++
			t.Run(path, func(t *testing.T) { parseYAML(t, path) })
		case ".json":
			n++
			t.Run(path, func(t *testing.T) {
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !json.Valid(b) {
					var v any
					t.Fatalf("%s is not JSON: %v", path, json.Unmarshal(b, &v))
				}
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 4 {
		t.Fatalf("found %d deploy files, want at least the compose file, the manifest, the rules and the dashboard", n)
	}
}

// parseYAML decodes every document of the file (a Kubernetes manifest holds
// several) and fails on the first error, naming the line.
func parseYAML(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(b))
	docs := 0
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs++
	}
	if docs == 0 {
		t.Fatalf("%s holds no YAML document", path)
	}
}

// The manifest is what `kubectl apply` would accept: each object decodes
// strictly into its Kubernetes type (a misspelt or misplaced field fails), the
// pod passes the "restricted" Pod Security Standard as the API server's own
// admission checks evaluate it, and the pieces fit: the Service and the
// PodDisruptionBudget select the pod, the probes and the Service name its
// port, which is the port the sweeper listens on.
func TestKubernetesManifest(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("kubernetes/sweeper.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		deployment *appsv1.Deployment
		service    *corev1.Service
		pdb        *policyv1.PodDisruptionBudget
		secret     *corev1.Secret
	)
	for i, doc := range splitYAML(b) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 Deployment":
			deployment = new(appsv1.Deployment)
			obj = deployment
		case "v1 Service":
			service = new(corev1.Service)
			obj = service
		case "policy/v1 PodDisruptionBudget":
			pdb = new(policyv1.PodDisruptionBudget)
			obj = pdb
		case "v1 Secret":
			secret = new(corev1.Secret)
			obj = secret
		default:
			t.Fatalf("document %d is a %s %s: teach this test its type", i, head.APIVersion, head.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatalf("document %d (%s): %v", i, head.Kind, err)
		}
	}
	if deployment == nil || service == nil || pdb == nil || secret == nil {
		t.Fatal("the manifest needs a Deployment, a Service, a PodDisruptionBudget and a Secret")
	}
	pod := deployment.Spec.Template

	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range evaluator.EvaluatePod(psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}, &pod.ObjectMeta, &pod.Spec) {
		if !r.Allowed {
			t.Errorf("restricted Pod Security Standard: %s: %s", r.ForbiddenReason, r.ForbiddenDetail)
		}
	}

	_, port, err := net.SplitHostPort(admin.AddrDefault)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
			t.Errorf("container %s needs cpu and memory requests and a memory limit", c.Name)
		}
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("want one container, the sweeper; got %d", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	// The runtime writes MiB where Kubernetes writes Mi.
	memLimit := env["GOMEMLIMIT"]
	if limit, err := resource.ParseQuantity(strings.TrimSuffix(memLimit, "B")); err != nil || !strings.HasSuffix(memLimit, "iB") {
		t.Errorf("GOMEMLIMIT %q: set it, in the runtime's units (230MiB), below the memory limit", memLimit)
	} else if max := c.Resources.Limits.Memory(); limit.Cmp(*max) >= 0 || limit.Value() < max.Value()*3/4 {
		t.Errorf("GOMEMLIMIT %s should be about 90 %% of the memory limit %s", env["GOMEMLIMIT"], max)
	}
	if want := "0.0.0.0:" + port; env["OUTBOX_ADMIN_ADDR"] != want {
		t.Errorf("OUTBOX_ADMIN_ADDR is %q, want %q (the default port, on every interface for the probes)", env["OUTBOX_ADMIN_ADDR"], want)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "admin" || fmt.Sprint(c.Ports[0].ContainerPort) != port {
		t.Errorf("container ports %+v: want one named admin on %s", c.Ports, port)
	}
	if pod.Annotations["prometheus.io/port"] != port {
		t.Errorf("prometheus.io/port is %q, want %s", pod.Annotations["prometheus.io/port"], port)
	}
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.String() != "admin" {
			t.Errorf("the %s probe must GET the admin port", name)
		}
	}
	if probe := c.LivenessProbe; probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probes %s, want /healthz", probe.HTTPGet.Path)
	}
	if probe := c.ReadinessProbe; probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness probes %s, want /readyz", probe.HTTPGet.Path)
	}

	selects := func(what string, sel map[string]string) {
		if len(sel) == 0 {
			t.Errorf("the %s selects nothing", what)
		}
		for k, v := range sel {
			if pod.Labels[k] != v {
				t.Errorf("the %s selects %s=%s, which the pod does not carry", what, k, v)
			}
		}
	}
	selects("Service", service.Spec.Selector)
	selects("Deployment", deployment.Spec.Selector.MatchLabels)
	if pdb.Spec.Selector == nil {
		t.Fatal("the PodDisruptionBudget has no selector")
	}
	selects("PodDisruptionBudget", pdb.Spec.Selector.MatchLabels)
	if len(service.Spec.Ports) != 1 || service.Spec.Ports[0].TargetPort.String() != "admin" || fmt.Sprint(service.Spec.Ports[0].Port) != port {
		t.Errorf("Service ports %+v: want port %s to the admin port", service.Spec.Ports, port)
	}
}

// The image listens where the sweeper does by default, and checks its health
// with the binary (distroless has neither shell nor curl).
func TestDockerfile(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(admin.AddrDefault)
	docker := string(b)
	for _, want := range []string{"EXPOSE " + port, `HEALTHCHECK `, `CMD ["/usr/local/bin/sweeper", "healthcheck"`,
		"org.opencontainers.image.source=", "org.opencontainers.image.version=", "USER 65532:65532"} {
		if !strings.Contains(docker, want) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatalf("no .dockerignore: %v", err)
	}
	for _, want := range []string{".git", "bin/", ".services.env"} {
		if !slices.Contains(strings.Fields(string(ignore)), want) {
			t.Errorf(".dockerignore does not leave out %s", want)
		}
	}
	compose, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(compose), "OUTBOX_ADMIN_ADDR: 0.0.0.0:"+port) || !strings.Contains(string(compose), ":"+port+":"+port+`"`) {
		t.Errorf("docker-compose.yml must listen and publish on the default admin port %s", port)
	}
}

// splitYAML returns the documents of a multi-document YAML file.
func splitYAML(b []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(d, "")) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}
