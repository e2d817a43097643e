// The launcher's first stage in C: the launcher package's protocol
// (services/toolhost/internal/sandbox/launcher), served from a constructor
// that runs before the Go runtime starts, so a bash call does not pay for a
// Go runtime (its threads, signal set-up and heap) in the launcher. The Go
// launcher remains the reference and the fallback (a build without cgo, the
// toolhost re-executing itself); launch_test.go runs the same checks
// against both, and the toolhost's escape tests attack this one.
//
// Every step is the Go launcher's, in the same order, with the same status
// lines: one "ok" or "error: <msg>" on descriptor 3 once set up, then
// "exit N" or "signal N". Unlike the Go launcher, the shell's rlimits are
// set between fork and exec (C can; Go needed a ptrace stop at the exec),
// and the launcher is single-threaded, so the Landlock domain and
// no_new_privs it sets on itself are those of its only thread.

#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// Must match the launcher package (Arg0, protocol, statusFD, RulesetFD,
// setupFailed).
#define ARG0 "dsh-sandbox-launcher"
#define PROTOCOL "dsh-launch-v2"
#define STATUS_FD 3
#define RULESET_FD 4
#define SETUP_FAILED 125

struct config {
	int landlock, pidns, dropcaps;
	const char *dir, *cgroup;
	unsigned long long cpu, mem, procs, fsize;
	char **argv;
};

static void report(const char *line) {
	size_t n = strlen(line);
	char buf[4096];
	if (n > sizeof buf - 2)
		n = sizeof buf - 2;
	memcpy(buf, line, n);
	buf[n++] = '\n';
	ssize_t w;
	do
		w = write(STATUS_FD, buf, n);
	while (w < 0 && errno == EINTR);
}

// fail reports "error: what[: strerror(err)]" (err 0: no cause).
static int fail(const char *what, int err) {
	char msg[4096];
	if (err)
		snprintf(msg, sizeof msg, "error: %s: %s", what, strerror(err));
	else
		snprintf(msg, sizeof msg, "error: %s", what);
	report(msg);
	return SETUP_FAILED;
}

// parse_u64 is strconv.ParseUint(s, 10, 64): decimal digits only.
static int parse_u64(const char *s, size_t n, unsigned long long *out) {
	if (n == 0)
		return -1;
	unsigned long long v = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		unsigned d = s[i] - '0';
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

static int parse_limits(const char *s, struct config *c) {
	unsigned long long v[4];
	for (int i = 0; i < 4; i++) {
		const char *end = strchr(s, ',');
		if ((i < 3) != (end != NULL))
			return -1; // not exactly four fields
		size_t n = end ? (size_t)(end - s) : strlen(s);
		if (parse_u64(s, n, &v[i]) < 0)
			return -1;
		s = end ? end + 1 : s + n;
	}
	c->cpu = v[0], c->mem = v[1], c->procs = v[2], c->fsize = v[3];
	return 0;
}

// quote is strconv.Quote for what a setting can hold: quotes and
// backslashes escaped, control bytes as Go writes them (bytes from 0x80 on
// are passed through, where Go would escape invalid UTF-8). Truncated to
// fit out.
static void quote(const char *s, char *out, size_t size) {
	static const char shorts[] = "\\a\\b\\t\\n\\v\\f\\r";
	size_t n = 0;
	char esc[8];
	if (size < 3)
		return;
	out[n++] = '"';
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			snprintf(esc, sizeof esc, "\\%c", ch);
		else if (ch >= 7 && ch <= 13)
			snprintf(esc, sizeof esc, "%.2s", shorts + 2 * (ch - 7));
		else if (ch < 0x20 || ch == 0x7f)
			snprintf(esc, sizeof esc, "\\x%02x", ch);
		else
			esc[0] = ch, esc[1] = 0;
		size_t l = strlen(esc);
		if (n + l + 2 > size)
			break;
		memcpy(out + n, esc, l);
		n += l;
	}
	out[n++] = '"';
	out[n] = 0;
}

