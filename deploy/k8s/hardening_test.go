package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

// dshImage is the one image of the three dsh services.
const dshImage = "ghcr.io/dsh-dev/dsh"

// drainMargin is what the pod's grace period must leave beyond the agent's
// --drain-timeout (the gRPC stop, the NATS flush, the exit).
const drainMargin = 5 * time.Second

// workload is a pod template with its owner's name.
type workload struct {
	name string
	pod  *corev1.PodTemplateSpec
	sts  *appsv1.StatefulSet // nil for a Deployment
}

func workloads(objs []runtime.Object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{name: key(o), pod: &v.Spec.Template})
		case *appsv1.StatefulSet:
			out = append(out, workload{name: key(o), pod: &v.Spec.Template, sts: v})
		}
	}
	slices.SortFunc(out, func(a, b workload) int { return strings.Compare(a.name, b.name) })
	return out
}

func workloadOf(objs []runtime.Object, role string) (workload, bool) {
	for _, w := range workloads(objs) {
		if w.pod.Labels[labelName] == role {
			return w, true
		}
	}
	return workload{}, false
}

// checkHardening returns what keeps a rendered overlay from running as
// issue 21 wants it: every pod passes Pod Security "restricted" (checked by
// Kubernetes' own admission library) in a namespace that enforces it, with
// a read-only root, a writable /tmp, no service-account token, requests and
// limits of CPU, memory and ephemeral storage, readiness and liveness
// probes, pinned images (the dsh ones one tag) pulled by an explicit
// policy; the gateway and toolhost behind headless Services the agent dials
// round-robin; sessions working in the toolhost's persistent workspace; a
// drain budget inside the grace period; NATS hardened and sized to its
// volume; and, in prod, real providers required and OTLP for every service.
func checkHardening(t *testing.T, objs []runtime.Object, prod bool) []string {
	t.Helper()
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }

	nss := find[*corev1.Namespace](objs)
	for _, ns := range nss {
		if ns.Labels[psaapi.EnforceLevelLabel] != string(psaapi.LevelRestricted) {
			fail("Namespace/%s: label %s=%q, want restricted", ns.Name, psaapi.EnforceLevelLabel, ns.Labels[psaapi.EnforceLevelLabel])
		}
	}
	if len(nss) != 1 {
		fail("%d Namespaces rendered, want the overlay's one", len(nss))
	}

	eval, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	restricted := psaapi.LevelVersion{Level: psaapi.LevelRestricted, Version: psaapi.LatestVersion()}
	dshTags := map[string]bool{}
	for _, w := range workloads(objs) {
		spec := &w.pod.Spec
		for _, r := range eval.EvaluatePod(restricted, &w.pod.ObjectMeta, spec) {
			if !r.Allowed {
				fail("%s: Pod Security restricted: %s (%s)", w.name, r.ForbiddenReason, r.ForbiddenDetail)
			}
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			fail("%s: automountServiceAccountToken must be false (no dsh pod calls the Kubernetes API)", w.name)
		}
		for _, c := range spec.Containers {
			who := w.name + "/" + c.Name
			checkImage(who, c, dshTags, fail)
			checkContainer(who, w, c, fail)
		}
	}
	if len(dshTags) != 1 {
		fail("the dsh services run %d image versions %v, want one", len(dshTags), dshTags)
	}
	checkBalancing(objs, fail)
	checkWorkspace(objs, fail)
	checkDrain(t, objs, fail)
	checkNATS(t, objs, fail)
	if prod {
		checkProd(t, objs, fail)
	}
	return bad
}

var (
	digestRef = regexp.MustCompile(`@sha256:[0-9a-f]{64}$`)
	tagRef    = regexp.MustCompile(`^[^@]+:([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$`)
)

