package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// variant is one column of the comparison: a strategy (with options), a
// floor, the peer, or whatever the demo instances behind an HTTP target run.
type variant struct {
	Name        string
	Strategy    pglimit.Strategy
	Naive       bool   // the naive plain-INSERT Range (naive.go), not a pglimit option
	Seed        bool   // the seed's plain upsert (seedUpsertSQL), not a pglimit option
	AsyncCommit bool   // pglimit.Config.AsyncCommit
	PreBlock    int    // pglimit.Config.PreBlockSize
	Table       string // pglimit.Config.Table; "" for the strategy's default
	Invalidate  bool   // a pglimit.Invalidator per instance for its pre-block
	Floor       bool   // the least work a request can do; it decides nothing
	Redis       bool   // runs on the load test's Redis, not on PostgreSQL
	Fsync       string // the peer's append-only file: "" (none), "everysec" or "always"
	// Limits names the scenario's limit set (scenario.Limits) the variant
	// enforces with Config.Limits; empty is the scenario's cooldown.
	Limits string
}

// preBlockSize is the pre-block of the *-preblock variants: room for every
// key of the many-keys scenario.
const preBlockSize = 100_000

// Names of the floors and the peer in reports.
const (
	// floorName is the same instances doing the least work a request can
	// do: SELECT 1 in-process, GET /healthz over HTTP.
	floorName = "floor"
	// writeFloorName is the cheapest durable write an admission could make:
	// an UPDATE of one pre-seeded row by primary key, on the limiter's own
	// table as migrated.
	writeFloorName = "floor-write"
	// pingFloorName is a Redis round trip: PING.
	pingFloorName = "floor-redis"
	// peerName is the limiter a Go team would pick instead: redis_rate.
	peerName = "redis_rate"
)

var (
	floor      = variant{Name: floorName, Floor: true}
	writeFloor = variant{Name: writeFloorName, Floor: true, Strategy: pglimit.Upsert} // its table
	pingFloor  = variant{Name: pingFloorName, Floor: true, Redis: true}
	peer       = variant{Name: peerName, Redis: true}
	// The peer with Redis's append-only file, flushed every second and at
	// every write: the durability classes of AsyncCommit and of pglimit's
	// default.
	peerEverysec = variant{Name: peerName + "-aof-everysec", Redis: true, Fsync: "everysec"}
	peerAlways   = variant{Name: peerName + "-aof-always", Redis: true, Fsync: "always"}
)

// naive is the Range strategy with a plain INSERT (naive.go).
var naive = variant{Name: "range-naive", Strategy: pglimit.Range, Naive: true}

// seedUpsert is the statement the project began with, on the Upsert table:
// the database's own rate for one admission, a ceiling for the library's.
var seedUpsert = variant{Name: "seed-upsert", Strategy: pglimit.Upsert, Seed: true}

// seedUpsertSQL is seedUpsert's statement, given schema and table: INSERT
// ... ON CONFLICT DO UPDATE with the cooldown's guard, prepared by pgx; a
// row comes back only when it admits. $3 is the cooldown in µs.
const seedUpsertSQL = `INSERT INTO %s.%s AS t (namespace, key, expires_at)
VALUES ($1, $2, now() + $3::bigint * interval '1 microsecond')
ON CONFLICT (namespace, key) DO UPDATE SET expires_at = excluded.expires_at
WHERE t.expires_at <= now()
RETURNING true`

// allVariants lists what a run can compare, in report order: the peer, the
// strategies as they are by default, the naive Range, the seed upsert, then each
// strategy with asynchronous commit and with the local pre-block, then
// Upsert with the library's other levers.
func allVariants() []variant {
	vs := make([]variant, 0, 3*len(pglimit.Strategies())+9)
	vs = append(vs, peer, peerEverysec, peerAlways)
	for _, s := range pglimit.Strategies() {
		vs = append(vs, strategyVariant(s))
	}
	vs = append(vs, naive, seedUpsert)
	for _, s := range pglimit.Strategies() {
		vs = append(vs, variant{Name: string(s) + "-async", Strategy: s, AsyncCommit: true})
	}
	for _, s := range pglimit.Strategies() {
		vs = append(vs, variant{Name: string(s) + "-preblock", Strategy: s, PreBlock: preBlockSize})
	}
	vs = append(vs, variant{Name: "upsert-unlogged", Strategy: pglimit.Upsert, Table: "pglimit_upsert_unlogged"},
		variant{Name: "upsert-preblock-inv", Strategy: pglimit.Upsert, PreBlock: preBlockSize, Invalidate: true})
	return vs
}

// floors returns the floors measured beside vs: the read floor always, the
// write floor in-process, the Redis floor when the peer runs.
func floors(vs []variant, inProcess bool) []variant {
	out := []variant{floor}
	if inProcess {
		out = append(out, writeFloor)
	}
	if slices.ContainsFunc(vs, func(v variant) bool { return v.Redis }) {
		out = append(out, pingFloor)
	}
	return out
}

