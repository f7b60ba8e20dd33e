package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pglimit/cooldown/pglimit"
)

// errNoRedis says how to get the peer's server.
var errNoRedis = errors.New("redis-server not found on PATH: install it (Debian/Ubuntu: apt-get install redis-server; " +
	"the load test starts its own on a free loopback port and leaves any system service alone), " +
	"or leave " + peerName + " out of -strategies")

const (
	redisReadyTimeout = 10 * time.Second
	redisStopTimeout  = 10 * time.Second
	redisPortAttempts = 3
)

// redisServer is the peer's Redis: a redis-server process of our own on a
// loopback port, without persistence (no RDB snapshots, no append-only
// file), as Redis usually runs in front of a rate limiter. It lives for the
// whole run; every run on it starts from an empty database.
type redisServer struct {
	addr    string
	version string
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
	admin   *redis.Client // empties the database between runs
}

// startRedis starts redis-server, retrying on another port when the free
// one it picked was taken meanwhile.
func startRedis(ctx context.Context) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedis
	}
	var errs []error
	for range redisPortAttempts {
		s, err := startRedisOnce(ctx, bin)
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("start redis-server: %w", errors.Join(errs...))
}

func startRedisOnce(ctx context.Context, bin string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pglimit-loadtest-redis-")
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "redis.log")
	// Arguments, not a config file: nothing to write but the log.
	cmd := exec.Command(bin,
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", logPath, "--daemonize", "no")
	// Its own process group: a Ctrl-C to the load test must not stop the
	// server before the load test has finished with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, cmd: cmd, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	s.admin = s.client(1)
	if err := s.waitReady(ctx); err != nil {
		log, _ := os.ReadFile(logPath)
		_ = s.close()
		return nil, fmt.Errorf("%w; its log:\n%s", err, strings.TrimSpace(string(log)))
	}
	return s, nil
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitReady pings until the server answers, it exits, or the time is up,
// and reads its version.
func (s *redisServer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, redisReadyTimeout)
	defer cancel()
	for {
		if err := s.admin.Ping(ctx).Err(); err == nil {
			break
		}
		select {
		case <-s.exited:
			return errors.New("redis-server exited")
		case <-ctx.Done():
			return fmt.Errorf("redis-server did not answer within %s", redisReadyTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
	info, err := s.admin.Info(ctx, "server").Result()
	if err != nil {
		return err
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			s.version = v
		}
	}
	return nil
}

// close stops the server and removes its directory.
func (s *redisServer) close() error {
	_ = s.admin.Close()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case <-s.exited:
	case <-time.After(redisStopTimeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		err = fmt.Errorf("redis-server ignored SIGTERM for %s and was killed", redisStopTimeout)
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

// about describes the peer for the report.
func (s *redisServer) about() string {
	return fmt.Sprintf("%s %s (go-redis %s) on redis-server %s started by the load test on 127.0.0.1, "+
		"without persistence (--save \"\" --appendonly no), as Redis usually runs for a rate limiter: "+
		"a restart forgets every cooldown; %[1]s-aof-everysec and %[1]s-aof-always run on the same server with its "+
		"append-only file on (appendfsync everysec, always)", peerName, moduleVersion("github.com/go-redis/redis_rate/v10"),
		moduleVersion("github.com/redis/go-redis/v9"), s.version)
}

// moduleVersion is the version of a module built into this binary.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				return m.Version
			}
		}
	}
	return "(unknown version)"
}

// open empties the database, as the PostgreSQL runs start from empty
// tables, sets the append-only file v runs with, and opens one client per
// instance with every connection open.
func (s *redisServer) open(ctx context.Context, v variant, instances, conns int) (session, error) {
	if err := s.admin.FlushAll(ctx).Err(); err != nil {
		return nil, fmt.Errorf("empty Redis: %w", err)
	}
	if err := s.persist(ctx, v.Fsync); err != nil {
		return nil, err
	}
	rs := &redisSession{size: conns, admin: s.admin}
	for range instances {
		c := s.client(conns)
		rs.clients = append(rs.clients, c)
		if err := warmRedis(ctx, c, conns); err != nil {
			rs.close()
			return nil, err
		}
	}
	return rs, nil
}

// persist turns the append-only file on with the given appendfsync
// ("everysec" or "always"), or off for "".
func (s *redisServer) persist(ctx context.Context, fsync string) error {
	settings := []string{"appendonly", "no"}
	if fsync != "" {
		settings = []string{"appendfsync", fsync, "appendonly", "yes"}
	}
	for i := 0; i < len(settings); i += 2 {
		if err := s.admin.ConfigSet(ctx, settings[i], settings[i+1]).Err(); err != nil {
			return fmt.Errorf("redis CONFIG SET %s %s: %w", settings[i], settings[i+1], err)
		}
	}
	return nil
}

