// Package pgserver starts a throwaway PostgreSQL (a testcontainers-go
// container or a cluster from local binaries) and PgBouncer, for the test
// harness (internal/onpglimit/testdb), the demo and the load test. It imports neither
// testing nor testcontainers, so that the binaries that use it ship no test
// code: the container is started by the pgcontainer command, a module of its
// own beside this package, which the launcher runs with go run.
package pgserver

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Server kinds reported by [Server.Kind].
const (
	KindURL    = "url"
	KindDocker = "docker"
	KindLocal  = "local"
)

const (
	// DefaultImage is the container image used when [Config.Image] is empty.
	DefaultImage = "postgres:16-alpine"
	// Long enough for a slow engine to answer, short enough that machines
	// without Docker fall through to local binaries without a noticeable wait.
	serverDockerProbeTimeout = 3 * time.Second
	serverReadyTimeout       = 30 * time.Second
	serverStopTimeout        = 10 * time.Second
	serverPortAttempts       = 3
)

// Config says where a server comes from. A nil *Config means defaults.
// Start reads no environment itself; its callers map their own variables
// onto these fields.
type Config struct {
	// URL of an existing server to use instead of starting one; it must allow
	// CREATE EXTENSION and CREATE DATABASE. Defaults to "" (start a server).
	URL string

	// Durable keeps fsync and full_page_writes on, because the demo and the
	// load test need honest numbers; tests leave it off for speed. It never
	// touches synchronous_commit, which the library's behaviour depends on.
	// Ignored for an existing URL. Defaults to false.
	Durable bool

	// Logf receives progress lines so a slow start (image pull, initdb) is not
	// a silent one. Defaults to discarding them.
	Logf func(format string, args ...any)

	// Prefer picks the source: "" tries URL, then Docker, then local binaries;
	// "docker" or "local" use only that one (URL still wins when set).
	// Defaults to "".
	Prefer string

	// BinDir is a directory holding initdb and postgres, for testing another
	// PostgreSQL major than the installed one. Defaults to "": initdb on PATH,
	// else the highest /usr/lib/postgresql/<major>/bin.
	BinDir string

	// Image is the container image; it must behave like the official
	// postgres image (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, and the
	// ready line logged twice). Defaults to [DefaultImage].
	Image string

	// HostNetwork runs the container on the host's network, listening on
	// 127.0.0.1 on a port of its own, instead of publishing a port from a
	// bridge network: for engines that cannot program bridge networks. The
	// daemon host is then taken to be 127.0.0.1. Defaults to false.
	HostNetwork bool
}

// Server is a PostgreSQL server for tests, the demo and the load test. It is
// either borrowed (a URL) or owned (a container or a throwaway cluster), and
// Close releases only what it owns.
type Server struct {
	kind   string
	source string     // for log lines: where the server came from
	mu     sync.Mutex // guards url, which a container restart may change
	url    string
	dir    string // temp dir of a local cluster, "" otherwise

	stop      func() error
	restart   func(ctx context.Context, immediate bool) error
	standby   func(ctx context.Context) (*Server, error)
	kill      func()
	freeze    func(on bool)
	closeOnce sync.Once
	closeErr  error
}

// Start finds or starts a PostgreSQL server. When none can be had it fails
// with a message saying how to provide one: tests must not skip silently.
func Start(ctx context.Context, cfg *Config) (*Server, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}

	switch cfg.Prefer {
	case "", KindDocker, KindLocal:
	default:
		// Checked even when URL is set, so a typo in configuration shows up early.
		return nil, fmt.Errorf(`pgserver: Config.Prefer must be "", "docker" or "local", got %q`, cfg.Prefer)
	}
	if cfg.URL != "" {
		logf("using PostgreSQL at the given URL")
		return &Server{kind: KindURL, source: "the given URL", url: cfg.URL}, nil
	}

	var tried []string
	switch cfg.Prefer {
	case "":
		if err := dockerEngineAnswers(ctx); err != nil {
			logf("no Docker engine answers (%s); trying local PostgreSQL binaries", err)
			tried = append(tried, "docker: no engine answers: "+err.Error())
		} else {
			s, err := startDockerServer(ctx, cfg, logf)
			if err == nil {
				return s, nil
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("pgserver: docker: %w", err)
			}
			logf("%v; trying local PostgreSQL binaries", err)
			tried = append(tried, "docker: "+err.Error())
		}
		s, err := startLocalServer(ctx, cfg, logf)
		if err == nil {
			return s, nil
		}
		tried = append(tried, "local: "+err.Error())
	case KindDocker:
		// No probe: testcontainers knows more ways to find an engine than
		// the probe does, and its error says what it tried.
		s, err := startDockerServer(ctx, cfg, logf)
		if err != nil {
			return nil, serverUnavailable(cfg, []string{"docker: " + err.Error()})
		}
		return s, nil
	case KindLocal:
		s, err := startLocalServer(ctx, cfg, logf)
		if err != nil {
			return nil, serverUnavailable(cfg, []string{"local: " + err.Error()})
		}
		return s, nil
	}
	return nil, serverUnavailable(cfg, tried)
}