// parse is launcher.ParseArgs: anything unknown is an error (closed); buf
// holds a message that names the setting.
static const char *parse(char **args, struct config *c, char *buf, size_t size) {
	for (int i = 0; args[i]; i++) {
		char *a = args[i];
		if (strcmp(a, "--") == 0) {
			c->argv = args + i + 1;
			return c->argv[0] ? NULL : "no command";
		}
		if (strncmp(a, "dir=", 4) == 0)
			c->dir = a + 4;
		else if (strncmp(a, "cgroup=", 7) == 0 && a[7])
			c->cgroup = a + 7;
		else if (strncmp(a, "limits=", 7) == 0) {
			if (parse_limits(a + 7, c) < 0)
				return "limits: want cpu,memory,processes,file-size as decimal numbers";
		} else if (strcmp(a, "landlock") == 0)
			c->landlock = 1;
		else if (strcmp(a, "pidns") == 0)
			c->pidns = 1;
		else if (strcmp(a, "dropcaps") == 0)
			c->dropcaps = 1;
		else {
			char q[1024];
			quote(a, q, sizeof q);
			snprintf(buf, size, "unknown setting %s", q);
			return buf;
		}
	}
	return "no \"--\" before the command";
}

// The capabilities that could undo the confinement (launcher.droppedCaps).
static const int dropped_caps[] = {
	CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_SYS_RESOURCE, CAP_SYS_MODULE, CAP_SYS_RAWIO,
	CAP_NET_ADMIN, CAP_NET_RAW, CAP_MKNOD, CAP_SYS_BOOT, CAP_SYS_TIME,
	CAP_MAC_ADMIN, CAP_MAC_OVERRIDE, 39 /* CAP_BPF */, 38 /* CAP_PERFMON */, CAP_SETPCAP,
	CAP_SETFCAP, CAP_SYS_CHROOT, CAP_LINUX_IMMUTABLE, CAP_SYSLOG, CAP_AUDIT_CONTROL,
	CAP_SYS_PACCT, CAP_SYS_TTY_CONFIG, CAP_SYS_NICE, CAP_IPC_OWNER, 40 /* CAP_CHECKPOINT_RESTORE */,
	CAP_WAKE_ALARM, CAP_BLOCK_SUSPEND, CAP_LEASE,
};

// clear_inheritable is launcher.clearInheritable: no ambient and no
// inheritable capability reaches the shell (exec gives root inheritable ∪
// bounding, anyone else the ambient set), for any host, closed.
static int clear_inheritable(void) {
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		return fail("capabilities: ambient", errno);
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
	if (syscall(SYS_capget, &h, d) < 0)
		return fail("capabilities: inheritable", errno);
	for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
		d[i].inheritable = 0;
	if (syscall(SYS_capset, &h, d) < 0)
		return fail("capabilities: inheritable", errno);
	return 0;
}

// restrict_self is launcher.restrict: the launcher's own /proc readable
// (with a PID namespace), no_new_privs, the ruleset enforced, closed.
static int restrict_self(int own_proc) {
	if (own_proc) {
		int fd = open("/proc", O_PATH | O_CLOEXEC);
		if (fd < 0)
			return fail("landlock: rule for /proc", errno);
		struct landlock_path_beneath_attr attr = {
			.allowed_access = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR,
			.parent_fd = fd,
		};
		long r = syscall(SYS_landlock_add_rule, RULESET_FD, LANDLOCK_RULE_PATH_BENEATH, &attr, 0);
		int err = errno;
		close(fd);
		if (r < 0)
			return fail("landlock: rule for /proc", err);
	}
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return fail("landlock: no_new_privs", errno);
	if (syscall(SYS_landlock_restrict_self, RULESET_FD, 0) < 0)
		return fail("landlock: enforce", errno);
	if (close(RULESET_FD) < 0)
		return fail("landlock", errno);
	return 0;
}

static const char *look_path(const char *name, char *buf, size_t size) {
	if (strchr(name, '/'))
		return name;
	const char *path = getenv("PATH");
	if (!path)
		path = "";
	for (;;) {
		const char *end = strchrnul(path, ':');
		size_t n = end - path;
		struct stat st;
		if (n == 0)
			snprintf(buf, size, "./%s", name);
		else
			snprintf(buf, size, "%.*s/%s", (int)n, path, name);
		if (stat(buf, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0111))
			return buf;
		if (!*end)
			return name;
		path = end + 1;
	}
}

// dsh_cloexec_walk is launcher.cloexecWalk: close-on-exec on every
// descriptor above 2 listed in /proc/self/fd, for kernels whose close_range
// lacks CLOSE_RANGE_CLOEXEC (before 5.11). 0 or an errno. Not static: the
// tests call it (launch_cgo.go).
int dsh_cloexec_walk(void) {
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return errno;
	int self = dirfd(d), err = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		int fd = atoi(e->d_name);
		if (fd < 3 || fd == self)
			continue;
		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 && errno != EBADF) {
			err = errno;
			break;
		}
	}
	closedir(d);
	return err;
}

