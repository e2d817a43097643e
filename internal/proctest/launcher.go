package proctest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// LauncherPkg is the small sandbox launcher's main package.
const LauncherPkg = "github.com/dsh-dev/dsh/services/toolhost/cmd/dsh-sandbox-launcher"

// CgoUsable reports whether cgo can build here: the C compiler cgo would
// use (go env CC, else gcc) is on PATH. Without one, a build as make build
// does it (cgo, the launcher's C first stage) fails, and the tests that
// attack "the deployed launcher" attack the Go launcher instead.
var CgoUsable = sync.OnceValue(func() bool {
	cc := "gcc"
	if out, err := exec.Command("go", "env", "CC").Output(); err == nil {
		if f := strings.Fields(string(out)); len(f) > 0 {
			cc = f[0]
		}
	}
	_, err := exec.LookPath(cc)
	return err == nil
})

// BuildLauncher builds the sandbox launcher into bin, static either way:
// with cgo (its C first stage, as make build and the Dockerfile build it)
// or without (the Go launcher).
func BuildLauncher(bin string, cgo bool) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("build the launcher: %w", err)
	}
	env := "CGO_ENABLED=0"
	if cgo {
		env = "CGO_ENABLED=1"
	}
	cmd := exec.Command(goBin, "build", "-o", bin, LauncherPkg)
	cmd.Env = append(os.Environ(), env)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build the launcher (%s): %v\n%s", env, err, out)
	}
	return nil
}
