package k8s

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/dsh-dev/dsh/internal/events"
)

const (
	agentID     = "spiffe://dsh/agent"
	namespace   = "dsh"
	agentLabel  = "agent"
	labelName   = "app.kubernetes.io/name"
	consumerKey = "dsh.dev/nats-consumer"
)

// flagsOf returns a container's --name=value flags (value "" for a bare
// flag), with $(VAR) references checked against its env: Kubernetes leaves
// an undefined reference unexpanded, which would reach the binary literally.
func flagsOf(t *testing.T, who string, c corev1.Container) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range c.Args {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, val, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		for _, m := range regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`).FindAllStringSubmatch(val, -1) {
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == m[1] }) {
				t.Errorf("%s: --%s references $(%s), which the container's env does not define", who, name, m[1])
			}
		}
		out[name] = append(out[name], val)
	}
	return out
}

// secretMountDir reports whether dir is mounted from a Secret volume (the
// only place a key or certificate may come from).
func secretMountDir(pod *corev1.PodTemplateSpec, c corev1.Container, file string) (string, bool) {
	for _, m := range c.VolumeMounts {
		if filepath.Dir(file) != filepath.Clean(m.MountPath) {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, true
			}
		}
	}
	return "", false
}

// TestServersUseTLS: every gRPC server container starts with its
// certificate and key from a Secret; gateway and toolhost require client
// certificates and allow only the agent; the agent authenticates clients by
// JWT (settings from a ConfigMap) and dials with its client certificate.
func TestServersUseTLS(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			pods := podTemplates(r.objs)
			servers := 0
			for name, pod := range pods {
				for _, c := range pod.Spec.Containers {
					if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "grpc" }) {
						continue
					}
					servers++
					who := name + "/" + c.Name
					checkServerFlags(t, who, pod, c, flagsOf(t, who, c))
				}
			}
			if servers != 3 {
				t.Fatalf("%d gRPC server containers, want 3 (agent, llmgateway, toolhost)", servers)
			}
			checkNATSConfig(t, r.objs)
		})
	}
}

func checkServerFlags(t *testing.T, who string, pod *corev1.PodTemplateSpec, c corev1.Container, f map[string][]string) {
	t.Helper()
	need := []string{"tls-cert", "tls-key"}
	role := pod.Labels[labelName]
	switch role {
	case "llmgateway", "toolhost":
		need = append(need, "tls-client-ca")
		if got := f["allow-peer"]; !slices.Equal(got, []string{agentID}) {
			t.Errorf("%s: --allow-peer %v, want exactly [%s]", who, got, agentID)
		}
	case agentLabel:
		need = append(need, "tls-ca", "tls-client-cert", "tls-client-key", "jwt-jwks", "jwt-issuer", "jwt-audience",
			"nats-tls-ca", "nats-tls-cert", "nats-tls-key", "nats-nkey")
		if got := f["auth"]; !slices.Equal(got, []string{"jwt"}) {
			t.Errorf("%s: --auth %v, want jwt", who, got)
		}
		if i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "NATS_URL" }); i < 0 || !strings.HasPrefix(c.Env[i].Value, "tls://") {
			t.Errorf("%s: NATS_URL must be a tls:// URL", who)
		}
		for _, name := range []string{"jwt-jwks", "jwt-issuer", "jwt-audience"} {
			if len(f[name]) == 1 && strings.HasPrefix(f[name][0], "$(") {
				v := strings.TrimSuffix(strings.TrimPrefix(f[name][0], "$("), ")")
				i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == v })
				if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.ConfigMapKeyRef == nil {
					t.Errorf("%s: --%s must come from a ConfigMap", who, name)
				}
			}
		}
	default:
		t.Errorf("%s: a gRPC server of unknown role %q", who, role)
	}
	if _, ok := f["insecure"]; ok {
		t.Errorf("%s: started with --insecure", who)
	}
	for _, name := range need {
		vals := f[name]
		if len(vals) != 1 || vals[0] == "" {
			t.Errorf("%s: --%s missing", who, name)
			continue
		}
		if strings.HasPrefix(vals[0], "/") {
			if _, ok := secretMountDir(pod, c, vals[0]); !ok {
				t.Errorf("%s: --%s=%s is not in a directory mounted from a Secret", who, name, vals[0])
			}
		}
	}
	if role == agentLabel {
		return
	}
	// The server certificate is the service's own.
	if s, _ := secretMountDir(pod, c, f["tls-cert"][0]); s != "dsh-"+role+"-tls" {
		t.Errorf("%s: serves the certificate of Secret %q, want dsh-%s-tls", who, s, role)
	}
}

// checkNATSConfig: NATS requires TLS with client certificates and has no
// user without an nkey.
func checkNATSConfig(t *testing.T, objs []runtime.Object) {
	t.Helper()
	conf := natsConf(t, objs)
	for _, want := range []string{"verify: true", "ca_file:", "accounts {", "nkey: $AGENT_NKEY"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nats.conf lacks %q", want)
		}
	}
	// The agent's and the example consumer's permissions are exactly the
	// ones internal/events documents (and tests against a real server).
	apub, asub := events.AgentPermissions()
	cpub, csub := events.ConsumerPermissions("acme")
	for _, subj := range slices.Concat(apub, asub, cpub, csub) {
		if !strings.Contains(conf, strconv.Quote(subj)) {
			t.Errorf("nats.conf does not grant %q", subj)
		}
	}
	if strings.Contains(conf, "password") || strings.Contains(conf, "no_auth_user") {
		t.Error("nats.conf has a password user or an anonymous user")
	}
}

func natsConf(t *testing.T, objs []runtime.Object) string {
	t.Helper()
	for _, cm := range find[*corev1.ConfigMap](objs) {
		if c, ok := cm.Data["nats.conf"]; ok {
			return c
		}
	}
	t.Fatal("no ConfigMap holds nats.conf")
	return ""
}

// TestCertificatesPerService: with cert-manager, every TLS Secret a pod
// mounts is issued by the dsh CA with the service's SPIFFE id; the plain
// variant generates the same Secrets.
func TestCertificatesPerService(t *testing.T) {
	prod := render(t, "overlays/prod")
	bySecret := map[string]certificate{}
	for _, c := range prod.certs {
		bySecret[c.Spec.SecretName] = c
	}
	for _, svc := range []string{"agent", "llmgateway", "toolhost", "nats"} {
		c, ok := bySecret["dsh-"+svc+"-tls"]
		if !ok {
			t.Errorf("no Certificate makes dsh-%s-tls", svc)
			continue
		}
		if !slices.Equal(c.Spec.URIs, []string{"spiffe://dsh/" + svc}) || c.Spec.IssuerRef.Name != "dsh-ca" {
			t.Errorf("Certificate %s: uris %v issuer %s", c.Metadata.Name, c.Spec.URIs, c.Spec.IssuerRef.Name)
		}
		if !slices.Contains(c.Spec.DNSNames, svc) {
			t.Errorf("Certificate %s: no DNS SAN %q for clients dialing the Service", c.Metadata.Name, svc)
		}
		wantClient := svc == agentLabel
		if slices.Contains(c.Spec.Usages, "client auth") != wantClient {
			t.Errorf("Certificate %s: usages %v (client auth only for the agent)", c.Metadata.Name, c.Spec.Usages)
		}
	}
	if !slices.ContainsFunc(prod.iss, func(i issuer) bool { return i.Metadata.Name == "dsh-ca" && i.Spec.CA != nil }) {
		t.Error("no CA Issuer dsh-ca")
	}
	for name, r := range map[string]rendered{"prod": prod, "dev": render(t, "overlays/dev")} {
		made := map[string]bool{}
		for _, c := range r.certs {
			made[c.Spec.SecretName] = true
		}
		for _, s := range find[*corev1.Secret](r.objs) {
			made[s.Name] = true
		}
		for wl, pod := range podTemplates(r.objs) {
			for _, v := range pod.Spec.Volumes {
				if v.Secret != nil && strings.HasSuffix(v.Secret.SecretName, "-tls") && !made[v.Secret.SecretName] {
					t.Errorf("%s: %s mounts Secret %s, which nothing makes", name, wl, v.Secret.SecretName)
				}
			}
		}
	}
}

// peer is a client trying to open a connection.
type peer struct {
	name      string
	namespace string // "" = outside the cluster (an ipBlock source)
	labels    map[string]string
}

// allowed evaluates the NetworkPolicy ingress rules (the subset of the API
// the manifests may use; anything else is refused by the test) for a
// connection from p to a pod with labels on port.
func allowed(t *testing.T, pols []*networkingv1.NetworkPolicy, labels map[string]string, port int32, p peer) bool {
	t.Helper()
	isolated := false
	for _, pol := range pols {
		if !selects(t, &pol.Spec.PodSelector, labels) || !slices.Contains(pol.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range pol.Spec.Ingress {
			if !portMatches(rule.Ports, port) {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, from := range rule.From {
				if peerMatches(t, pol.Namespace, from, p) {
					return true
				}
			}
		}
	}
	return !isolated
}

func portMatches(ports []networkingv1.NetworkPolicyPort, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		if pp.Port == nil || (pp.Port.Type == intstr.Int && pp.Port.IntVal == port) {
			return true
		}
		if pp.Port.Type == intstr.String {
			return true // a named port: count it as open (conservative)
		}
	}
	return false
}

func peerMatches(t *testing.T, polNS string, from networkingv1.NetworkPolicyPeer, p peer) bool {
	t.Helper()
	if from.IPBlock != nil {
		return true // conservative: any address, including outside the cluster
	}
	if p.namespace == "" {
		return false
	}
	nsOK := p.namespace == polNS // a bare podSelector: the policy's namespace
	if from.NamespaceSelector != nil {
		if len(from.NamespaceSelector.MatchExpressions) > 0 {
			t.Fatalf("matchExpressions in a policy: extend the test's evaluator")
		}
		// Only a selector pinned to a namespace name excludes others: any
		// other label may be put on any namespace.
		name, pinned := from.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"]
		nsOK = !pinned || name == p.namespace
	}
	if !nsOK {
		return false
	}
	if from.PodSelector == nil {
		return true
	}
	return selects(t, from.PodSelector, p.labels)
}

func selects(t *testing.T, sel *metav1.LabelSelector, labels map[string]string) bool {
	t.Helper()
	if len(sel.MatchExpressions) > 0 {
		t.Fatalf("matchExpressions in a policy: extend the test's evaluator")
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// TestNetworkReach: the only Service reachable from outside the namespace is
// the agent's; gateway and toolhost take only agent pods; NATS takes the
// agent and declared consumers, nothing else.
func TestNetworkReach(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			r := render(t, overlay)
			checkReach(t, r.objs)
		})
	}
}

func checkReach(t *testing.T, objs []runtime.Object) {
	t.Helper()
	pols := find[*networkingv1.NetworkPolicy](objs)
	pods := podTemplates(objs)
	namespace := pols[0].Namespace // the overlay's
	peers := []peer{
		{name: "the internet", namespace: ""},
		{name: "a pod in another namespace", namespace: "elsewhere", labels: map[string]string{labelName: agentLabel, consumerKey: "true"}},
		{name: "a stranger pod in the namespace", namespace: namespace, labels: map[string]string{labelName: "stranger"}},
		{name: "an agent pod", namespace: namespace, labels: map[string]string{labelName: agentLabel}},
		{name: "a declared NATS consumer", namespace: namespace, labels: map[string]string{labelName: "tail", consumerKey: "true"}},
	}
	// Who may reach each Service (by peer name).
	everyone := []string{"the internet", "a pod in another namespace", "a stranger pod in the namespace", "an agent pod", "a declared NATS consumer"}
	want := map[string][]string{
		"agent":          everyone,
		"agent-peers":    everyone, // the replicas' headless Service: the same pods and port
		"agent-headless": everyone, // the single agent's governing Service: the same pod and port
		"llmgateway":     {"an agent pod"},
		"toolhost":       {"an agent pod"},
		"nats":           {"an agent pod", "a declared NATS consumer"},
		"nats-headless":  {"an agent pod", "a declared NATS consumer"},
	}
	seen := 0
	for _, svc := range find[*corev1.Service](objs) {
		var pod *corev1.PodTemplateSpec
		for _, p := range pods {
			if labelsMatch(svc.Spec.Selector, p.Labels) {
				pod = p
			}
		}
		if pod == nil {
			t.Fatalf("Service/%s selects no workload", svc.Name)
		}
		wantPeers, ok := want[svc.Name]
		if !ok {
			t.Errorf("Service/%s: not in the reachability table; add it", svc.Name)
			continue
		}
		seen++
		for _, sp := range svc.Spec.Ports {
			port := containerPort(pod, sp.TargetPort)
			for _, p := range peers {
				got := allowed(t, pols, pod.Labels, port, p)
				if got != slices.Contains(wantPeers, p.name) {
					t.Errorf("Service/%s port %d: %s may connect = %v, want %v", svc.Name, port, p.name, got, !got)
				}
			}
		}
	}
	for _, shape := range []string{"agent-peers", "agent-headless"} {
		if _, err := findService(objs, shape); err != nil {
			seen++ // each agent shape has one of these two
		}
	}
	if seen != len(want) {
		t.Errorf("checked %d Services, want %d", seen, len(want))
	}
}

func containerPort(pod *corev1.PodTemplateSpec, target intstr.IntOrString) int32 {
	if target.Type == intstr.Int {
		return target.IntVal
	}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == target.StrVal {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// TestReachCheckCanFail: without the policies every Service is open, and an
// allow-all rule on the toolhost is caught.
func TestReachCheckCanFail(t *testing.T) {
	objs := render(t, "overlays/prod").objs
	pols := find[*networkingv1.NetworkPolicy](objs)
	tool := map[string]string{labelName: "toolhost"}
	outsider := peer{name: "outsider", namespace: "elsewhere", labels: map[string]string{labelName: agentLabel}}
	if allowed(t, pols, tool, 7702, outsider) {
		t.Fatal("the shipped policies let another namespace's 'agent' reach the toolhost")
	}
	if !allowed(t, nil, tool, 7702, outsider) {
		t.Fatal("with no policies the evaluator must report the toolhost open")
	}
	open := &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
		PodSelector: metav1.LabelSelector{MatchLabels: tool},
		PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}}}},
	}}
	if !allowed(t, append(slices.Clone(pols), open), tool, 7702, outsider) {
		t.Fatal("an allow-from-every-namespace rule was not seen as opening the toolhost")
	}
}

// Secret heuristics over manifest text.
var (
	pemBlock   = regexp.MustCompile(`-----BEGIN [A-Z ]+-----`)
	secretKey  = regexp.MustCompile(`(?i)^\s*-?\s*"?([a-z0-9_.-]*(password|passwd|secret|token|api[_-]?key|private[_-]?key))"?\s*[:=]\s*(\S.*)$`)
	secretFlag = regexp.MustCompile(`(?i)--[a-z-]*(password|token|secret|api-key)[a-z-]*=`)
	nkeySeed   = regexp.MustCompile(`\bS[UACONP][A-Z2-7]{50,}\b`)
	jwtLiteral = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.`)
	inlineKey  = regexp.MustCompile(`(?i)[{,\s](password|passwd|token|secret)\s*[:=]\s*"?[A-Za-z0-9]`)
	// The pod field that keeps the service-account token out: a setting,
	// not a secret (only true/false are accepted).
	serviceAccountToken = regexp.MustCompile(`^\s*automountServiceAccountToken:\s*(true|false)\s*$`)
	providerKey         = regexp.MustCompile(`\b(sk-[A-Za-z0-9_-]{16,}|sk-ant-[A-Za-z0-9_-]{16,})\b`)
)

