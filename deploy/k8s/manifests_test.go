// Package k8s holds the Kubernetes manifests (kustomize base + overlays); its
// test validates them without a cluster: strict decoding against the real
// API types, kustomization references, selectors, ports and probes.
package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Patches   []struct {
		Path string `json:"path"`
	} `json:"patches,omitempty"`
}

func decoder(t *testing.T) runtime.Decoder {
	t.Helper()
	sch := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme} {
		if err := add(sch); err != nil {
			t.Fatal(err)
		}
	}
	return serializer.NewCodecFactory(sch, serializer.EnableStrict).UniversalDeserializer()
}

// objects decodes every document of a manifest file strictly.
func objects(t *testing.T, dec runtime.Decoder, path string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, obj)
	}
	return out
}

func readKustomization(t *testing.T, dir string) kustomization {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if k.Kind != "Kustomization" {
		t.Fatalf("%s: kind %q", dir, k.Kind)
	}
	return k
}

// load resolves a kustomization directory into its resource objects and its
// patch objects (patches are decoded but not merged).
func load(t *testing.T, dec runtime.Decoder, dir string) (res, patches []runtime.Object) {
	t.Helper()
	k := readKustomization(t, dir)
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		if err != nil {
			t.Fatalf("%s: resource %q: %v", dir, r, err)
		}
		if st.IsDir() {
			sub, _ := load(t, dec, p)
			res = append(res, sub...)
			continue
		}
		res = append(res, objects(t, dec, p)...)
	}
	for _, p := range k.Patches {
		patches = append(patches, objects(t, dec, filepath.Join(dir, p.Path))...)
	}
	return res, patches
}

func key(o runtime.Object) string {
	switch v := o.(type) {
	case *appsv1.Deployment:
		return "Deployment/" + v.Name
	case *appsv1.StatefulSet:
		return "StatefulSet/" + v.Name
	case *corev1.Service:
		return "Service/" + v.Name
	case *corev1.ConfigMap:
		return "ConfigMap/" + v.Name
	case *corev1.Namespace:
		return "Namespace/" + v.Name
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget/" + v.Name
	}
	return "?"
}

func podTemplates(objs []runtime.Object) map[string]*corev1.PodTemplateSpec {
	out := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			out[key(o)] = &v.Spec.Template
		case *appsv1.StatefulSet:
			out[key(o)] = &v.Spec.Template
		}
	}
	return out
}

func TestOverlaysResolve(t *testing.T) {
	dec := decoder(t)
	for _, overlay := range []string{"overlays/dev", "overlays/prod"} {
		t.Run(overlay, func(t *testing.T) {
			res, patches := load(t, dec, overlay)
			have := map[string]bool{}
			for _, o := range res {
				have[key(o)] = true
			}
			for _, p := range patches {
				if !have[key(p)] {
					t.Errorf("patch targets %s, which the base does not define", key(p))
				}
			}
		})
	}
}

func TestWorkloads(t *testing.T) {
	dec := decoder(t)
	res, _ := load(t, dec, "base")
	// The services and the ports the binaries listen on by default (design README).
	want := map[string]int32{"Deployment/llmgateway": 7701, "Deployment/toolhost": 7702, "StatefulSet/agent": 7700}
	pods := podTemplates(res)
	for name, port := range want {
		pod, ok := pods[name]
		if !ok {
			t.Errorf("missing workload %s", name)
			continue
		}
		c := pod.Spec.Containers[0]
		if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.ContainerPort == port }) {
			t.Errorf("%s: no container port %d", name, port)
		}
		for probeName, pr := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if pr == nil || pr.GRPC == nil || pr.GRPC.Port != port {
				t.Errorf("%s: %s probe must be a gRPC health probe on %d", name, probeName, port)
			}
		}
		if c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: no memory limit", name)
		}
	}
	// Every Service selects exactly one workload and targets a named port it declares.
	for _, o := range res {
		svc, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		var matched []*corev1.PodTemplateSpec
		for _, pod := range pods {
			if labelsMatch(svc.Spec.Selector, pod.Labels) {
				matched = append(matched, pod)
			}
		}
		if len(matched) != 1 {
			t.Errorf("Service/%s selects %d workloads, want 1", svc.Name, len(matched))
			continue
		}
		for _, sp := range svc.Spec.Ports {
			name := sp.TargetPort.String()
			found := slices.ContainsFunc(matched[0].Spec.Containers, func(c corev1.Container) bool {
				return slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
			})
			if !found {
				t.Errorf("Service/%s targets port %q that no container declares", svc.Name, name)
			}
		}
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestStrictDecodingCatchesTypos proves the validation can fail.
func TestStrictDecodingCatchesTypos(t *testing.T) {
	dec := decoder(t)
	bad := []byte("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  prots: []\n")
	if _, _, err := dec.Decode(bad, nil, nil); err == nil || !runtime.IsStrictDecodingError(err) {
		t.Fatalf("typo decoded without a strict error: %v", err)
	}
}
