package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
)

// Environment variables read by [Main] and the helpers.
const (
	// EnvURL names a server to use instead of starting one. Tests create
	// and drop their own schemas in its database.
	EnvURL = "PGLIMIT_TEST_DATABASE_URL"

	// EnvPrefer forces a source: "docker" or "local".
	EnvPrefer = "PGLIMIT_TEST_POSTGRES"

	// EnvPGBin names a directory holding initdb and postgres, to test
	// against another PostgreSQL major than the installed one.
	EnvPGBin = "PGLIMIT_TEST_PGBIN"

	// EnvDockerImage names the container image to use instead of the
	// default; it must behave like the official postgres image.
	EnvDockerImage = "PGLIMIT_TEST_DOCKER_IMAGE"

	// EnvDockerNetwork set to "host" runs the container on the host's
	// network, listening on 127.0.0.1 on a port of its own, for engines
	// that cannot program bridge networks (see the package doc).
	EnvDockerNetwork = "PGLIMIT_TEST_DOCKER_NETWORK"
)

// serverStartTimeout bounds a server start: a first container start
// compiles the container launcher, or pulls an image.
const serverStartTimeout = 5 * time.Minute

// serverConfig maps the environment onto the launcher's configuration.
func serverConfig() *pgserver.Config {
	return &pgserver.Config{
		Prefer:      os.Getenv(EnvPrefer),
		BinDir:      os.Getenv(EnvPGBin),
		Image:       os.Getenv(EnvDockerImage),
		HostNetwork: os.Getenv(EnvDockerNetwork) == "host",
	}
}

var shared struct {
	sync.Mutex
	inMain bool
	srv    *pgserver.Server
	err    error

	bouncer    *pgserver.PgBouncer
	bouncerErr error
}

// Main runs a package's tests with a shared PostgreSQL server, started on
// first use and stopped afterwards, and then checks that no goroutine was
// left behind. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testdb.Main(m) }
func Main(m *testing.M) {
	shared.Lock()
	shared.inMain = true
	shared.Unlock()

	code := m.Run()

	shared.Lock()
	if shared.bouncer != nil {
		if err := shared.bouncer.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: stopping PgBouncer: %v\n", err)
			code = cmpCode(code)
		}
	}
	if shared.srv != nil {
		if err := shared.srv.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: stopping PostgreSQL: %v\n", err)
			code = cmpCode(code)
		}
	}
	shared.Unlock()

	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintf(os.Stderr, "testdb: goroutines left behind: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func cmpCode(code int) int {
	if code == 0 {
		return 1
	}
	return code
}

// URL returns the connection URL of the shared test server, starting it on
// first use. The test fails with instructions when no server can be had.
func URL(tb testing.TB) string {
	tb.Helper()
	url, err := ServerURL()
	if err != nil {
		tb.Fatal(err)
	}
	return url
}

// ServerURL is [URL] for code that has no testing.TB, such as examples.
func ServerURL() (string, error) {
	shared.Lock()
	defer shared.Unlock()
	if !shared.inMain {
		return "", errors.New("testdb: TestMain must call pglimittest.Main(m) (testdb.Main in this repository), so the shared PostgreSQL is stopped after the tests")
	}
	if shared.srv == nil && shared.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), serverStartTimeout)
		defer cancel()
		cfg := serverConfig()
		cfg.URL = os.Getenv(EnvURL)
		cfg.Logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "testdb: "+format+"\n", args...) }
		shared.srv, shared.err = pgserver.Start(ctx, cfg)
		if shared.err == nil {
			var version string
			if version, shared.err = prepare(ctx, shared.srv.URL()); shared.err == nil {
				// Names what the tests ran on, so a log shows it (make test-matrix reads it).
				cfg.Logf("tests run on PostgreSQL %s from %s", version, shared.srv.Source())
			}
		}
		if shared.err != nil {
			shared.err = fmt.Errorf("testdb: no PostgreSQL for tests: %w", shared.err)
		}
	}
	if shared.err != nil {
		return "", shared.err
	}
	return shared.srv.URL(), nil
}

// prepare returns the server's version. It installs nothing: Migrate
// creates btree_gist where it belongs, as it would for a user.
func prepare(ctx context.Context, url string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var version string
	err = conn.QueryRow(ctx, "SHOW server_version").Scan(&version)
	return version, err
}