// secretFindings lists the places in one manifest file's text that look like
// a secret value. Secret objects of the base may not carry data either.
func secretFindings(t *testing.T, name string, raw []byte) []string {
	t.Helper()
	var out []string
	for i, line := range strings.Split(string(raw), "\n") {
		where := fmt.Sprintf("%s:%d", name, i+1)
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		switch {
		case pemBlock.MatchString(line):
			out = append(out, where+": a PEM block")
		case secretFlag.MatchString(line):
			out = append(out, where+": a secret in a flag value (visible in ps and the pod spec)")
		case nkeySeed.MatchString(line), jwtLiteral.MatchString(line), providerKey.MatchString(line):
			out = append(out, where+": a key, seed or token literal")
		case inlineKey.MatchString(line) && !secretKey.MatchString(line):
			out = append(out, where+": an inline password or token")
		}
		if m := secretKey.FindStringSubmatch(line); m != nil && !serviceAccountToken.MatchString(line) {
			v := strings.Trim(strings.TrimSpace(m[3]), `"'`)
			// A reference (a Secret's name or key, a file path, an env
			// var name) is fine; a literal value is not.
			if v != "" && v != "|" && !strings.HasPrefix(v, "$") && !strings.HasPrefix(v, "/") && !strings.HasPrefix(v, "{") {
				if !strings.Contains(trimmed, "secretName") && !isReference(raw, i) {
					out = append(out, where+": "+m[1]+" has a literal value")
				}
			}
		}
	}
	for _, doc := range documents(t, raw) {
		var s struct {
			Kind       string            `json:"kind"`
			Data       map[string]string `json:"data"`
			StringData map[string]string `json:"stringData"`
		}
		if err := yaml.Unmarshal(doc, &s); err == nil && s.Kind == "Secret" && len(s.Data)+len(s.StringData) > 0 {
			out = append(out, name+": a Secret with inline data")
		}
	}
	return out
}

