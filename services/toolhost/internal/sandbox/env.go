package sandbox

import "strings"

// allowedEnv are the host variables a tool process may see; everything
// else (provider keys included) never reaches it.
var allowedEnv = []string{"PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "SHELL"}

// defaultPath is PATH when the host has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Environ builds a tool process's environment from an allow-list: the
// allowed host variables, the deployment's pass-throughs (--tool-env), the
// managed non-interactive settings, then extra (DSH_SESSION_ID, TMPDIR...).
// It never starts from the host environment.
func Environ(host []string, passThrough []string, extra ...string) []string {
	allowed := map[string]bool{}
	for _, n := range allowedEnv {
		allowed[n] = true
	}
	for _, n := range passThrough {
		allowed[n] = true
	}
	out := make([]string, 0, len(allowed)+8+len(extra))
	hasPath := false
	for _, kv := range host {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || !allowed[name] {
			continue
		}
		hasPath = hasPath || name == "PATH"
		out = append(out, kv)
	}
	if !hasPath {
		out = append(out, "PATH="+defaultPath)
	}
	out = append(out, "NO_COLOR=1", "TERM=dumb", "PAGER=cat", "GIT_PAGER=cat")
	return append(out, extra...)
}