func serverUnavailable(cfg *Config, tried []string) error {
	return fmt.Errorf("pgserver: no PostgreSQL server available. Provide one by either\n"+
		"  - setting PGLIMIT_TEST_DATABASE_URL (tests) or DATABASE_URL (demo) to a superuser URL, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable\n"+
		"  - starting a Docker engine (image %s is pulled on first use), or\n"+
		"  - installing PostgreSQL server binaries with contrib, e.g. apt-get install postgresql postgresql-contrib\n"+
		"tried:\n  %s", cmp.Or(cfg.Image, DefaultImage), strings.Join(tried, "\n  "))
}

// URL returns a superuser connection URL to the "postgres" database. After
// [Server.Restart] of a container, the port may have changed.
func (s *Server) URL() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.url
}

// Kind tells where the server came from ([KindURL], [KindDocker] or
// [KindLocal]), so callers can log it or reason about what Close will do.
func (s *Server) Kind() string { return s.kind }

// Source describes where the server came from in a few words, for log
// lines: "local binaries in /usr/lib/postgresql/15/bin", "testcontainers,
// docker image postgres:16-alpine", "the given URL".
func (s *Server) Source() string { return s.source }

// Close stops what Start started and removes its files; a borrowed URL is
// left alone. It is safe to call more than once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.stop != nil {
			s.closeErr = s.stop()
		}
	})
	return s.closeErr
}

// Restart stops the server and starts it again on the same data, for fault
// tests. With immediate it stops the way a crash does (as pg_ctl stop -m
// immediate: no checkpoint, recovery at start); otherwise it does a fast
// shutdown. Open connections are cut either way. A local cluster keeps its
// port; a container may not, see [Server.URL]. A borrowed URL cannot be
// restarted.
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	if s.restart == nil {
		return fmt.Errorf("pgserver: a %s server cannot be restarted; only containers and local clusters can", s.kind)
	}
	return s.restart(ctx, immediate)
}

// Kill kills a local cluster's postmaster alone (SIGKILL), as kill -9 or
// the OOM killer would, for failover tests: its backends live on,
// orphaned, answering the connections they hold until they notice. Close
// kills them, and so does Restart(ctx, true), which then starts it again.
func (s *Server) Kill() error {
	if s.kill == nil {
		return fmt.Errorf("pgserver: a %s server cannot be killed; only local clusters can", s.kind)
	}
	s.kill()
	return nil
}

// Freeze stops every process of a local cluster (SIGSTOP), as a host that
// stops answering, until Thaw: connections stay open, and nothing comes
// back on them.
func (s *Server) Freeze() error {
	if s.freeze == nil {
		return fmt.Errorf("pgserver: a %s server cannot be frozen; only local clusters can", s.kind)
	}
	s.freeze(true)
	return nil
}

// Thaw lets a frozen local cluster go on (SIGCONT).
func (s *Server) Thaw() error {
	if s.freeze == nil {
		return fmt.Errorf("pgserver: a %s server cannot be frozen; only local clusters can", s.kind)
	}
	s.freeze(false)
	return nil
}

// serverLocalBin is a directory holding initdb and postgres.
type serverLocalBin struct {
	dir     string
	version string // major version, for log lines
}