// isReference reports whether the key on line i sits under a secretKeyRef,
// secretRef or configMapKeyRef (a name, not a value).
func isReference(raw []byte, i int) bool {
	lines := strings.Split(string(raw), "\n")
	for j := i - 1; j >= 0 && j >= i-3; j-- {
		l := strings.TrimSpace(lines[j])
		if strings.HasPrefix(l, "secretKeyRef:") || strings.HasPrefix(l, "secretRef:") || strings.HasPrefix(l, "configMapKeyRef:") {
			return true
		}
	}
	return false
}

// TestNoSecretValuesInManifests: no manifest file in the repository, and
// nothing the prod overlay renders, holds a secret value: no PEM blocks, no
// password/token literals, no seeds or keys, no Secret with inline data.
// Secrets come only from Secrets created outside git (cert-manager, the
// operator, or the git-ignored files of the plain-Secret component).
func TestNoSecretValuesInManifests(t *testing.T) {
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml") || strings.HasSuffix(p, ".env")) {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, f := range secretFindings(t, p, raw) {
			t.Error(f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	prod := render(t, "overlays/prod")
	for _, f := range secretFindings(t, "prod (rendered)", prod.yaml) {
		t.Error(f)
	}
	for wl, pod := range podTemplates(prod.objs) {
		for _, c := range pod.Spec.Containers {
			for _, e := range c.Env {
				if secretKey.MatchString(e.Name+": x") && e.ValueFrom == nil {
					t.Errorf("%s: env %s has a literal value; use secretKeyRef", wl, e.Name)
				}
			}
		}
	}
}

// TestSecretHeuristicsCatch proves the heuristics can fail.
func TestSecretHeuristicsCatch(t *testing.T) {
	bad := map[string]string{
		"pem":          "data:\n  ca: |\n    -----BEGIN CERTIFICATE-----\n",
		"password":     "env:\n  - name: X\n    value: y\nauth:\n  password: hunter2\n",
		"token flag":   "args:\n  - --token=abc123\n",
		"nats conf":    "nats.conf: |\n  authorization { user: a, password: s3cret }\n",
		"inline data":  "apiVersion: v1\nkind: Secret\nmetadata:\n  name: x\nstringData:\n  a: b\n",
		"nkey seed":    "seed: SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY\n",
		"provider key": "value: sk-ant-0123456789abcdefghij\n",
	}
	for name, text := range bad {
		if len(secretFindings(t, name, []byte(text))) == 0 {
			t.Errorf("%s: not caught:\n%s", name, text)
		}
	}
	good := "env:\n  - name: DSH_NATS_PASSWORD\n    valueFrom:\n      secretKeyRef:\n        name: nats\n        key: password\n"
	if f := secretFindings(t, "good", []byte(good)); len(f) != 0 {
		t.Errorf("a secretKeyRef was flagged: %v", f)
	}
}

// TestToolhostHoldsNoAgentSecrets: no workload but the agent's mounts the agent's
// certificate or NATS seed, so a tool cannot borrow the agent's identity.
func TestToolhostHoldsNoAgentSecrets(t *testing.T) {
	for _, d := range find[*appsv1.Deployment](render(t, "overlays/prod").objs) {
		if d.Spec.Template.Labels[labelName] == agentLabel {
			continue // the agent replicas themselves
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil && (v.Secret.SecretName == "dsh-agent-tls" || v.Secret.SecretName == "dsh-agent-nats") {
				t.Errorf("Deployment/%s mounts the agent's Secret %s", d.Name, v.Secret.SecretName)
			}
		}
	}
}