// client returns a client of the server with a pool of conns connections.
func (s *redisServer) client(conns int) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:     s.addr,
		PoolSize: conns,
		// Both are handshakes newer than Debian's Redis; the second, left
		// to fail and switch itself off, races in go-redis v9.23.
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
}

// warmRedis opens n connections of c up front, as warm does for a pool.
func warmRedis(ctx context.Context, c *redis.Client, n int) error {
	conns := make([]*redis.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			conns[i] = c.Conn()
			errs[i] = conns[i].Ping(ctx).Err()
		})
	}
	wg.Wait()
	for _, cn := range conns {
		_ = cn.Close() // back to the pool
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("open Redis connections: %w", err)
	}
	return nil
}

type redisSession struct {
	clients []*redis.Client
	size    int
	admin   *redis.Client // the server's, for its statistics
}

func (s *redisSession) conns() int { return s.size }

// deciders runs the Redis floor (PING) or the peer. The cooldown is GCRA
// with an emission interval of one cooldown and a burst of 1, as
// pglimit's is (docs/limits.md): redis_rate's Limit{Rate: 1, Period:
// cooldown, Burst: 1}. Where the scenario gives the peer limits, it checks
// them as peerLimits says.
func (s *redisSession) deciders(v variant, cooldown time.Duration, limits []pglimit.Limit) ([]decideFunc, error) {
	out := make([]decideFunc, len(s.clients))
	checks := []peerLimit{{limit: redis_rate.Limit{Rate: 1, Period: cooldown, Burst: 1}}}
	if limits != nil {
		checks = peerLimits(limits)
	}
	for i, c := range s.clients {
		switch {
		case v.Name == pingFloorName:
			out[i] = func(ctx context.Context, _ string) outcome {
				err := c.Ping(ctx).Err()
				return outcome{allowed: err == nil, err: err}
			}
		case v.Redis:
			lim := redis_rate.NewLimiter(c)
			out[i] = func(ctx context.Context, key string) outcome {
				for _, pl := range checks {
					res, err := lim.Allow(ctx, key+pl.suffix, pl.limit)
					if err != nil {
						return outcome{err: err}
					}
					if res.Allowed == 0 {
						return outcome{}
					}
				}
				return outcome{allowed: true}
			}
		default:
			return nil, fmt.Errorf("%s does not run on Redis", v.Name)
		}
	}
	return out, nil
}

// peerLimit is one of the peer's calls for a decision: a redis_rate limit
// on the key with suffix appended.
type peerLimit struct {
	limit  redis_rate.Limit
	suffix string
}

// peerLimits returns how the peer checks limits: one redis_rate call per
// limit, in order, each only when the ones before it admitted, since
// redis_rate checks one limit per call and has no form that checks several
// at once. A later limit's refusal leaves the earlier ones charged (pglimit
// decides every limit of a key on one row, all or nothing); the scenarios
// that give the peer several limits admit every request. With several
// limits each keeps its own Redis key, the call's key and ":<name>".
//
// redis_rate is GCRA only: a GCRA limit is taken as it is, and a window of
// Rate per Period becomes GCRA of Rate per Period with a burst of Rate. It
// admits as many at once as the window, and then refills smoothly rather
// than at the window's end: at most Rate + floor(w*Rate/Period) in any
// interval w, within the bound the clients' check holds a window to,
// Rate*(floor(w/Period)+2).
func peerLimits(limits []pglimit.Limit) []peerLimit {
	out := make([]peerLimit, len(limits))
	for i, l := range limits {
		burst := l.Burst
		if l.Algorithm != pglimit.GCRA {
			burst = l.Rate
		}
		out[i].limit = redis_rate.Limit{Rate: l.Rate, Period: l.Period, Burst: max(burst, 1)}
		if len(limits) > 1 {
			out[i].suffix = ":" + l.Name
		}
	}
	return out
}

// scripts counts the scripts the server has run (EVAL and EVALSHA, by its
// command statistics, less those that failed, such as an EVALSHA that
// found no script): redis_rate runs one per call.
func (s *redisSession) scripts(ctx context.Context) (int64, error) {
	info, err := s.admin.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	var n int64
	for line := range strings.Lines(info) {
		cmd, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (cmd != "cmdstat_eval" && cmd != "cmdstat_evalsha") {
			continue
		}
		for kv := range strings.SplitSeq(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			x, err := strconv.ParseInt(v, 10, 64)
			switch {
			case k != "calls" && k != "failed_calls":
			case err != nil:
				return 0, fmt.Errorf("redis %s: %q: %w", cmd, kv, err)
			case k == "calls":
				n += x
			default:
				n -= x
			}
		}
	}
	return n, nil
}

func (s *redisSession) close() {
	for _, c := range s.clients {
		_ = c.Close()
	}
}