// findLocalBinaries takes binDir when given; otherwise it prefers initdb on
// PATH, as the user's explicit choice, then the highest Debian-style
// /usr/lib/postgresql/<ver>/bin.
func findLocalBinaries(binDir string) (serverLocalBin, error) {
	if binDir != "" {
		for _, name := range []string{"initdb", "postgres"} {
			if !serverIsExecutable(filepath.Join(binDir, name)) {
				return serverLocalBin{}, fmt.Errorf("no executable %s in %s (Config.BinDir)", name, binDir)
			}
		}
		return serverLocalBin{dir: binDir, version: serverBinVersion(binDir)}, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dir := filepath.Dir(p)
		if serverIsExecutable(filepath.Join(dir, "postgres")) {
			return serverLocalBin{dir: dir, version: serverBinVersion(dir)}, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var found []serverLocalBin
	for _, dir := range dirs {
		if serverIsExecutable(filepath.Join(dir, "initdb")) && serverIsExecutable(filepath.Join(dir, "postgres")) {
			found = append(found, serverLocalBin{dir: dir, version: filepath.Base(filepath.Dir(dir))})
		}
	}
	if len(found) == 0 {
		return serverLocalBin{}, errors.New("no initdb and postgres on PATH or under /usr/lib/postgresql/<version>/bin")
	}
	slices.SortFunc(found, func(a, b serverLocalBin) int {
		return serverCompareVersions(b.version, a.version) // highest first
	})
	return found[0], nil
}

func serverIsExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// serverCompareVersions orders "9.6" < "15" < "16".
func serverCompareVersions(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return 0
}

// serverBinVersion returns the major version for log lines; "?" when
// unknown, since it is not worth failing for.
func serverBinVersion(dir string) string {
	out, err := exec.Command(filepath.Join(dir, "postgres"), "--version").Output()
	if err != nil {
		return "?"
	}
	// "postgres (PostgreSQL) 15.8 (Debian 15.8-1.pgdg120+1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return "?"
	}
	major, _, _ := strings.Cut(fields[2], ".")
	return major
}

// serverCredential returns whom to run initdb and postgres as: both refuse to
// run as root, so root borrows the "postgres" user, else "nobody".
func serverCredential() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		return nil, "", nil
	}
	var errs []error
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			errs = append(errs, fmt.Errorf("user %q has unusable uid/gid %s/%s", name, u.Uid, u.Gid))
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, name, nil
	}
	return nil, "", fmt.Errorf("running as root and no unprivileged user to run PostgreSQL as: %w", errors.Join(errs...))
}

func serverSysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Credential: cred,
		// Own process group: Ctrl-C in a terminal reaches only our process,
		// which then shuts the cluster down in order.
		Setpgid: true,
		// If we die without Close (test timeout, kill -9), fast-shut the
		// cluster instead of leaving it running.
		Pdeathsig: syscall.SIGINT,
	}
}

func startLocalServer(ctx context.Context, cfg *Config, logf func(string, ...any)) (*Server, error) {
	bin, err := findLocalBinaries(cfg.BinDir)
	if err != nil {
		return nil, err
	}
	cred, runAs, err := serverCredential()
	if err != nil {
		return nil, err
	}
	base := os.TempDir()
	if cred != nil && !serverSearchable(base) {
		// e.g. TMPDIR under /root: the unprivileged user could not enter it.
		logf("%s is not searchable by user %s; using /tmp", base, runAs)
		base = "/tmp"
	}
	dir, err := makeClusterDir(base, "pglimittest-", cred, runAs)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	dataDir := filepath.Join(dir, "data")

	asUser := ""
	if runAs != "" {
		asUser = " as user " + runAs
	}
	logf("starting local PostgreSQL %s from %s%s in %s", bin.version, bin.dir, asUser, dir)

	initArgs := []string{"-D", dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale"}
	if !cfg.Durable {
		initArgs = append(initArgs, "--no-sync")
	}
	initCmd := exec.CommandContext(ctx, filepath.Join(bin.dir, "initdb"), initArgs...)
	initCmd.Dir = dir // the unprivileged user may not be able to enter our cwd
	initCmd.SysProcAttr = serverSysProcAttr(cred)
	if out, err := initCmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, serverTail(out))
	}

	c := &localCluster{bin: bin, cred: cred, dir: dir, durable: cfg.Durable, logf: logf}
	proc, err := c.startOnFreePort(ctx)
	if err != nil {
		return nil, err
	}
	ok = true
	logf("local PostgreSQL ready on 127.0.0.1:%d", c.port)
	s := c.server(proc, "local binaries in "+bin.dir)
	s.standby = func(ctx context.Context) (*Server, error) { return startStandby(ctx, c, base) }
	return s, nil
}

