package sandbox

import (
	"os"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/proctest"
)

// TestConfinesAsNonRoot runs when the test binary runs as a non-root user
// (DSH_NONROOT_TEST=1): the fallback path of the k8s manifests (no
// namespaces, subreaper, RLIMIT_NPROC). By hand:
//
//	go test -c -o /tmp/sbtest ./services/toolhost/internal/sandbox
//	cd /tmp && DSH_NONROOT_TEST=1 runuser -u nobody -- /tmp/sbtest -test.run NonRoot -test.v
func TestConfinesAsNonRoot(t *testing.T) {
	if os.Getenv("DSH_NONROOT_TEST") == "" || os.Geteuid() == 0 {
		t.Skip("run as a non-root user with DSH_NONROOT_TEST=1")
	}
	root := t.TempDir()
	s, err := New(Config{HostRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("support %+v", s.Support())
	if s.Support().Unavailable != nil {
		t.Fatal(s.Support().Unavailable)
	}
	out, errb, _ := runIn(t, s, Policy{Mode: WorkspaceWrite, Network: true}, root, "echo ok > f && cat f; echo x > /tmp/nonroot-escape; (setsid bash -c 'exec -a dsh-nonroot-leftover sleep 30' &); echo done")
	if !strings.Contains(out, "ok\n") || !strings.Contains(errb, "Permission denied") {
		t.Errorf("out %q err %q", out, errb)
	}
	if _, err := os.Stat("/tmp/nonroot-escape"); err == nil {
		t.Error("escaped")
	}
	if pids := proctest.Living("dsh-nonroot-leftover"); len(pids) > 0 {
		t.Errorf("the subreaper left %v running", pids)
	}
}
