package bash

import (
	"strings"
)

// credentialWords mark environment variables that must not reach a model's
// shell: names containing any of them (case-insensitive) are removed.
var credentialWords = []string{"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE"}

// ScrubEnv returns environ without credential-looking variables and without
// any ambient DSH_* variable, plus the managed non-interactive settings.
func ScrubEnv(environ []string) []string {
	out := make([]string, 0, len(environ)+4)
	for _, kv := range environ {
		name, _, ok := strings.Cut(kv, "=")
		if !ok || isCredential(name) || strings.HasPrefix(name, "DSH_") {
			continue
		}
		switch name {
		case "NO_COLOR", "TERM", "PAGER", "GIT_PAGER":
			continue
		}
		out = append(out, kv)
	}
	return append(out, "NO_COLOR=1", "TERM=dumb", "PAGER=cat", "GIT_PAGER=cat")
}

func isCredential(name string) bool {
	up := strings.ToUpper(name)
	for _, w := range credentialWords {
		if strings.Contains(up, w) {
			return true
		}
	}
	return false
}