// makeClusterDir makes a temp dir for a cluster under base, with its
// socket dir, owned by the user of cred (runAs).
func makeClusterDir(base, prefix string, cred *syscall.Credential, runAs string) (string, error) {
	dir, err := os.MkdirTemp(base, prefix)
	if err != nil {
		return "", fmt.Errorf("create temp dir: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sock"), 0o700); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("create socket dir: %w", err)
	}
	if err := serverChown(dir, cred); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("chown temp dir to %s: %w", runAs, err)
	}
	return dir, nil
}

// localCluster is a cluster in a temp dir of its own, dir: its data in
// dir/data, its socket in dir/sock, its log in dir/postgres.log.
type localCluster struct {
	bin     serverLocalBin
	cred    *syscall.Credential
	dir     string
	port    int
	durable bool
	logf    func(string, ...any)
}

// startOnFreePort starts c on a free port, which it sets: another process
// can grab the port between the probe and the bind, and then it tries
// another.
func (c *localCluster) startOnFreePort(ctx context.Context) (*serverProc, error) {
	var lastErr error
	for range serverPortAttempts {
		port, err := serverFreePort()
		if err != nil {
			return nil, err
		}
		c.port = port
		proc, err := c.start(ctx)
		if err == nil {
			return proc, nil
		}
		lastErr = err
		if ctx.Err() != nil || !strings.Contains(err.Error(), "already in use") {
			break
		}
		c.logf("port %d was taken; retrying", port)
	}
	return nil, lastErr
}

func (c *localCluster) start(ctx context.Context) (*serverProc, error) {
	return serverStartPostgres(ctx, c.bin, c.cred, c.dir, filepath.Join(c.dir, "data"), filepath.Join(c.dir, "sock"),
		filepath.Join(c.dir, "postgres.log"), c.port, c.durable)
}

// server is the Server of c, running as proc: Close stops it and removes
// its dir, Restart starts it again on the same data and port.
func (c *localCluster) server(proc *serverProc, source string) *Server {
	var mu sync.Mutex // guards proc across Restart and Close
	return &Server{
		kind:   KindLocal,
		source: source,
		url:    fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port),
		dir:    c.dir,
		stop: func() error {
			mu.Lock()
			defer mu.Unlock()
			stopErr := proc.stop(c.logf)
			if err := os.RemoveAll(c.dir); err != nil {
				return errors.Join(stopErr, fmt.Errorf("pgserver: remove %s: %w", c.dir, err))
			}
			return stopErr
		},
		kill: func() {
			mu.Lock()
			defer mu.Unlock()
			proc.kill()
		},
		freeze: func(on bool) {
			mu.Lock()
			defer mu.Unlock()
			sig := syscall.SIGCONT
			if on {
				sig = syscall.SIGSTOP
			}
			proc.signalCluster(sig)
		},
		restart: func(ctx context.Context, immediate bool) error {
			mu.Lock()
			defer mu.Unlock()
			if immediate {
				proc.crash()
			} else if err := proc.stop(c.logf); err != nil {
				return err
			}
			p, err := c.start(ctx)
			if err != nil {
				return fmt.Errorf("pgserver: restart: %w", err)
			}
			proc = p
			return nil
		},
	}
}

// serverChown gives the tree at dir to the user of cred; nil cred is a no-op.
func serverChown(dir string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(cred.Uid), int(cred.Gid))
	})
}

// serverSearchable reports whether any user can reach into dir.
func serverSearchable(dir string) bool {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}

func serverFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverProc is a running postmaster.
type serverProc struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returns
	waitErr error         // valid after exited is closed
	logPath string
	dataDir string // as /proc/<pid>/cwd names it: symbolic links resolved
}