// Limiter is pglimit.New(db, cfg), failing the test on its error.
func Limiter(tb testing.TB, db pglimit.DB, cfg *pglimit.Config) pglimit.Limiter {
	tb.Helper()
	lim, err := pglimit.New(db, cfg)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	return lim
}

// Pool returns a new pool to the shared server, closed when the test ends.
// Its search_path is empty, so SQL that forgets to qualify a table fails.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return PoolOn(tb, URL(tb))
}

// PoolOn is [Pool] to the server at url.
func PoolOn(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	return newPool(tb, url, pgx.QueryExecModeCacheStatement)
}

// PgBouncerPool returns a new pool that reaches the shared server through a
// shared PgBouncer in transaction pooling mode, closed when the test ends.
// It runs queries with pgx.QueryExecModeExec, since PgBouncer 1.18 (Debian
// 12) cannot keep prepared statements in that mode. Without the pgbouncer
// binary the test stops through [Missing].
func PgBouncerPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	upstream := URL(tb)
	shared.Lock()
	if shared.bouncer == nil && shared.bouncerErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		shared.bouncer, shared.bouncerErr = pgserver.StartPgBouncer(ctx, upstream)
		cancel()
	}
	b, err := shared.bouncer, shared.bouncerErr
	shared.Unlock()
	if err != nil {
		Missing(tb, "%v", err)
	}
	return newPool(tb, b.URL(), pgx.QueryExecModeExec)
}

func newPool(tb testing.TB, url string, mode pgx.QueryExecMode) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	tb.Cleanup(pool.Close)
	Warm(tb, pool)
	return pool
}

// Warm opens every connection of pool up front. Lazily dialled connections
// trickle in and spread a burst of requests out in time, which would let a
// race test pass by accident.
func Warm(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	conns := make([]*pgxpool.Conn, 0, pool.Config().MaxConns)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(context.Background())
		if err != nil {
			tb.Fatalf("testdb: %v", err)
		}
		conns = append(conns, c)
	}
}

// Schema creates a schema with pglimit's migrations applied, dropped when
// the test ends, and returns its name. Tests that each use their own schema
// can run in parallel.
func Schema(tb testing.TB) string {
	tb.Helper()
	return SchemaOn(tb, URL(tb), nil)
}

// SchemaOn is [Schema] on the server at url, with prepare, if not nil, run
// on the schema after the migrations.
func SchemaOn(tb testing.TB, url string, prepare func(ctx context.Context, pool *pgxpool.Pool, schema string) error) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "pglimit_test_" + hex.EncodeToString(b[:])

	pool := PoolOn(tb, url)
	ctx := context.Background()
	if err := pglimit.Migrate(ctx, pool, name); err != nil {
		tb.Fatalf("testdb: migrate schema %s: %v", name, err)
	}
	if prepare != nil {
		if err := prepare(ctx, pool, name); err != nil {
			tb.Fatalf("testdb: prepare schema %s: %v", name, err)
		}
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("testdb: drop schema %s: %v", name, err)
		}
	})
	return name
}

// Server is a PostgreSQL server that one test owns ([OwnServer]).
type Server struct{ srv *pgserver.Server }

// URL returns a superuser connection URL to the "postgres" database. After
// [Server.Restart] of a container, the port may have changed.
func (s *Server) URL() string { return s.srv.URL() }

// Restart stops the server and starts it again on the same data. With
// immediate it stops the way a crash does (no checkpoint, recovery at
// start); otherwise it does a fast shutdown. Open connections are cut
// either way.
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	return s.srv.Restart(ctx, immediate)
}

// Freeze stops every process of the server (SIGSTOP) until [Server.Thaw],
// as a host that stops answering: connections stay open, and nothing comes
// back on them. Only a server of local binaries can be frozen.
func (s *Server) Freeze() error { return s.srv.Freeze() }

// Thaw lets a frozen server go on (SIGCONT).
func (s *Server) Thaw() error { return s.srv.Thaw() }

// OwnMigratedServer is [OwnServer] with pglimit's tables in its schema
// public.
func OwnMigratedServer(tb testing.TB) *Server {
	tb.Helper()
	srv := OwnServer(tb)
	if err := pglimit.Migrate(tb.Context(), ServerPool(tb, srv, 2), "public"); err != nil {
		tb.Fatalf("testdb: migrate: %v", err)
	}
	return srv
}