// namespace is the limiters' namespace, and the write floor's.
const namespace = "loadtest"

// writeFloorSQL is the write floor's statement, given schema and table. A
// plain UPDATE of a row that exists is the cheapest durable write by primary
// key: no speculative insertion and no conflict check, as an upsert would
// add, and no new row. It sets the column an admission sets, so it pays for
// the same index entries and WAL.
const writeFloorSQL = `UPDATE %s.%s SET expires_at = now() WHERE namespace = $1 AND key = $2`

// decideFunc makes one decision for key on one instance.
type decideFunc func(ctx context.Context, key string) outcome

// target is what the load is sent to.
type target interface {
	// open brings up instances app instances of v sized for conns
	// concurrent requests each, fresh for every run so that runs do not
	// share state.
	open(ctx context.Context, v variant, instances, conns int) (session, error)
}

// session is one run's instances.
type session interface {
	// deciders returns one decideFunc per instance for v, enforcing
	// limits when given, else the cooldown.
	deciders(v variant, cooldown time.Duration, limits []pglimit.Limit) ([]decideFunc, error)
	// conns is the connections each instance may use.
	conns() int
	close()
}

// leveled is a session whose limiters gather calls in statements: it
// reports the in-flight level each instance's limiter is at.
type leveled interface {
	levels() []int
}

// inProcess runs the library itself: each instance is its own pgxpool
// pool, as two replicas of an application would have. The peer's instances
// are go-redis clients instead.
type inProcess struct {
	cfg      *pgxpool.Config
	maxConns int               // the most one instance may open
	schemas  map[string]string // variant name to schema
	redis    *redisServer      // nil when the peer does not run
}

func (t *inProcess) open(ctx context.Context, v variant, instances, conns int) (session, error) {
	if v.Redis {
		return t.redis.open(ctx, v, instances, conns)
	}
	s := &poolSession{schemas: t.schemas, size: min(conns, t.maxConns)}
	for range instances {
		cfg := t.cfg.Copy()
		cfg.MaxConns = int32(s.size)
		cfg.MinConns = 0
		p, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			s.close()
			return nil, err
		}
		s.pools = append(s.pools, p)
		if err := warm(ctx, p); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

// warm opens every connection of p up front, in parallel, so that
// connection set-up is not measured as decision latency.
func warm(ctx context.Context, p *pgxpool.Pool) error {
	n := int(p.Config().MaxConns)
	conns := make([]*pgxpool.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { conns[i], errs[i] = p.Acquire(ctx) })
	}
	wg.Wait()
	var first error
	for i, c := range conns {
		if c != nil {
			c.Release()
		}
		if first == nil && errs[i] != nil {
			first = fmt.Errorf("open connection %d of %d: %w", i+1, n, errs[i])
		}
	}
	return first
}

type poolSession struct {
	watch        []*levelWatch // one per limiter made, in instance order
	pools        []*pgxpool.Pool
	schemas      map[string]string
	size         int
	invalidators []*pglimit.Invalidator
}

func (s *poolSession) conns() int { return s.size }

func (s *poolSession) deciders(v variant, cooldown time.Duration, limits []pglimit.Limit) ([]decideFunc, error) {
	if limits != nil {
		cooldown = 0
	}
	out := make([]decideFunc, len(s.pools))
	update := fmt.Sprintf(writeFloorSQL, ident(s.schemas[writeFloorName]), ident(tableOf(writeFloor)))
	for i, p := range s.pools {
		switch v.Name {
		case floorName:
			out[i] = func(ctx context.Context, _ string) outcome {
				var one int
				err := p.QueryRow(ctx, "SELECT 1").Scan(&one)
				return outcome{allowed: err == nil, err: err}
			}
			continue
		case writeFloorName:
			out[i] = func(ctx context.Context, key string) outcome {
				tag, err := p.Exec(ctx, update, namespace, key)
				if err == nil && tag.RowsAffected() != 1 {
					// Writing nothing would make a flattering floor.
					err = fmt.Errorf("write floor: key %q was not seeded", key)
				}
				return outcome{allowed: err == nil, err: err}
			}
			continue
		}
		if v.Seed {
			if limits != nil {
				return nil, fmt.Errorf("%s decides a cooldown only", v.Name)
			}
			upsert := fmt.Sprintf(seedUpsertSQL, ident(s.schemas[v.Name]), ident(tableOf(v)))
			out[i] = func(ctx context.Context, key string) outcome {
				var admitted bool
				err := p.QueryRow(ctx, upsert, namespace, key, cooldown.Microseconds()).Scan(&admitted)
				if errors.Is(err, pgx.ErrNoRows) {
					return outcome{}
				}
				return outcome{allowed: err == nil, err: err}
			}
			continue
		}
		lim, err := s.limiter(p, v, cooldown, limits)
		if err != nil {
			return nil, err
		}
		out[i] = func(ctx context.Context, key string) outcome {
			d, err := lim.Allow(ctx, key)
			return outcome{allowed: d.Allowed, err: err}
		}
	}
	return out, nil
}