func serverStartPostgres(ctx context.Context, bin serverLocalBin, cred *syscall.Credential, dir, dataDir, sockDir, logPath string, port int, durable bool) (*serverProc, error) {
	args := []string{
		"-D", dataDir,
		"-p", strconv.Itoa(port),
		"-k", sockDir,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections=300",
	}
	if !durable {
		args = append(args, "-c", "fsync=off", "-c", "full_page_writes=off")
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	defer logFile.Close() // the child keeps its own descriptor
	offset, _ := logFile.Seek(0, io.SeekEnd)

	// Not CommandContext: the server must outlive ctx, until Close.
	cmd := exec.Command(filepath.Join(bin.dir, "postgres"), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = serverSysProcAttr(cred)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	p := &serverProc{cmd: cmd, exited: make(chan struct{}), logPath: logPath, dataDir: dataDir}
	if resolved, err := filepath.EvalSymlinks(dataDir); err == nil {
		p.dataDir = resolved
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
	if err := p.waitReady(ctx, url, offset); err != nil {
		p.stop(func(string, ...any) {})
		return nil, err
	}
	return p, nil
}

func (p *serverProc) waitReady(ctx context.Context, url string, logOffset int64) error {
	ctx, cancel := context.WithTimeout(ctx, serverReadyTimeout)
	defer cancel()
	var lastErr error
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("postgres exited during startup (%v):\n%s", p.waitErr, p.logTail(logOffset))
		default:
		}
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		lastErr = err
		select {
		case <-p.exited:
			// Loop once more to report the exit with the log.
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last error: %v)\n%s", ctx.Err(), lastErr, p.logTail(logOffset))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop asks for a fast shutdown (SIGINT), which rolls back open transactions
// and disconnects clients, then kills the cluster's processes if that takes
// too long. After kill, it kills what the postmaster left: its orphaned
// backends.
func (p *serverProc) stop(logf func(string, ...any)) error {
	select {
	case <-p.exited:
		p.killCluster()
		return nil
	default:
	}
	pid := p.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("pgserver: signal postgres: %w", err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(serverStopTimeout):
	}
	logf("postgres did not shut down within %s; killing it", serverStopTimeout)
	p.signalCluster(syscall.SIGKILL)
	<-p.exited
	p.killCluster()
	return nil
}

// kill kills the postmaster alone (SIGKILL), as an operator's kill -9 or
// the OOM killer would: its backends live on, orphaned, until they notice.
func (p *serverProc) kill() {
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

// crash stops the postmaster the way a crash does: SIGQUIT makes every
// process exit at once, without a checkpoint, leaving recovery to the next
// start. What a postmaster killed alone left behind is killed too.
func (p *serverProc) crash() {
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGQUIT)
	select {
	case <-p.exited:
	case <-time.After(serverStopTimeout):
		p.signalCluster(syscall.SIGKILL)
		<-p.exited
	}
	p.killCluster()
}

// killCluster kills, once the postmaster has exited, every process left
// in its data directory, and waits until none is: a killed process holds
// the cluster's shared memory until it has exited, and a postmaster
// started before then refuses to start ("pre-existing shared memory block
// is still in use").
func (p *serverProc) killCluster() {
	for deadline := time.Now().Add(serverStopTimeout); p.signalCluster(syscall.SIGKILL) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// signalCluster sends sig to the postmaster and to every process that
// works in its data directory: its children, which PostgreSQL puts in
// sessions of their own (no process group holds them all), and those
// orphaned when it died alone. It returns how many of the latter it found
// (a process that has exited has no working directory any more).
func (p *serverProc) signalCluster(sig syscall.Signal) (others int) {
	_ = syscall.Kill(p.cmd.Process.Pid, sig)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == p.cmd.Process.Pid {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == p.dataDir {
			_ = syscall.Kill(pid, sig)
			others++
		}
	}
	return others
}

func (p *serverProc) logTail(offset int64) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no server log: " + err.Error() + ")"
	}
	if offset > 0 && offset <= int64(len(b)) {
		b = b[offset:]
	}
	return serverTail(b)
}

// serverTail keeps the last lines of tool output, where the cause usually is.
func serverTail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return "    (no output)"
	}
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return "    " + string(bytes.Join(lines, []byte("\n    ")))
}