// Frozen freezes srv ([Server.Freeze]), or stops the test through
// [Missing] where it cannot be, and returns its thaw, which the test may
// call early: it runs once, at the latest when the test ends.
func Frozen(tb testing.TB, srv *Server) (thaw func()) {
	tb.Helper()
	if err := srv.Freeze(); err != nil {
		Missing(tb, "a frozen server needs one of local binaries (%s=local): %v", EnvPrefer, err)
	}
	thaw = sync.OnceFunc(func() {
		if err := srv.Thaw(); err != nil {
			tb.Error(err)
		}
	})
	tb.Cleanup(thaw)
	return thaw
}

// OwnServer starts a server for the calling test alone, which it may
// restart or crash ([Server.Restart]); it is closed when the test ends. It
// never uses [EnvURL]: a borrowed server cannot be restarted.
func OwnServer(tb testing.TB) *Server {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), serverStartTimeout)
	defer cancel()
	cfg := serverConfig()
	cfg.Durable = true
	srv, err := pgserver.Start(ctx, cfg)
	if err != nil {
		tb.Fatalf("testdb: a server of its own for this fault test: %v", err)
	}
	tb.Cleanup(func() {
		if err := srv.Close(); err != nil {
			tb.Errorf("testdb: %v", err)
		}
	})
	return &Server{srv: srv}
}

// ServerPool returns a pool of maxConns connections to srv that follows its
// URL across restarts, closed when the test ends.
func ServerPool(tb testing.TB, srv *Server, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), ServerPoolConfig(tb, srv, maxConns))
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// ServerPoolConfig is ServerPool's configuration, for a test to add to
// before it opens the pool.
func ServerPoolConfig(tb testing.TB, srv *Server, maxConns int32) *pgxpool.Config {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(srv.URL())
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	cfg.MaxConns = maxConns
	cfg.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		now, err := pgx.ParseConfig(srv.URL())
		if err != nil {
			return err
		}
		cc.Host, cc.Port = now.Host, now.Port
		return nil
	}
	return cfg
}

// AppPool opens a pool of cfg (a copy) whose connections have the
// application_name app ([AppName]), closed when the test ends.
func AppPool(tb testing.TB, cfg *pgxpool.Config, app string) *pgxpool.Pool {
	tb.Helper()
	cfg = cfg.Copy()
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testdb: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// AppName returns an application_name of its own for a test's pools to
// set on their connections (ConnConfig.RuntimeParams), by which [Quiesce]
// tells the server's backends of the test from any other's.
func AppName(tb testing.TB) string {
	tb.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "pglimit_test_" + hex.EncodeToString(b[:])
}

// Quiesce waits, up to a minute, until the server that pools reach has no
// backend of application_name app beyond the connections the pools hold
// open. A backend whose client gave up on it during a fault (its deadline
// passed on a frozen server, a silent connection, a locked row) goes on
// with the statement it was sent once the fault ends, and exits only
// once it has run it and read the connection's end: after Quiesce, no
// statement of such a caller can still commit. It fails tb if the
// backends do not go.
func Quiesce(tb testing.TB, app string, pools ...*pgxpool.Pool) {
	tb.Helper()
	var backends, open int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		open = 0
		for _, p := range pools {
			open += int(p.Stat().TotalConns())
		}
		err := pools[0].QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&backends)
		switch {
		case err == nil && backends <= open:
			return
		case time.Now().After(deadline):
			tb.Fatalf("testdb: %d backends of %s after a minute, %d connections open (last error %v)", backends, app, open, err)
		}
	}
}

// Missing stops a test that needs a component this machine lacks, with how
// to provide it. In CI (the CI environment variable set, as CI services
// and .ci/run do) the test fails, so nothing goes unproven quietly; on a
// developer's machine it is skipped with the same message, so that
// `make test` stays usable with Docker alone.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf(format, args...)
	}
	tb.Skipf("SKIPPED, not in CI: "+format, args...)
}

// Slow keeps t out of the quick tier: go test -short (make test-short)
// skips it, make test runs it. For a test that restarts, crashes or cuts
// off a server, fails over, drains a backlog, or runs a whole suite once
// more in another setting.
func Slow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("slow: the quick tier (-short) skips it; make test runs it")
	}
}

