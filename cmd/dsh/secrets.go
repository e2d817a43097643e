package main

import (
	"bufio"
	"bytes"
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
			// A copy: val shares its bytes with the environment block,
			// which scrubInPlace overwrites.
			secrets[strings.Clone(name)] = strings.Clone(val)
			continue
		}
		rest = append(rest, kv)
	}
	return secrets, rest
}

// scrubbedReexec keeps provider keys out of every process environment a
// tool could read. `dsh dev` runs gateway, toolhost and agent in one
// process, and /proc/<pid>/environ shows the bytes of the environment block
// the process was exec'd with for its whole life, so clearing variables in
// Go is not enough. First choice (scrubInPlace): overwrite the secret
// entries of that block with NUL bytes, in this process, which costs
// nothing; when that cannot be done and checked, the process re-executes
// itself (same pid, new image: a second start of the whole binary) with the
// secret-looking variables removed, handing them over a pipe that is read
// and closed at start-up. Either way the keys then live only in this
// process's memory.
//
// It returns (nil, nil) when there is nothing to do, the secrets when this
// process scrubbed its block or is the scrubbed re-exec, and does not
// return when it re-executes.
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
	if scrubInPlace(secrets) == nil {
		return secrets, nil
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

// scrubInPlace removes the secret entries from the environment block the
// kernel shows as /proc/self/environ (the memory between the env_start and
// env_end of /proc/self/stat), by writing NUL bytes over each whole entry
// through /proc/self/mem, then reads /proc/self/environ back and fails
// if any secret entry is left in it. The variables are unset in Go
// first: Go's environment strings share those bytes (the copies the caller
// keeps were cloned by splitSecrets).
func scrubInPlace(secrets map[string]string) error {
	start, end, err := environBounds()
	if err != nil {
		return err
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	block := make([]byte, end-start)
	if _, err := mem.ReadAt(block, int64(start)); err != nil {
		return fmt.Errorf("read environment block: %w", err)
	}
	for name := range secrets {
		os.Unsetenv(name)
	}
	for off := 0; off < len(block); {
		n := bytes.IndexByte(block[off:], 0)
		if n < 0 {
			n = len(block) - off
		}
		name, _, ok := bytes.Cut(block[off:off+n], []byte("="))
		if _, secret := secrets[string(name)]; ok && secret {
			clear(block[off : off+n])
		}
		off += n + 1
	}
	if _, err := mem.WriteAt(block, int64(start)); err != nil {
		return fmt.Errorf("write environment block: %w", err)
	}
	shown, err := os.ReadFile("/proc/self/environ")
	if err != nil {
		return err
	}
	for kv := range bytes.SplitSeq(shown, []byte{0}) {
		name, _, _ := bytes.Cut(kv, []byte("="))
		if _, secret := secrets[string(name)]; secret {
			return fmt.Errorf("%s is still in /proc/self/environ", name)
		}
	}
	return nil
}

// environBounds reads env_start and env_end, fields 50 and 51 of
// /proc/self/stat (Linux 3.5 and later).
func environBounds() (start, end uint64, err error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')') // the command name may hold spaces
	if i < 0 {
		return 0, 0, errors.New("/proc/self/stat: no command name")
	}
	f := strings.Fields(string(b[i+1:])) // field 3 onwards
	if len(f) < 49 {
		return 0, 0, errors.New("/proc/self/stat: no env_start/env_end")
	}
	if start, err = strconv.ParseUint(f[47], 10, 64); err != nil {
		return 0, 0, err
	}
	if end, err = strconv.ParseUint(f[48], 10, 64); err != nil {
		return 0, 0, err
	}
	if end <= start || end-start > 1<<30 {
		return 0, 0, fmt.Errorf("/proc/self/stat: environment block %d..%d", start, end)
	}
	return start, end, nil
}
