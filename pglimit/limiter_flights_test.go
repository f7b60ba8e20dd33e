package pglimit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// gatedDB holds every statement until open is closed (or the statement's
// context ends), and counts them.
type gatedDB struct {
	*pgxpool.Pool
	open       chan struct{}
	entered    chan struct{} // receives once per statement held
	statements atomic.Int64
}

func newGatedDB(t *testing.T) *gatedDB {
	return &gatedDB{Pool: testdb.Pool(t), open: make(chan struct{}), entered: make(chan struct{}, 1000)}
}

func (g *gatedDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	g.statements.Add(1)
	g.entered <- struct{}{}
	select {
	case <-g.open:
	case <-ctx.Done():
		return errRow{ctx.Err()}
	}
	return g.Pool.QueryRow(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// N concurrent requests on one key in cooldown run fewer statements than
// N: those that arrive while a statement decides share its refusal.
// Exactly one of them is admitted when the key is free, and every refusal
// carries a RetryAfter within the cooldown.
func TestSingleFlightSparesTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, s := range pglimit.Strategies() {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			db := newGatedDB(t)
			lim, err := pglimit.New(db, &pglimit.Config{Strategy: s, Schema: testdb.Schema(t), Cooldown: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			close(db.open) // the first decision may check the table (Range)
			if d, err := lim.Allow(ctx, "warm-up"); err != nil || !d.Allowed {
				t.Fatalf("warm-up: %+v, %v", d, err)
			}
			for len(db.entered) > 0 {
				<-db.entered
			}
			db.open = make(chan struct{})
			db.statements.Store(0)

			const n = 20
			var wg sync.WaitGroup
			decisions := make([]pglimit.Decision, n)
			errs := make([]error, n)
			started := make(chan struct{}, n)
			for i := range n {
				wg.Go(func() {
					started <- struct{}{}
					decisions[i], errs[i] = lim.Allow(ctx, "hot")
				})
			}
			<-db.entered // the leader's statement is held
			for range n {
				<-started
			}
			time.Sleep(200 * time.Millisecond) // let the others join it
			close(db.open)
			wg.Wait()

			admitted := 0
			for i, d := range decisions {
				if errs[i] != nil {
					t.Fatalf("request %d: %v", i, errs[i])
				}
				if d.Allowed {
					admitted++
				} else if d.RetryAfter <= 0 || d.RetryAfter > time.Minute {
					t.Fatalf("request %d: RetryAfter %s, want in (0, 1m]", i, d.RetryAfter)
				}
			}
			if admitted != 1 {
				t.Fatalf("%d of %d concurrent requests admitted, want 1", admitted, n)
			}
			got := db.statements.Load()
			t.Logf("%d concurrent requests ran %d statements", n, got)
			if got >= n {
				t.Fatalf("%d concurrent requests ran %d statements, want fewer", n, got)
			}
		})
	}
}

// A caller whose leader's answer leaves room for it runs its own
// statement: with a burst of 3, ten concurrent requests admit exactly 3.
func TestSingleFlightRoomIsNotRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lim, err := pglimit.New(testdb.Pool(t), &pglimit.Config{
		Schema: testdb.Schema(t),
		Limits: []pglimit.Limit{{Name: "burst", Rate: 1, Period: time.Hour, Burst: 3}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			d, err := lim.Allow(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 3 {
		t.Fatalf("%d of 10 concurrent requests admitted with a burst of 3, want 3", got)
	}
	// Sequentially, the key is exhausted and refuses.
	if d, err := lim.Allow(ctx, "k"); err != nil || d.Allowed {
		t.Fatalf("after the burst: %+v, %v; want refused", d, err)
	}
}

// A follower waits no longer than its own context; a leader whose own
// context ends leaves its followers to decide afresh rather than fail.
func TestSingleFlightContexts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := newGatedDB(t)
	lim, err := pglimit.New(db, &pglimit.Config{Schema: testdb.Schema(t), Cooldown: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	leaderCtx, cancelLeader := context.WithCancel(ctx)
	leaderErr := make(chan error, 1)
	go func() {
		_, err := lim.Allow(leaderCtx, "k")
		leaderErr <- err
	}()
	<-db.entered

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := lim.Allow(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a follower past its deadline: %v, want context.DeadlineExceeded", err)
	}

	follower := make(chan pglimit.Decision, 1)
	followerErr := make(chan error, 1)
	go func() {
		d, err := lim.Allow(ctx, "k")
		follower <- d
		followerErr <- err
	}()
	time.Sleep(100 * time.Millisecond) // let it join the leader
	cancelLeader()
	if err := <-leaderErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled leader: %v, want context.Canceled", err)
	}
	close(db.open)
	if d, err := <-follower, <-followerErr; err != nil || !d.Allowed {
		t.Fatalf("the follower of a cancelled leader: %+v, %v; want admitted", d, err)
	}
}
