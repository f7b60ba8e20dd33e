package pgserver

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Containers are started by the pgcontainer command (internal/pgcontainer,
// a module of its own that requires testcontainers-go), run with go run from
// its directory. The library's module thus never requires testcontainers,
// and neither does any module that imports the library.
const (
	// A first go run compiles testcontainers, which takes a while on a
	// loaded machine; later runs come from the build cache.
	containerStartTimeout = 5 * time.Minute
	// How long Close waits for the command to remove its container.
	containerRemoveTimeout = time.Minute
)

// launcherDir finds the pgcontainer module beside this package's source.
func launcherDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", errors.New("the container launcher is found through this package's source path, which a -trimpath build does not keep")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "pgcontainer")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		// A module downloaded from a proxy leaves nested modules out.
		return "", fmt.Errorf("the container launcher module is not in this copy of the source (%s): use a checkout of the repository, local binaries or a database URL", dir)
	}
	return dir, nil
}

// dockerEngineAnswers pings the engine the way docker and testcontainers
// find it by default: DOCKER_HOST, else the usual socket paths. Any HTTP
// answer counts, so that a TLS endpoint is not mistaken for none.
func dockerEngineAnswers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, serverDockerProbeTimeout)
	defer cancel()
	network, addr, err := dockerEndpoint()
	if err != nil {
		return err
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://docker/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", network, addr, err)
	}
	resp.Body.Close()
	return nil
}

func dockerEndpoint() (network, addr string, err error) {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		u, err := url.Parse(h)
		if err != nil {
			return "", "", fmt.Errorf("DOCKER_HOST: %w", err)
		}
		switch u.Scheme {
		case "unix":
			return "unix", u.Path, nil
		case "tcp":
			return "tcp", u.Host, nil
		default:
			return "", "", fmt.Errorf("DOCKER_HOST %q: only unix:// and tcp:// are probed; set PGLIMIT_TEST_POSTGRES=docker to skip the probe", h)
		}
	}
	home, _ := os.UserHomeDir()
	candidates := []string{"/var/run/docker.sock"}
	if home != "" {
		// Docker Desktop, Colima, Rancher Desktop.
		candidates = append(candidates,
			filepath.Join(home, ".docker", "run", "docker.sock"),
			filepath.Join(home, ".colima", "default", "docker.sock"),
			filepath.Join(home, ".rd", "docker.sock"))
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "docker.sock")) // rootless
	}
	for _, p := range candidates {
		if _, err := os.Stat(p); err == nil {
			return "unix", p, nil
		}
	}
	return "", "", fmt.Errorf("DOCKER_HOST is unset and no socket at %s", strings.Join(candidates, ", "))
}

// containerProc is a running pgcontainer command.
type containerProc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string   // its stdout, a line at a time; closed at EOF
	exited  chan struct{} // closed once cmd.Wait returns
	waitErr error         // valid after exited is closed

	mu     sync.Mutex
	stderr []string // the last lines, for error messages
}

func startDockerServer(ctx context.Context, cfg *Config, logf func(string, ...any)) (*Server, error) {
	dir, err := launcherDir()
	if err != nil {
		return nil, err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("the container launcher runs with go run, and there is no go command on PATH: %w", err)
	}
	image := cmp.Or(cfg.Image, DefaultImage)
	args := []string{"run", ".", "-image", image}
	if cfg.Durable {
		args = append(args, "-durable")
	}
	if cfg.HostNetwork {
		port, err := serverFreePort()
		if err != nil {
			return nil, err
		}
		args = append(args, "-network", "host", "-port", strconv.Itoa(port))
	}
	network := "a published port"
	if cfg.HostNetwork {
		network = "host networking"
	}
	logf("starting a PostgreSQL container from image %s through testcontainers-go (%s; go run in %s)", image, network, dir)

	// Not CommandContext: the container must outlive ctx, until Close.
	cmd := exec.Command(goBin, args...)
	cmd.Dir = dir
	// Its own module, whatever go.work the caller's tree has.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	// Own process group: Ctrl-C in a terminal reaches only our process,
	// which then closes stdin, and the command removes the container.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the container launcher: %w", err)
	}
	p := &containerProc{cmd: cmd, stdin: stdin, lines: make(chan string, 4), exited: make(chan struct{})}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.keep(sc.Text())
			logf("container: %s", sc.Text())
		}
	}()
	go func() {
		readers.Wait() // Wait must not run before the pipes are drained
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()

	startCtx, cancel := context.WithTimeout(ctx, containerStartTimeout)
	defer cancel()
	u, err := p.await(startCtx)
	if err == nil {
		err = waitConnect(startCtx, u)
	}
	if err != nil {
		_ = p.close()
		return nil, err
	}
	logf("PostgreSQL container ready at %s", redact(u))
	srv := &Server{
		kind:   KindDocker,
		source: "testcontainers, docker image " + image,
		url:    u,
		stop:   p.close,
	}
	var mu sync.Mutex // one restart at a time
	srv.restart = func(ctx context.Context, immediate bool) error {
		mu.Lock()
		defer mu.Unlock()
		command := "restart\n"
		if immediate {
			command = "crash\n"
		}
		if _, err := io.WriteString(p.stdin, command); err != nil {
			return fmt.Errorf("pgserver: restart container: %w", err)
		}
		u, err := p.await(ctx)
		if err == nil {
			err = waitConnect(ctx, u)
		}
		if err != nil {
			return fmt.Errorf("pgserver: restart container: %w", err)
		}
		srv.mu.Lock()
		srv.url = u
		srv.mu.Unlock()
		return nil
	}
	return srv, nil
}

// await returns the URL of the next "url" line.
func (p *containerProc) await(ctx context.Context) (string, error) {
	select {
	case line, ok := <-p.lines:
		switch {
		case !ok:
			<-p.exited
			return "", fmt.Errorf("container launcher exited (%v):\n%s", p.waitErr, p.tail())
		case strings.HasPrefix(line, "url "):
			return strings.TrimPrefix(line, "url "), nil
		default:
			return "", fmt.Errorf("container launcher: %s\n%s", strings.TrimPrefix(line, "error "), p.tail())
		}
	case <-ctx.Done():
		return "", fmt.Errorf("container not ready: %w\n%s", ctx.Err(), p.tail())
	}
}

// close closes the command's stdin, on which it removes the container and
// exits; if it does not, its process group is killed.
func (p *containerProc) close() error {
	_ = p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(containerRemoveTimeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
		return fmt.Errorf("pgserver: the container launcher did not exit within %s; killed, the container may be left:\n%s", containerRemoveTimeout, p.tail())
	}
	if p.waitErr != nil {
		return fmt.Errorf("pgserver: container launcher: %w\n%s", p.waitErr, p.tail())
	}
	return nil
}

func (p *containerProc) keep(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stderr = append(p.stderr, line)
	if len(p.stderr) > 20 {
		p.stderr = p.stderr[len(p.stderr)-20:]
	}
}

func (p *containerProc) tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return serverTail([]byte(strings.Join(p.stderr, "\n")))
}

// waitConnect waits until the server at u takes connections: after a
// restart the container's log already holds the ready lines of the
// previous start.
func waitConnect(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, serverReadyTimeout)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(context.Background())
			if err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// redact hides the password of a URL for log lines.
func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}