// limiter returns variant v's limiter on pool p.
func (s *poolSession) limiter(p *pgxpool.Pool, v variant, cooldown time.Duration, limits []pglimit.Limit) (pglimit.Limiter, error) {
	if v.Naive {
		return newNaiveRange(p, pgx.Identifier{s.schemas[v.Name], tableOf(v)}, namespace, cooldown)
	}
	var inv *pglimit.Invalidator
	if v.Invalidate {
		var err error
		if inv, err = s.invalidator(p); err != nil {
			return nil, err
		}
	}
	w := &levelWatch{}
	s.watch = append(s.watch, w)
	return pglimit.New(p, &pglimit.Config{
		Observer:     w,
		Strategy:     v.Strategy,
		AsyncCommit:  v.AsyncCommit,
		PreBlockSize: v.PreBlock,
		Invalidator:  inv,
		Table:        v.Table,
		Cooldown:     cooldown,
		Limits:       limits,
		Namespace:    namespace,
		Schema:       s.schemas[v.Name],
	})
}

// levelWatch is the Observer of a limiter under test: it keeps the last
// in-flight level the limiter moved to, from where it started, and nothing
// else. It stays 0 for a limiter that does not gather.
type levelWatch struct{ level atomic.Int64 }

func (w *levelWatch) StartDecision(ctx context.Context, _ pglimit.Observation) context.Context {
	return ctx
}
func (w *levelWatch) EndDecision(context.Context, pglimit.Observation) {}
func (w *levelWatch) ObserveLevel(o pglimit.LevelObservation)          { w.level.Store(int64(o.To)) }

// levels returns each instance's last level, or nil where none gathers.
func (s *poolSession) levels() []int {
	var out []int
	for _, w := range s.watch {
		if l := w.level.Load(); l > 0 {
			out = append(out, int(l))
		}
	}
	return out
}

// invalidatorWait bounds how long an instance waits for its Invalidator to
// listen before the run starts.
const invalidatorWait = 10 * time.Second

// invalidator starts an Invalidator on p's database, stopped by close, and
// waits until it listens, so that the run measures the pre-block at work.
func (s *poolSession) invalidator(p *pgxpool.Pool) (*pglimit.Invalidator, error) {
	inv, err := pglimit.NewInvalidator(&pglimit.InvalidatorConfig{ConnConfig: p.Config().ConnConfig})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), invalidatorWait)
	defer cancel()
	if err := inv.Start(ctx); err != nil {
		return nil, err
	}
	s.invalidators = append(s.invalidators, inv)
	return inv, nil
}

func (s *poolSession) close() {
	for _, inv := range s.invalidators {
		_ = inv.Stop(context.Background())
	}
	for _, p := range s.pools {
		p.Close()
	}
}

// overHTTP sends GET /items/{user} to running demo instances, one instance
// per base URL: 200 is an admission, 429 with Retry-After a refusal, anything
// else an error. The floor is GET /healthz.
type overHTTP struct {
	urls    []string
	timeout time.Duration
}

// open uses every URL: buildScenarios made instances the number of URLs.
func (t *overHTTP) open(_ context.Context, _ variant, _, conns int) (session, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = conns
	return &httpSession{
		urls:   t.urls,
		client: &http.Client{Transport: tr, Timeout: t.timeout},
		size:   conns,
	}, nil
}

type httpSession struct {
	urls   []string
	client *http.Client
	size   int
}

func (s *httpSession) conns() int { return s.size }

// deciders ignores limits: the scenarios with limit variants run in-process
// only.
func (s *httpSession) deciders(v variant, _ time.Duration, _ []pglimit.Limit) ([]decideFunc, error) {
	out := make([]decideFunc, len(s.urls))
	for i, base := range s.urls {
		base = strings.TrimRight(base, "/")
		if v.Floor {
			out[i] = func(ctx context.Context, _ string) outcome {
				code, _, err := s.get(ctx, base+"/healthz")
				if err == nil && code/100 != 2 {
					err = &httpStatusError{code: code}
				}
				return outcome{allowed: err == nil, err: err}
			}
			continue
		}
		out[i] = func(ctx context.Context, key string) outcome {
			code, h, err := s.get(ctx, base+"/items/"+url.PathEscape(key))
			switch {
			case err != nil:
				return outcome{err: err}
			case code == http.StatusOK:
				return outcome{allowed: true}
			case code == http.StatusTooManyRequests && h.Get("Retry-After") != "":
				return outcome{}
			default:
				return outcome{err: &httpStatusError{code: code}}
			}
		}
	}
	return out, nil
}

func (s *httpSession) get(ctx context.Context, u string) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body) // keep the connection reusable
	return resp.StatusCode, resp.Header, err
}

func (s *httpSession) close() { s.client.CloseIdleConnections() }
