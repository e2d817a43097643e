package k8s

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// findService returns the Service named name.
func findService(objs []runtime.Object, name string) (*corev1.Service, error) {
	for _, s := range find[*corev1.Service](objs) {
		if s.Name == name {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no Service/%s", name)
}

// envOf returns the container's env var name, or nil.
func envOf(c corev1.Container, name string) *corev1.EnvVar {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return nil
	}
	return &c.Env[i]
}

// checkAgentReplicas returns what is wrong with the scaled-out agent of a
// rendered overlay (issue 18): a Deployment of `replicas` pods on the
// postgres store whose DSN comes only from a Secret, advertising its pod IP
// to peers, ready only while its gRPC health (store and lease health) says
// so, a headless Service over its pods, a PodDisruptionBudget that lets at
// most one replica go at a time, and a NetworkPolicy that lets agent pods
// reach each other on the gRPC port on its own.
func checkAgentReplicas(t *testing.T, objs []runtime.Object, replicas int32) []string {
	t.Helper()
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	dep := agentDeployment(objs)
	if dep == nil {
		return []string{"no Deployment/agent"}
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != replicas {
		fail("Deployment/agent: replicas %v, want %d", dep.Spec.Replicas, replicas)
	}
	if slices.ContainsFunc(find[*appsv1.StatefulSet](objs), func(s *appsv1.StatefulSet) bool { return s.Name == "agent" }) {
		fail("both a StatefulSet and a Deployment named agent")
	}
	pod := &dep.Spec.Template
	c := pod.Spec.Containers[0]
	f := flagsOf(t, "Deployment/agent", c)
	if st := f["store"]; !slices.Equal(st, []string{"postgres"}) {
		if e := envOf(c, "DSH_STORE"); e == nil || e.Value != "postgres" || len(st) > 0 {
			fail("Deployment/agent: store %v, want postgres", st)
		}
	}
	if _, ok := f["postgres-dsn"]; ok {
		fail("Deployment/agent: --postgres-dsn on the command line (visible in ps and the manifest); use DSH_POSTGRES_DSN from a Secret")
	}
	if e := envOf(c, "DSH_POSTGRES_DSN"); e == nil || e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" {
		fail("Deployment/agent: DSH_POSTGRES_DSN must come from a secretKeyRef, got %+v", e)
	}
	// Peers reach the owner at its pod IP (downward API).
	adv := f["advertise"]
	ip := envOf(c, "POD_IP")
	if len(adv) != 1 || !strings.HasPrefix(adv[0], "$(POD_IP):") || ip == nil || ip.ValueFrom == nil || ip.ValueFrom.FieldRef == nil || ip.ValueFrom.FieldRef.FieldPath != "status.podIP" {
		fail("Deployment/agent: --advertise %v must be $(POD_IP):<port> with POD_IP from status.podIP", adv)
	} else if port, _ := strconv.Atoi(strings.TrimPrefix(adv[0], "$(POD_IP):")); !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return int(p.ContainerPort) == port && p.Name == "grpc" }) {
		fail("Deployment/agent: --advertise port %d is not the grpc container port", port)
	}
	if pa := f["peer-authority"]; len(pa) != 1 || pa[0] == "" {
		fail("Deployment/agent: --peer-authority missing: a peer's pod IP is not a name on its certificate")
	}
	// Readiness is the agent's gRPC health on its --health-listen port.
	var healthPort int
	if hl := f["health-listen"]; len(hl) == 1 {
		_, p, _ := strings.Cut(hl[0], ":")
		healthPort, _ = strconv.Atoi(p)
	}
	if r := c.ReadinessProbe; healthPort == 0 || r == nil || r.GRPC == nil || int(r.GRPC.Port) != healthPort {
		fail("Deployment/agent: readiness must be a gRPC probe on the --health-listen port (%d), got %+v", healthPort, r)
	}
	// A headless Service over exactly these pods, on the gRPC port.
	if svc, err := findService(objs, "agent-peers"); err != nil {
		fail("%v", err)
	} else {
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			fail("Service/agent-peers: clusterIP %q, want None (headless)", svc.Spec.ClusterIP)
		}
		if !labelsMatch(svc.Spec.Selector, pod.Labels) {
			fail("Service/agent-peers does not select the agent pods")
		}
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.TargetPort.String() == "grpc" }) {
			fail("Service/agent-peers does not target the grpc port")
		}
	}
	// A disruption budget keeps all but one replica up during drains.
	pdbOK := false
	for _, p := range find[*policyv1.PodDisruptionBudget](objs) {
		if p.Spec.Selector == nil || !labelsMatch(p.Spec.Selector.MatchLabels, pod.Labels) {
			continue
		}
		switch {
		case p.Spec.MaxUnavailable != nil:
			pdbOK = p.Spec.MaxUnavailable.IntValue() == 1
		case p.Spec.MinAvailable != nil:
			pdbOK = p.Spec.MinAvailable.IntValue() == int(replicas)-1
		}
	}
	if !pdbOK {
		fail("no PodDisruptionBudget over the agent pods allowing exactly one disruption")
	}
	// Agent pods reach each other on the gRPC port through their own rule:
	// remove the clients' rule and they still do.
	var own []*networkingv1.NetworkPolicy
	for _, p := range find[*networkingv1.NetworkPolicy](objs) {
		if p.Name != "agent-clients" {
			own = append(own, p)
		}
	}
	agentPeer := peer{name: "an agent pod", namespace: namespace, labels: map[string]string{labelName: agentLabel}}
	stranger := peer{name: "a stranger pod", namespace: namespace, labels: map[string]string{labelName: "stranger"}}
	if !allowed(t, own, pod.Labels, 7700, agentPeer) {
		fail("no NetworkPolicy but agent-clients lets agent pods reach each other on 7700")
	}
	if allowed(t, own, pod.Labels, 7700, stranger) {
		fail("the agent-peers NetworkPolicy lets any pod in")
	}
	return bad
}