func checkImage(who string, c corev1.Container, dshTags map[string]bool, fail func(string, ...any)) {
	tag := ""
	switch {
	case digestRef.MatchString(c.Image):
		tag = c.Image[strings.Index(c.Image, "@"):]
	case tagRef.MatchString(c.Image) && !strings.Contains(c.Image[strings.LastIndex(c.Image, "/")+1:], "@"):
		tag = tagRef.FindStringSubmatch(c.Image)[1]
		// A tag that moves: latest, or a major/minor line like 2.15.
		if tag == "latest" || regexp.MustCompile(`^v?\d+(\.\d+)?(-[a-z]+)?$`).MatchString(tag) {
			fail("%s: image %s is not pinned (a tag that moves); pin a release or a digest", who, c.Image)
		}
	default:
		fail("%s: image %s has no tag or digest (that is :latest)", who, c.Image)
	}
	if strings.HasPrefix(c.Image, dshImage+":") || strings.HasPrefix(c.Image, dshImage+"@") {
		dshTags[tag] = true
	}
	if c.ImagePullPolicy == "" {
		fail("%s: imagePullPolicy not set", who)
	}
}

func checkContainer(who string, w workload, c corev1.Container, fail func(string, ...any)) {
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		fail("%s: the root filesystem must be read-only", who)
	}
	if m := mountAt(w.pod, c, "/tmp"); m == nil || m.EmptyDir == nil || m.EmptyDir.SizeLimit == nil {
		fail("%s: /tmp must be a writable emptyDir with a sizeLimit (the root is read-only)", who)
	}
	for _, v := range w.pod.Spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.SizeLimit == nil {
			fail("%s: emptyDir %s has no sizeLimit", who, v.Name)
		}
	}
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := c.Resources.Requests[res]; !ok || q.IsZero() {
			fail("%s: no %s request", who, res)
		}
		if q, ok := c.Resources.Limits[res]; !ok || q.IsZero() {
			fail("%s: no %s limit", who, res)
		}
	}
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		fail("%s: readiness and liveness probes are required", who)
	}
}

// mountAt returns the volume mounted at path in c.
func mountAt(pod *corev1.PodTemplateSpec, c corev1.Container, path string) *corev1.VolumeSource {
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) != path || m.ReadOnly {
			continue
		}
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				return &v.VolumeSource
			}
		}
	}
	return nil
}

// checkBalancing: the gateway and the toolhost sit behind headless Services
// the agent dials with dns:///, so round_robin sees every pod; every
// StatefulSet's serviceName is a headless Service over its pods; every
// server ends connections after a maximum age.
func checkBalancing(objs []runtime.Object, fail func(string, ...any)) {
	agent, ok := workloadOf(objs, agentLabel)
	if !ok {
		fail("no agent workload")
		return
	}
	f := flagsOfQuiet(agent.pod.Spec.Containers[0])
	dials := map[string]string{"llmgateway": first(f["gateway"])}
	for _, th := range f["toolhost"] {
		if name, addr, ok := strings.Cut(th, "="); ok && name == "builtin" {
			dials["toolhost"] = addr
		}
	}
	for role, addr := range dials {
		svc, err := findService(objs, role)
		if err != nil {
			fail("%v", err)
			continue
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			fail("Service/%s: clusterIP %q, want None (headless: one address per pod for round_robin)", role, svc.Spec.ClusterIP)
		}
		if want := "dns:///" + role + ":"; !strings.HasPrefix(addr, want) {
			fail("agent dials %s at %q, want %s<port> (every pod)", role, addr, want)
		}
	}
	checkPrefixCache(objs, fail)
	for _, w := range workloads(objs) {
		if w.sts != nil {
			svc, err := findService(objs, w.sts.Spec.ServiceName)
			if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || !labelsMatch(svc.Spec.Selector, w.pod.Labels) {
				fail("%s: serviceName %q is not a headless Service over its pods", w.name, w.sts.Spec.ServiceName)
			}
		}
		c := w.pod.Spec.Containers[0]
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "grpc" }) {
			if age := first(flagsOfQuiet(c)["max-connection-age"]); age == "" || age == "0" || age == "0s" {
				fail("%s: --max-connection-age unset: clients would never move to new replicas", w.name)
			}
		}
	}
}

