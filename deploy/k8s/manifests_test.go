// Package k8s holds the Kubernetes manifests (kustomize base, components and
// overlays); its tests validate them without a cluster: every overlay is
// rendered with kustomize's Go API and every object decoded strictly against
// the real API types (cert-manager's through strict local types); then
// selectors, ports, probes, the TLS flags of every server, the network
// policies (who can reach which Service) and the absence of secret values
// are checked.
package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/dsh-dev/dsh/internal/testpki"
)

// overlays are the deployable entry points.
var overlays = []string{"overlays/dev", "overlays/prod"}

// overlayNamespace is where each overlay deploys: dev and prod never share
// a namespace (nor, so, a Secret, a volume or a name).
var overlayNamespace = map[string]string{"overlays/dev": "dsh-dev", "overlays/prod": "dsh"}

// crdHead is the type and object metadata of a cert-manager object.
type crdHead struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
}

// certificate is the part of cert-manager's Certificate the manifests use,
// decoded strictly (an unknown field is a typo).
type certificate struct {
	crdHead
	Spec struct {
		IsCA        bool     `json:"isCA"`
		CommonName  string   `json:"commonName"`
		SecretName  string   `json:"secretName"`
		Duration    string   `json:"duration"`
		RenewBefore string   `json:"renewBefore"`
		URIs        []string `json:"uris"`
		DNSNames    []string `json:"dnsNames"`
		Usages      []string `json:"usages"`
		PrivateKey  struct {
			Algorithm      string `json:"algorithm"`
			Size           int    `json:"size"`
			RotationPolicy string `json:"rotationPolicy"`
		} `json:"privateKey"`
		IssuerRef struct {
			Name string `json:"name"`
			Kind string `json:"kind"`
		} `json:"issuerRef"`
	} `json:"spec"`
}

// issuer is cert-manager's Issuer as the manifests use it.
type issuer struct {
	crdHead
	Spec struct {
		SelfSigned *struct{} `json:"selfSigned"`
		CA         *struct {
			SecretName string `json:"secretName"`
		} `json:"ca"`
	} `json:"spec"`
}

func decoder(t *testing.T) runtime.Decoder {
	t.Helper()
	sch := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(sch); err != nil {
			t.Fatal(err)
		}
	}
	return serializer.NewCodecFactory(sch, serializer.EnableStrict).UniversalDeserializer()
}

// rendered is one overlay's output.
type rendered struct {
	objs  []runtime.Object
	certs []certificate
	iss   []issuer
	yaml  []byte // the whole output, as kubectl apply -k would send it
}

// memFS copies deploy/k8s into an in-memory file system and adds the files
// the plain-Secret component reads (certificates from a CA made here, nkey
// files), as an operator would before `kubectl apply -k overlays/dev`.
func memFS(t *testing.T) filesys.FileSystem {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(filepath.Join("/k8s", p), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	ca := testpki.NewCA(t, "dsh")
	put := func(name string, b []byte) {
		if err := mem.WriteFile(filepath.Join("/k8s/components/tls-secrets", name), b); err != nil {
			t.Fatal(err)
		}
	}
	put("tls/ca.crt", ca.CertPEM)
	for _, svc := range []string{"agent", "llmgateway", "toolhost", "nats"} {
		l := ca.Server(svc, testpki.Names{DNS: []string{svc}, URIs: []string{"spiffe://dsh/" + svc}})
		put("tls/"+svc+".crt", l.CertPEM)
		put("tls/"+svc+".key", l.KeyPEM)
	}
	put("nkeys/agent.nk", []byte("SUAFAKESEEDFORRENDERINGONLY\n"))
	put("nkeys/users.env", []byte("AGENT_NKEY=UAGENT\nACME_NKEY=UACME\n"))
	return mem
}

func render(t *testing.T, dir string) rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(memFS(t), filepath.Join("/k8s", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{yaml: out}
	dec := decoder(t)
	for _, doc := range documents(t, out) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "Certificate":
			var c certificate
			if err := yaml.UnmarshalStrict(doc, &c); err != nil {
				t.Fatalf("%s: Certificate: %v", dir, err)
			}
			r.certs = append(r.certs, c)
		case "Issuer":
			var i issuer
			if err := yaml.UnmarshalStrict(doc, &i); err != nil {
				t.Fatalf("%s: Issuer: %v", dir, err)
			}
			r.iss = append(r.iss, i)
		default:
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v\n%s", dir, err, doc)
			}
			r.objs = append(r.objs, obj)
		}
	}
	return r
}