// Counted is a pglimit.DB that counts the statements sent through it,
// for a test that asserts how many an operation sends.
type Counted struct {
	pglimit.DB
	n atomic.Int64
}

// QueryRow counts the statement and sends it.
func (c *Counted) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n.Add(1)
	return c.DB.QueryRow(ctx, sql, args...)
}

// Exec counts the statement and sends it.
func (c *Counted) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n.Add(1)
	return c.DB.Exec(ctx, sql, args...)
}

// Statements is how many statements were sent so far.
func (c *Counted) Statements() int64 { return c.n.Load() }

// WaitsForLock returns once a session of the current database waits for
// a lock in a statement whose text contains match; it fails the test if
// none does within within. The server has no event to wait on, so it asks
// pg_stat_activity every 10 ms.
func WaitsForLock(tb testing.TB, db pglimit.DB, match string, within time.Duration) {
	tb.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(10 * time.Millisecond) {
		var n int
		err := db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND pid <> pg_backend_pid()`,
			match).Scan(&n)
		switch {
		case err != nil:
			tb.Fatal(err)
		case n > 0:
			return
		case time.Now().After(deadline):
			tb.Fatalf("no statement containing %q waited for a lock within %s", match, within)
		}
	}
}

// Lock has a transaction of its own on pool hold the rows of keys in
// schema's table, each of which must exist, or with no keys the whole
// table, until release is called or the test ends.
func Lock(tb testing.TB, pool *pgxpool.Pool, schema, table string, keys ...string) (release func()) {
	tb.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	release = sync.OnceFunc(func() { _ = tx.Rollback(ctx) })
	tb.Cleanup(release)
	name := pgx.Identifier{schema, table}.Sanitize()
	if len(keys) == 0 {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+name+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			tb.Fatal(err)
		}
		return release
	}
	var n int
	q := "SELECT count(DISTINCT key) FROM (SELECT key FROM " + name + " WHERE key = ANY($1) FOR UPDATE) AS l"
	if err := tx.QueryRow(ctx, q, keys).Scan(&n); err != nil || n != len(keys) {
		tb.Fatalf("lock the rows of %q in %s: %d of %d keys, %v", keys, name, n, len(keys), err)
	}
	return release
}

// Spread has workers goroutines each make calls Allow calls of lim, every
// one on a key of its own, and returns once all have: a load under which
// group commit gathers and its in-flight level moves. An error fails tb.
func Spread(tb testing.TB, lim pglimit.Limiter, workers, calls int) {
	tb.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				if _, err := lim.Allow(context.Background(), fmt.Sprintf("w%d-%d", w, i)); err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// The memory bounds of what a mechanism keeps once its keys have gone
// idle (docs/operations.md, "Bounds every call keeps"): nothing of a key,
// so at most IdleBytesPerKey a key of live heap, with IdleNoise of room
// for what the runtime and a test's pool keep whatever the number of keys.
const (
	IdleBytesPerKey = 16
	IdleNoise       = 1 << 20
)

// LiveHeap is the live heap after a full collection.
func LiveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// Ready runs first, a call that readies a case before its fault, until it
// does not time out, at most 10 times: a case's short Timeout (100 ms,
// say) may run out while a loaded machine dials the pool's first
// connection, which is no part of what the case measures.
func Ready(first func() error) error {
	err := first()
	for try := 1; try < 10 && errors.Is(err, pglimit.ErrTimeout); try++ {
		err = first()
	}
	return err
}

// SyncRepFault makes every commit on admin's server wait for a
// synchronous standby that never comes, and terminates each backend that
// waits, every 2 ms: its transaction has committed locally, and its
// client gets an error. stop ends the fault and returns how many backends
// it terminated.
func SyncRepFault(t testing.TB, admin *pgxpool.Pool) (stop func() int) {
	t.Helper()
	ctx := t.Context()
	syncRep := func(names string) {
		t.Helper()
		if _, err := admin.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '"+names+"'"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
	}
	syncRep("nobody")
	done := make(chan struct{})
	var terminator sync.WaitGroup
	var terminated int
	terminator.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(2 * time.Millisecond):
			}
			var n int
			if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n); err != nil {
				t.Error(err)
				return
			}
			terminated += n
		}
	})
	return func() int {
		close(done)
		terminator.Wait()
		syncRep("")
		return terminated
	}
}