// checkPrefixCache: the gateway's remembered conversations are on (the
// agent picks gateway replicas by session, so each replica's cache serves
// its sessions' steps) and bounded to at most a quarter of the container's
// memory limit (the bound counts wire bytes; decoded messages take a small
// multiple of them on the heap).
func checkPrefixCache(objs []runtime.Object, fail func(string, ...any)) {
	deps := find[*appsv1.Deployment](objs)
	i := slices.IndexFunc(deps, func(d *appsv1.Deployment) bool { return d.Name == "llmgateway" })
	if i < 0 {
		fail("no Deployment/llmgateway")
		return
	}
	c := deps[i].Spec.Template.Spec.Containers[0]
	mib := first(flagsOfQuiet(c)["prefix-cache-mib"])
	if e := envOf(c, "DSH_LLM_PREFIX_CACHE_MIB"); mib == "" && e != nil {
		mib = e.Value
	}
	n, err := strconv.Atoi(mib)
	if err != nil || n <= 0 {
		fail("Deployment/llmgateway: prefix cache %q: want a bound in MiB, on (session-affine replicas keep their sessions' conversations)", mib)
		return
	}
	limit := c.Resources.Limits.Memory()
	if limit.IsZero() || int64(n)<<20*4 > limit.Value() {
		fail("Deployment/llmgateway: prefix cache %d MiB above a quarter of the memory limit %s", n, limit)
	}
}

// checkWorkspace: sessions work in the toolhost's workspace, a volume that
// survives rollouts; the agent's default cwd lies in it.
func checkWorkspace(objs []runtime.Object, fail func(string, ...any)) {
	th, ok := workloadOf(objs, "toolhost")
	agent, ok2 := workloadOf(objs, agentLabel)
	if !ok || !ok2 {
		fail("no toolhost or agent workload")
		return
	}
	c := th.pod.Spec.Containers[0]
	ws := first(flagsOfQuiet(c)["workspace"])
	if ws == "" {
		fail("%s: --workspace unset", th.name)
		return
	}
	var claim string
	for _, m := range c.VolumeMounts {
		if filepath.Clean(m.MountPath) == filepath.Clean(ws) {
			claim = m.Name
		}
	}
	persistent := th.sts != nil && slices.ContainsFunc(th.sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == claim })
	if !persistent {
		for _, v := range th.pod.Spec.Volumes {
			if v.Name == claim && v.PersistentVolumeClaim != nil {
				persistent = true
			}
		}
	}
	if claim == "" || !persistent {
		fail("%s: the workspace %s is not on a persistent volume (lost on every rollout)", th.name, ws)
	}
	cwd := first(flagsOfQuiet(agent.pod.Spec.Containers[0])["default-cwd"])
	if rel, err := filepath.Rel(ws, cwd); cwd == "" || err != nil || strings.HasPrefix(rel, "..") {
		fail("%s: --default-cwd %q is not inside the toolhost's workspace %s", agent.name, cwd, ws)
	}
}

// checkDrain: the agent's drain budget fits its grace period.
func checkDrain(t *testing.T, objs []runtime.Object, fail func(string, ...any)) {
	t.Helper()
	agent, ok := workloadOf(objs, agentLabel)
	if !ok {
		return
	}
	d, err := time.ParseDuration(first(flagsOfQuiet(agent.pod.Spec.Containers[0])["drain-timeout"]))
	grace := agent.pod.Spec.TerminationGracePeriodSeconds
	switch {
	case err != nil:
		fail("%s: --drain-timeout missing or bad: %v", agent.name, err)
	case grace == nil:
		fail("%s: terminationGracePeriodSeconds unset", agent.name)
	case d+drainMargin > time.Duration(*grace)*time.Second:
		fail("%s: --drain-timeout %v does not fit the %ds grace period with %v to spare (the kubelet would kill running turns)", agent.name, d, *grace, drainMargin)
	}
}