// TestAgentReplicas: prod runs three agent replicas on PostgreSQL as
// described by checkAgentReplicas; dev keeps the single SQLite StatefulSet.
func TestAgentReplicas(t *testing.T) {
	for _, b := range checkAgentReplicas(t, render(t, "overlays/prod").objs, 3) {
		t.Error("prod: " + b)
	}
	dev := render(t, "overlays/dev").objs
	sts := find[*appsv1.StatefulSet](dev)
	i := slices.IndexFunc(sts, func(s *appsv1.StatefulSet) bool { return s.Name == "agent" })
	if i < 0 || sts[i].Spec.Replicas == nil || *sts[i].Spec.Replicas != 1 {
		t.Fatalf("dev: want the agent as a one-replica StatefulSet")
	}
	f := flagsOf(t, "dev agent", sts[i].Spec.Template.Spec.Containers[0])
	if st := f["store"]; len(st) > 0 && st[0] == "postgres" {
		t.Errorf("dev: the single-node agent runs --store %v", st)
	}
}

// TestAgentReplicasCheckCanFail: each broken variant of the prod agent is
// caught.
func TestAgentReplicasCheckCanFail(t *testing.T) {
	mutations := map[string]func(objs []runtime.Object) []runtime.Object{
		"two replicas": func(objs []runtime.Object) []runtime.Object {
			d := agentDeployment(objs)
			n := int32(2)
			d.Spec.Replicas = &n
			return objs
		},
		"inline DSN": func(objs []runtime.Object) []runtime.Object {
			c := &agentDeployment(objs).Spec.Template.Spec.Containers[0]
			e := envOf(*c, "DSH_POSTGRES_DSN")
			c.Env[slices.IndexFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name })] = corev1.EnvVar{Name: "DSH_POSTGRES_DSN", Value: "postgres://dsh:hunter2@db/dsh"}
			return objs
		},
		"DSN flag": func(objs []runtime.Object) []runtime.Object {
			c := &agentDeployment(objs).Spec.Template.Spec.Containers[0]
			c.Args = append(c.Args, "--postgres-dsn=postgres://db/dsh")
			return objs
		},
		"sqlite store": func(objs []runtime.Object) []runtime.Object {
			c := &agentDeployment(objs).Spec.Template.Spec.Containers[0]
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--store=") })
			return objs
		},
		"TCP readiness": func(objs []runtime.Object) []runtime.Object {
			c := &agentDeployment(objs).Spec.Template.Spec.Containers[0]
			c.ReadinessProbe = c.LivenessProbe
			return objs
		},
		"no headless Service": func(objs []runtime.Object) []runtime.Object {
			svc, _ := findService(objs, "agent-peers")
			svc.Spec.ClusterIP = ""
			return objs
		},
		"no PDB": func(objs []runtime.Object) []runtime.Object {
			return slices.DeleteFunc(objs, func(o runtime.Object) bool {
				p, ok := o.(*policyv1.PodDisruptionBudget)
				return ok && p.Name == "agent"
			})
		},
		"no peer policy": func(objs []runtime.Object) []runtime.Object {
			return slices.DeleteFunc(objs, func(o runtime.Object) bool {
				p, ok := o.(*networkingv1.NetworkPolicy)
				return ok && p.Name == "agent-peers"
			})
		},
		"advertise the Service": func(objs []runtime.Object) []runtime.Object {
			c := &agentDeployment(objs).Spec.Template.Spec.Containers[0]
			c.Args = append(slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--advertise=") }), "--advertise=agent:7700")
			return objs
		},
	}
	for name, mutate := range mutations {
		t.Run(name, func(t *testing.T) {
			if bad := checkAgentReplicas(t, mutate(render(t, "overlays/prod").objs), 3); len(bad) == 0 {
				t.Fatal("not caught")
			}
		})
	}
}

func agentDeployment(objs []runtime.Object) *appsv1.Deployment {
	for _, d := range find[*appsv1.Deployment](objs) {
		if d.Name == "agent" {
			return d
		}
	}
	return nil
}
