package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// secretsFDEnv names the descriptor a scrubbed re-exec reads its secrets
// from.
const secretsFDEnv = "DSH_SECRETS_FD"

// maxSecretBytes bounds what is handed over (one pipe buffer, so the write
// never blocks before the exec).
const maxSecretBytes = 60 << 10

// credentialWords mark secret-looking variable names (provider keys,
// tokens, passwords).
var credentialWords = []string{"KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "PRIVATE"}

func isSecretName(name string) bool {
	up := strings.ToUpper(name)
	for _, w := range credentialWords {
		if strings.Contains(up, w) {
			return true
		}
	}
	return false
}

// splitSecrets separates secret-looking variables from the rest.
func splitSecrets(environ []string) (secrets map[string]string, rest []string) {
	secrets = map[string]string{}
	for _, kv := range environ {
		name, val, ok := strings.Cut(kv, "=")
		if ok && isSecretName(name) && name != secretsFDEnv {
			secrets[name] = val
			continue
		}
		rest = append(rest, kv)
	}
	return secrets, rest
}

// scrubbedReexec keeps provider keys out of every process environment a
// tool could read. `dsh dev` runs gateway, toolhost and agent in one
// process, and /proc/<pid>/environ shows the environment the process was
// exec'd with for its whole life, so clearing variables in Go is not
// enough: the process re-executes itself (same pid, new image) with the
// secret-looking variables removed, handing them over a pipe that is read
// and closed at start-up. The keys then live only in this process's memory.
//
// It returns (nil, nil) when there is nothing to do, the secrets when this
// process is the scrubbed re-exec, and does not return when it re-executes.
func scrubbedReexec(args []string) (map[string]string, error) {
	if fdStr, ok := os.LookupEnv(secretsFDEnv); ok {
		os.Unsetenv(secretsFDEnv)
		fd, err := strconv.Atoi(fdStr)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %w", secretsFDEnv, fdStr, err)
		}
		f := os.NewFile(uintptr(fd), "secrets")
		defer f.Close()
		return readSecrets(f)
	}
	if len(args) == 0 || args[0] != "dev" {
		return nil, nil
	}
	secrets, rest := splitSecrets(os.Environ())
	if len(secrets) == 0 {
		return nil, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	n := 0
	bw := bufio.NewWriter(w)
	for k, v := range secrets {
		n += len(k) + len(v) + 2
		if n > maxSecretBytes {
			return nil, errors.New("secret-looking environment variables exceed 60 KiB; unset some before dsh dev")
		}
		fmt.Fprintf(bw, "%s=%s\x00", k, v)
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	w.Close()
	// The read end survives the exec; nothing else does.
	if _, err := unix.FcntlInt(r.Fd(), unix.F_SETFD, 0); err != nil {
		return nil, err
	}
	env := append(rest, fmt.Sprintf("%s=%d", secretsFDEnv, r.Fd()))
	return nil, syscall.Exec("/proc/self/exe", append([]string{os.Args[0]}, args...), env)
}

func readSecrets(r io.Reader) (map[string]string, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read secrets: %w", err)
	}
	out := map[string]string{}
	for _, kv := range strings.Split(string(b), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out, nil
}

// withSecrets overlays handed-over secrets on getenv.
func withSecrets(secrets map[string]string, getenv func(string) string) func(string) string {
	if len(secrets) == 0 {
		return getenv
	}
	return func(k string) string {
		if v, ok := secrets[k]; ok {
			return v
		}
		return getenv(k)
	}
}