// checkNATS: pinned to the tested server release, non-root like every pod,
// a startup probe, the monitor on loopback only, max_payload and stream
// limits sized to the agent and the volume.
func checkNATS(t *testing.T, objs []runtime.Object, fail func(string, ...any)) {
	t.Helper()
	w, ok := workloadOf(objs, "nats")
	if !ok || w.sts == nil {
		fail("no NATS StatefulSet")
		return
	}
	c := w.pod.Spec.Containers[0]
	if want := "nats:" + natsServerVersion(t) + "-alpine"; c.Image != want {
		fail("%s: image %s, want %s (the release go.mod tests the config against)", w.name, c.Image, want)
	}
	if c.StartupProbe == nil {
		fail("%s: no startupProbe (liveness would kill a long JetStream recovery)", w.name)
	}
	for _, p := range c.Ports {
		if p.ContainerPort == 8222 {
			fail("%s: the monitor port is declared (exposed beyond the pod)", w.name)
		}
	}
	conf := natsConfOf(objs)
	if !regexp.MustCompile(`(?m)^\s*http:\s*"127\.0\.0\.1:\d+"`).MatchString(conf) || regexp.MustCompile(`(?m)^\s*http_port:`).MatchString(conf) {
		fail("nats.conf: the monitor must listen on 127.0.0.1 only")
	}
	if m := regexp.MustCompile(`(?m)^\s*max_payload:\s*(\S+)`).FindStringSubmatch(conf); m == nil || natsSize(m[1]) != 4<<20 {
		fail("nats.conf: max_payload must be 4MB, the agent's largest request")
	}
	m := regexp.MustCompile(`(?m)^\s*max_file_store:\s*(\S+)`).FindStringSubmatch(conf)
	var store int64
	if m != nil {
		store = natsSize(m[1])
	}
	var pvc int64
	for _, p := range w.sts.Spec.VolumeClaimTemplates {
		q := p.Spec.Resources.Requests[corev1.ResourceStorage]
		pvc = q.Value()
	}
	if store <= 0 || store >= pvc {
		fail("nats.conf: max_file_store %d must be set and under the %d-byte volume", store, pvc)
	}
	agent, ok := workloadOf(objs, agentLabel)
	if !ok {
		return
	}
	f := flagsOfQuiet(agent.pod.Spec.Containers[0])
	mb, _ := strconv.ParseInt(first(f["nats-stream-max-bytes"]), 10, 64)
	if mb <= 0 || mb > store {
		fail("%s: --nats-stream-max-bytes %d must be set and within max_file_store %d", agent.name, mb, store)
	}
	if first(f["nats-stream-max-age"]) == "" {
		fail("%s: --nats-stream-max-age unset", agent.name)
	}
}

// natsSize parses a nats.conf size (4MB, 9G, 1024).
func natsSize(s string) int64 {
	s = strings.Trim(s, `"`)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GB", 1 << 30}, {"G", 1 << 30}, {"MB", 1 << 20}, {"M", 1 << 20}, {"KB", 1 << 10}, {"K", 1 << 10}} {
		if strings.HasSuffix(strings.ToUpper(s), u.suffix) {
			s, mult = s[:len(s)-len(u.suffix)], u.m
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return -1
	}
	return n * mult
}

func natsConfOf(objs []runtime.Object) string {
	for _, cm := range find[*corev1.ConfigMap](objs) {
		if c, ok := cm.Data["nats.conf"]; ok {
			return c
		}
	}
	return ""
}