// cloexec_all marks every descriptor above 2 close-on-exec: close_range,
// else (EINVAL on 5.10, ENOSYS before 5.9) the walk of /proc/self/fd.
static int cloexec_all(void) {
	if (syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return errno;
	return dsh_cloexec_walk();
}

static void set_limit(int res, rlim_t cur, rlim_t max, int *err) {
	struct rlimit rl = {cur, max};
	if (!*err && setrlimit(res, &rl) < 0)
		*err = errno;
}

// The shell's pid and how signals reach it (forward).
static volatile pid_t shell;
static int forward_all;

static void forward(int sig) {
	int saved = errno;
	if (forward_all)
		kill(-1, sig); // every process of the namespace, from its pid 1
	else if (shell > 0)
		kill(shell, sig);
	errno = saved;
}

static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP};

// start forks the shell: in the child the call's rlimits, the signal
// state of a fresh process, the directory, then exec. An exec (or
// directory, or limit) failure comes back over a close-on-exec pipe.
// The step of the child's set-up that failed (start's report).
enum { STEP_FORK, STEP_LIMITS, STEP_DESCRIPTORS, STEP_DIR, STEP_EXEC };

static int start(const struct config *c, pid_t *pid, int *step) {
	char pathbuf[4096];
	const char *path = look_path(c->argv[0], pathbuf, sizeof pathbuf);
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return errno;
	int nproc = c->cgroup == NULL && geteuid() != 0;
	pid_t child = fork();
	if (child < 0) {
		int err = errno;
		close(p[0]), close(p[1]);
		return err;
	}
	if (child == 0) {
		close(p[0]);
		int err = 0, at = STEP_LIMITS;
		// CPU: SIGXCPU at the soft limit, SIGKILL a second later.
		if (c->cpu)
			set_limit(RLIMIT_CPU, c->cpu, c->cpu + 1, &err);
		if (c->mem)
			set_limit(RLIMIT_AS, c->mem, c->mem, &err);
		if (nproc && c->procs)
			set_limit(RLIMIT_NPROC, c->procs, c->procs, &err);
		if (c->fsize)
			set_limit(RLIMIT_FSIZE, c->fsize, c->fsize, &err);
		set_limit(RLIMIT_CORE, 0, 0, &err);
		sigset_t none;
		sigemptyset(&none);
		for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
			signal(forwarded[i], SIG_DFL);
		signal(SIGPIPE, SIG_DFL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		// Nothing but the standard descriptors reaches the shell, not
		// even one the launcher inherited without close-on-exec (the
		// error pipe stays open until the exec).
		if (!err && (err = cloexec_all()) != 0)
			at = STEP_DESCRIPTORS;
		if (!err && c->dir && *c->dir && chdir(c->dir) < 0)
			err = errno, at = STEP_DIR;
		if (!err) {
			extern char **environ;
			execve(path, c->argv, environ);
			err = errno, at = STEP_EXEC;
		}
		int msg[2] = {err, at};
		ssize_t w = write(p[1], msg, sizeof msg);
		(void)w;
		_exit(127);
	}
	close(p[1]);
	int msg[2] = {0, 0};
	ssize_t n;
	do
		n = read(p[0], msg, sizeof msg);
	while (n < 0 && errno == EINTR);
	close(p[0]);
	if (n == sizeof msg && msg[0]) {
		waitpid(child, NULL, 0);
		*step = msg[1];
		return msg[0];
	}
	*pid = child;
	return 0;
}

// children lists this process's children (orphans reparented to it).
static int children(pid_t *out, int max) {
	char path[64];
	snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	int n = 0, v;
	while (n < max && fscanf(f, "%d", &v) == 1)
		out[n++] = v;
	fclose(f);
	return n;
}

// kill_descendants is the subreaper fallback: kill every child until none
// is left.
static void kill_descendants(void) {
	pid_t kids[1024];
	for (int round = 0; round < 1000; round++) {
		int n = children(kids, 1024);
		if (n == 0)
			return;
		for (int i = 0; i < n; i++)
			kill(kids[i], SIGKILL);
		for (int i = 0; i < n; i++)
			while (waitpid(kids[i], NULL, 0) < 0 && errno == EINTR)
				;
	}
}

static int launch(char **args) {
	// Whatever the toolhost's signal state: children are reaped here
	// (SIGCHLD ignored would reap them for us and lose the shell's end),
	// and a report to a toolhost that went away is an error, not a death
	// (as for the Go launcher); the shell gets the defaults back.
	signal(SIGCHLD, SIG_DFL);
	signal(SIGPIPE, SIG_IGN);
	// No descriptor the toolhost handed over may reach the shell.
	if (fcntl(STATUS_FD, F_SETFD, FD_CLOEXEC) < 0)
		return fail("descriptor 3", errno);
	if (fcntl(RULESET_FD, F_SETFD, FD_CLOEXEC) < 0 && errno != EBADF)
		return fail("descriptor 4", errno);
	struct config c = {0};
	char perrbuf[1100];
	const char *perr = parse(args, &c, perrbuf, sizeof perrbuf);
	if (perr) {
		char msg[1200];
		snprintf(msg, sizeof msg, "config: %s", perr);
		return fail(msg, 0);
	}
	if (c.cgroup) {
		char path[4096], what[4200];
		snprintf(path, sizeof path, "%s/cgroup.procs", c.cgroup);
		snprintf(what, sizeof what, "join cgroup %s", c.cgroup);
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			return fail(what, errno);
		if (write(fd, "0", 1) != 1) {
			int err = errno;
			close(fd);
			return fail(what, err);
		}
		close(fd);
	}
	if (c.pidns) {
		// Our own /proc: it lists only this call's processes.
		if (mount("", "/", "", MS_REC | MS_PRIVATE, "") < 0)
			return fail("make mounts private", errno);
		if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "") < 0)
			return fail("mount /proc", errno);
	} else if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		return fail("subreaper", errno);
	if (c.dropcaps) {
		for (size_t i = 0; i < sizeof dropped_caps / sizeof dropped_caps[0]; i++) {
			if (prctl(PR_CAPBSET_DROP, dropped_caps[i], 0, 0, 0) < 0 && errno != EINVAL) {
				char what[64];
				snprintf(what, sizeof what, "drop capabilities: capability %d", dropped_caps[i]);
				return fail(what, errno);
			}
		}
	}
	int r = clear_inheritable();
	if (r)
		return r;
	if (c.landlock) {
		r = restrict_self(c.pidns);
		if (r)
			return r;
	}
	// Termination signals are held until the shell's pid is known, then
	// forwarded (to the whole namespace with one).
	sigset_t held;
	sigemptyset(&held);
	for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
		sigaddset(&held, forwarded[i]);
	sigprocmask(SIG_BLOCK, &held, NULL);
	struct sigaction sa = {0};
	sa.sa_handler = forward;
	sa.sa_flags = SA_RESTART;
	for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
		sigaction(forwarded[i], &sa, NULL);
	// Not dumpable from here on: a shell of the same uid and Landlock
	// domain (a non-root host) may neither open the launcher's
	// descriptors through /proc (the report pipe, to forge an end) nor
	// ptrace it or read its memory. The exec makes the shell dumpable
	// again; the launcher's own /proc reads (its children) still work.
	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		return fail("not dumpable", errno);
	pid_t pid = 0;
	int step = 0;
	int err = start(&c, &pid, &step);
	if (err) {
		char what[4200];
		switch (step) {
		case STEP_DIR:
			snprintf(what, sizeof what, "start: chdir %s", c.dir);
			break;
		case STEP_EXEC:
			snprintf(what, sizeof what, "start: exec %s", c.argv[0]);
			break;
		case STEP_DESCRIPTORS:
			snprintf(what, sizeof what, "start: descriptors");
			break;
		case STEP_LIMITS:
			snprintf(what, sizeof what, "start: limits");
			break;
		default:
			snprintf(what, sizeof what, "start");
		}
		return fail(what, err);
	}
	report("ok");
	shell = pid;
	forward_all = c.pidns;
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	// Reap every orphan handed to us until the shell ends.
	int ws = 0;
	for (;;) {
		int st;
		pid_t r = waitpid(-1, &st, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		if (r == pid) {
			ws = st;
			break;
		}
	}
	if (!c.pidns)
		kill_descendants();
	char line[64];
	if (WIFSIGNALED(ws)) {
		snprintf(line, sizeof line, "signal %d", WTERMSIG(ws));
		report(line);
		return 128 + WTERMSIG(ws);
	}
	snprintf(line, sizeof line, "exit %d", WEXITSTATUS(ws));
	report(line);
	return WEXITSTATUS(ws);
}

// dsh_launch_first runs before the Go runtime: with the launcher's argv[0]
// and protocol marker it serves the call and exits; otherwise it returns
// and main runs.
__attribute__((constructor)) static void dsh_launch_first(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc >= 3 && strcmp(argv[0], ARG0) == 0 && strcmp(argv[1], PROTOCOL) == 0)
		_exit(launch(argv + 2));
}