func documents(t *testing.T, raw []byte) [][]byte {
	t.Helper()
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out [][]byte
	for {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) > 0 {
			out = append(out, doc)
		}
	}
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
	case *corev1.Secret:
		return "Secret/" + v.Name
	case *corev1.Namespace:
		return "Namespace/" + v.Name
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget/" + v.Name
	case *networkingv1.NetworkPolicy:
		return "NetworkPolicy/" + v.Name
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

func find[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// TestOverlaysRender: every overlay renders, every object is of a known
// kind, and every namespaced object (components' Secrets, Issuers and
// Certificates included) lands in the overlay's namespace, where the pods
// that mount the Secrets run, and that namespace is the one it creates.
func TestOverlaysRender(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			ns := overlayNamespace[overlay]
			if nss := find[*corev1.Namespace](r.objs); len(nss) != 1 || nss[0].Name != ns {
				t.Errorf("the overlay creates namespaces %v, want exactly %s", nss, ns)
			}
			for _, o := range r.objs {
				if key(o) == "?" {
					t.Errorf("an object of an unexpected kind: %T", o)
				}
				m, ok := o.(metav1.Object)
				if _, isNS := o.(*corev1.Namespace); ok && !isNS && m.GetNamespace() != ns {
					t.Errorf("%s is in namespace %q, want %s", key(o), m.GetNamespace(), ns)
				}
			}
			for _, c := range r.certs {
				if c.Metadata.Namespace != ns {
					t.Errorf("Certificate/%s is in namespace %q, want %s", c.Metadata.Name, c.Metadata.Namespace, ns)
				}
			}
			for _, i := range r.iss {
				if i.Metadata.Namespace != ns {
					t.Errorf("Issuer/%s is in namespace %q, want %s", i.Metadata.Name, i.Metadata.Namespace, ns)
				}
			}
		})
	}
}

func TestWorkloads(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) { checkWorkloads(t, render(t, overlay).objs) })
	}
}

func checkWorkloads(t *testing.T, res []runtime.Object) {
	// The services and the ports the binaries listen on by default (design README).
	want := map[string]int32{"Deployment/llmgateway": 7701, "StatefulSet/toolhost": 7702}
	pods := podTemplates(res)
	// The agent is a StatefulSet (SQLite, dev) or a Deployment (replicas
	// on PostgreSQL, prod), never both.
	sts, dep := pods["StatefulSet/agent"] != nil, pods["Deployment/agent"] != nil
	switch {
	case sts && !dep:
		want["StatefulSet/agent"] = 7700
	case dep && !sts:
		want["Deployment/agent"] = 7700
	default:
		t.Errorf("agent workloads: StatefulSet %v, Deployment %v; want exactly one", sts, dep)
	}
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
		// kubelet's gRPC probes speak plaintext only; the servers require
		// TLS, so the probes check the socket.
		probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
		if strings.HasSuffix(name, "/agent") {
			// Readiness is the agent's gRPC health (store, lease and drain)
			// on its plaintext health-only port; checkAgentReplicas and
			// checkHardening check it.
			delete(probes, "readiness")
		}
		for probeName, pr := range probes {
			if pr == nil || pr.TCPSocket == nil || pr.TCPSocket.Port.IntValue() != int(port) {
				t.Errorf("%s: %s probe must be a TCP probe on %d", name, probeName, port)
			}
		}
		if c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: no memory limit", name)
		}
	}
	// Every Service selects exactly one workload and targets a named port it declares.
	for _, svc := range find[*corev1.Service](res) {
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
	var c certificate
	if err := yaml.UnmarshalStrict([]byte("kind: Certificate\nspec:\n  uri: [x]\n"), &c); err == nil {
		t.Fatal("a Certificate typo decoded")
	}
}