// natsServerVersion is the nats-server release in go.mod (without the v).
func natsServerVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`github\.com/nats-io/nats-server/v2 v(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no nats-server")
	}
	return string(m[1])
}

// checkProd: real providers only, keys from a required Secret, OTLP for
// every dsh service.
func checkProd(t *testing.T, objs []runtime.Object, fail func(string, ...any)) {
	t.Helper()
	gw, ok := workloadOf(objs, "llmgateway")
	if !ok {
		fail("no gateway")
		return
	}
	c := gw.pod.Spec.Containers[0]
	f := flagsOfQuiet(c)
	if len(f["require-provider"]) == 0 {
		fail("%s: no --require-provider: a missing key Secret would leave only the scripted route", gw.name)
	}
	if first(f["scripted"]) != "false" {
		fail("%s: the scripted route is on in prod (--scripted=false)", gw.name)
	}
	keys := false
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil && e.SecretRef.Name == "dsh-provider-keys" {
			keys = e.SecretRef.Optional == nil || !*e.SecretRef.Optional
		}
	}
	if !keys {
		fail("%s: the Secret dsh-provider-keys must be required, not optional", gw.name)
	}
	for _, role := range []string{agentLabel, "llmgateway", "toolhost"} {
		w, ok := workloadOf(objs, role)
		if !ok {
			fail("no %s workload", role)
			continue
		}
		if e := envOf(w.pod.Spec.Containers[0], "OTEL_EXPORTER_OTLP_ENDPOINT"); e == nil || e.Value == "" {
			fail("%s: no OTEL_EXPORTER_OTLP_ENDPOINT", w.name)
		}
	}
}

// flagsOfQuiet is flagsOf without the $(VAR) check (TestServersUseTLS
// makes it).
func flagsOfQuiet(c corev1.Container) map[string][]string {
	out := map[string][]string{}
	for _, a := range c.Args {
		if name, val, ok := strings.Cut(strings.TrimPrefix(a, "--"), "="); ok && strings.HasPrefix(a, "--") {
			out[name] = append(out[name], val)
		}
	}
	return out
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestHardening: both overlays pass checkHardening.
func TestHardening(t *testing.T) {
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			for _, b := range checkHardening(t, render(t, overlay).objs, overlay == "overlays/prod") {
				t.Error(b)
			}
		})
	}
}

// TestImagesSetInOnePlace: the base names the dsh image without a tag and
// each overlay pins it once in its images: list, so no manifest can carry a
// second version.
func TestImagesSetInOnePlace(t *testing.T) {
	for _, overlay := range overlays {
		b, err := os.ReadFile(filepath.Join(overlay, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k struct {
			Images []struct {
				Name, NewTag, Digest string
			} `json:"images"`
		}
		if err := yaml.Unmarshal(b, &k); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(k.Images, func(im struct{ Name, NewTag, Digest string }) bool { return im.Name == dshImage })
		if i < 0 || (k.Images[i].NewTag == "" && k.Images[i].Digest == "") || k.Images[i].NewTag == "latest" {
			t.Errorf("%s: images: must pin %s (newTag or digest), got %+v", overlay, dshImage, k.Images)
		}
	}
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") || strings.HasPrefix(p, "overlays/") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "image: "+dshImage) && strings.TrimSpace(line) != "image: "+dshImage {
				t.Errorf("%s:%d: %s carries its own tag; the overlays' images: set it", p, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestHardeningCheckCanFail: each broken variant of the prod overlay is
// rejected by checkHardening.
func TestHardeningCheckCanFail(t *testing.T) {
	container := func(objs []runtime.Object, role string) *corev1.Container {
		w, _ := workloadOf(objs, role)
		return &w.pod.Spec.Containers[0]
	}
	podOf := func(objs []runtime.Object, role string) *corev1.PodSpec {
		w, _ := workloadOf(objs, role)
		return &w.pod.Spec
	}
	setArg := func(c *corev1.Container, name, val string) {
		c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--"+name+"=") })
		if val != "" {
			c.Args = append(c.Args, "--"+name+"="+val)
		}
	}
	yes, no := true, false
	mutations := map[string]func(objs []runtime.Object) []runtime.Object{
		"root user": func(objs []runtime.Object) []runtime.Object {
			root := int64(0)
			podOf(objs, "toolhost").SecurityContext.RunAsUser = &root
			return objs
		},
		"capabilities kept": func(objs []runtime.Object) []runtime.Object {
			container(objs, "toolhost").SecurityContext.Capabilities.Drop = nil
			return objs
		},
		"SYS_ADMIN added": func(objs []runtime.Object) []runtime.Object {
			container(objs, "toolhost").SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
			return objs
		},
		"no seccomp": func(objs []runtime.Object) []runtime.Object {
			podOf(objs, "nats").SecurityContext.SeccompProfile = nil
			return objs
		},
		"privilege escalation": func(objs []runtime.Object) []runtime.Object {
			container(objs, "llmgateway").SecurityContext.AllowPrivilegeEscalation = &yes
			return objs
		},
		"writable root": func(objs []runtime.Object) []runtime.Object {
			container(objs, agentLabel).SecurityContext.ReadOnlyRootFilesystem = &no
			return objs
		},
		"no /tmp": func(objs []runtime.Object) []runtime.Object {
			c := container(objs, "llmgateway")
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" })
			return objs
		},
		"unbounded emptyDir": func(objs []runtime.Object) []runtime.Object {
			for i := range podOf(objs, agentLabel).Volumes {
				if v := &podOf(objs, agentLabel).Volumes[i]; v.EmptyDir != nil {
					v.EmptyDir.SizeLimit = nil
				}
			}
			return objs
		},
		"service-account token": func(objs []runtime.Object) []runtime.Object {
			podOf(objs, "llmgateway").AutomountServiceAccountToken = nil
			return objs
		},
		"namespace not enforcing": func(objs []runtime.Object) []runtime.Object {
			find[*corev1.Namespace](objs)[0].Labels[psaapi.EnforceLevelLabel] = "baseline"
			return objs
		},
		"no CPU limit": func(objs []runtime.Object) []runtime.Object {
			delete(container(objs, "toolhost").Resources.Limits, corev1.ResourceCPU)
			return objs
		},
		"no ephemeral-storage request": func(objs []runtime.Object) []runtime.Object {
			delete(container(objs, "nats").Resources.Requests, corev1.ResourceEphemeralStorage)
			return objs
		},
		"no liveness probe": func(objs []runtime.Object) []runtime.Object {
			container(objs, "llmgateway").LivenessProbe = nil
			return objs
		},
		":latest": func(objs []runtime.Object) []runtime.Object {
			container(objs, "toolhost").Image = dshImage + ":latest"
			return objs
		},
		"untagged": func(objs []runtime.Object) []runtime.Object {
			container(objs, "toolhost").Image = dshImage
			return objs
		},
		"moving minor tag": func(objs []runtime.Object) []runtime.Object {
			container(objs, "nats").Image = "nats:2.15-alpine"
			return objs
		},
		"two dsh versions": func(objs []runtime.Object) []runtime.Object {
			container(objs, "llmgateway").Image = dshImage + ":0.1.9"
			return objs
		},
		"no pull policy": func(objs []runtime.Object) []runtime.Object {
			container(objs, agentLabel).ImagePullPolicy = ""
			return objs
		},
		"gateway behind a ClusterIP": func(objs []runtime.Object) []runtime.Object {
			svc, _ := findService(objs, "llmgateway")
			svc.Spec.ClusterIP = ""
			return objs
		},
		"agent dials the gateway without dns:///": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, agentLabel), "gateway", "llmgateway:7701")
			return objs
		},
		"no max connection age": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, "llmgateway"), "max-connection-age", "0")
			return objs
		},
		"workspace on an emptyDir": func(objs []runtime.Object) []runtime.Object {
			w, _ := workloadOf(objs, "toolhost")
			w.sts.Spec.VolumeClaimTemplates = nil
			w.pod.Spec.Volumes = append(w.pod.Spec.Volumes, corev1.Volume{Name: "workspace", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(1<<30, resource.BinarySI)}}})
			return objs
		},
		"default cwd outside the workspace": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, agentLabel), "default-cwd", "/")
			return objs
		},
		"no default cwd": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, agentLabel), "default-cwd", "")
			return objs
		},
		"drain over the grace period": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, agentLabel), "drain-timeout", "58s")
			return objs
		},
		"NATS monitor port declared": func(objs []runtime.Object) []runtime.Object {
			c := container(objs, "nats")
			c.Ports = append(c.Ports, corev1.ContainerPort{Name: "monitor", ContainerPort: 8222})
			return objs
		},
		"NATS without startupProbe": func(objs []runtime.Object) []runtime.Object {
			container(objs, "nats").StartupProbe = nil
			return objs
		},
		"NATS monitor on every interface": func(objs []runtime.Object) []runtime.Object {
			for _, cm := range find[*corev1.ConfigMap](objs) {
				if c, ok := cm.Data["nats.conf"]; ok {
					cm.Data["nats.conf"] = strings.Replace(c, `http: "127.0.0.1:8222"`, "http_port: 8222", 1)
				}
			}
			return objs
		},
		"stream over the store": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, agentLabel), "nats-stream-max-bytes", strconv.FormatInt(20<<30, 10))
			return objs
		},
		"provider keys optional": func(objs []runtime.Object) []runtime.Object {
			container(objs, "llmgateway").EnvFrom[0].SecretRef.Optional = &yes
			return objs
		},
		"scripted route on": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, "llmgateway"), "scripted", "")
			return objs
		},
		"prefix cache off": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, "llmgateway"), "prefix-cache-mib", "0")
			return objs
		},
		"prefix cache above the memory limit": func(objs []runtime.Object) []runtime.Object {
			setArg(container(objs, "llmgateway"), "prefix-cache-mib", "256")
			return objs
		},
		"no OTLP on the toolhost": func(objs []runtime.Object) []runtime.Object {
			c := container(objs, "toolhost")
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "OTEL_EXPORTER_OTLP_ENDPOINT" })
			return objs
		},
	}
	prod := render(t, "overlays/prod").objs
	if bad := checkHardening(t, prod, true); len(bad) > 0 {
		t.Fatalf("the shipped prod overlay fails: %v", bad)
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			objs := make([]runtime.Object, len(prod))
			for i, o := range prod {
				objs[i] = o.DeepCopyObject()
			}
			if bad := checkHardening(t, mutate(objs), true); len(bad) == 0 {
				t.Fatal("not caught")
			}
		})
	}
}

// TestDockerfileMatchesManifests: the image runs as the user the dsh pods
// declare (runAsUser) and works in the toolhost's workspace directory.
func TestDockerfileMatchesManifests(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var user, workdir string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "USER "); ok {
			user = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "WORKDIR "); ok {
			workdir = strings.TrimSpace(v) // the last stage's wins
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Fatalf("Dockerfile USER %q: want a numeric non-root uid", user)
	}
	for _, overlay := range overlays {
		objs := render(t, overlay).objs
		for _, role := range []string{agentLabel, "llmgateway", "toolhost"} {
			w, _ := workloadOf(objs, role)
			sc := w.pod.Spec.SecurityContext
			if sc == nil || sc.RunAsUser == nil || strconv.FormatInt(*sc.RunAsUser, 10) != uid {
				t.Errorf("%s %s: runAsUser differs from the Dockerfile's USER %s", overlay, w.name, user)
			}
		}
		th, _ := workloadOf(objs, "toolhost")
		if ws := first(flagsOfQuiet(th.pod.Spec.Containers[0])["workspace"]); ws != workdir {
			t.Errorf("%s: the toolhost's workspace %q is not the image's WORKDIR %q", overlay, ws, workdir)
		}
	}
}
