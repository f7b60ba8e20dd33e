package pglimit_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// orgUser is a hierarchy of two limiters on one pool: an organisation's
// (a single GCRA limit, the fast statement's shape) and its users' (two
// limits, the general one's).
func orgUser(t *testing.T, pool *pgxpool.Pool, schema string, s pglimit.Strategy, orgBurst int) (org, user pglimit.Limiter) {
	t.Helper()
	org = newLimiterOn(t, pool, pglimit.Config{Schema: schema, Strategy: s, Namespace: "org",
		Limits: []pglimit.Limit{{Name: "org", Rate: 1, Period: time.Hour, Burst: orgBurst}}})
	user = newLimiterOn(t, pool, pglimit.Config{Schema: schema, Strategy: s, Namespace: "user",
		Limits: []pglimit.Limit{{Name: "user", Rate: 1, Period: time.Hour, Burst: 100}, {Name: "day", Rate: 100, Period: 24 * time.Hour, Algorithm: pglimit.FixedWindow}}})
	return org, user
}

// AllowAll with an id is charged once at every level: a retry, with the
// charges in any order, replays every level's first decision; an id in an
// AllowAllTx that rolled back was never admitted; a refused one stores
// nothing; each level's admission is refunded by the id at that level.
func TestIDAllowAll(t *testing.T) {
	t.Parallel()
	for _, s := range []pglimit.Strategy{pglimit.Upsert, pglimit.NoWait} {
		t.Run(string(s), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := testdb.Pool(t)
			schema := testdb.Schema(t)
			org, user := orgUser(t, pool, schema, s, 3)
			all := func(id string, n int, charges ...pglimit.Charge) pglimit.Decisions {
				t.Helper()
				d, err := pglimit.AllowAll(pglimit.WithID(ctx, id), n, charges...)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			orgFirst := []pglimit.Charge{{Limiter: org, Key: "acme"}, {Limiter: user, Key: "bob"}}
			userFirst := []pglimit.Charge{{Limiter: user, Key: "bob"}, {Limiter: org, Key: "acme"}}
			first := all("a", 1, orgFirst...)
			if !first.Allowed || first.Levels[0].Replayed || first.Levels[0].Remaining != 2 || first.Levels[1].Remaining != 99 {
				t.Fatalf("first AllowAll a = %+v", first)
			}
			again := all("a", 1, userFirst...)
			if !again.Allowed || !again.Levels[0].Replayed || !again.Levels[1].Replayed ||
				again.Levels[0].Remaining != first.Levels[1].Remaining || again.Levels[1].Remaining != first.Levels[0].Remaining {
				t.Fatalf("retry of a, charges reversed = %+v, want %+v replayed, reversed", again, first)
			}
			if p, _ := org.Peek(ctx, "acme", 1); p.Remaining != 1 {
				t.Fatalf("after a retry the org has %d left after one more, want 1: the retry charged", p.Remaining)
			}
			// Rolled back, b was never admitted.
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if d, err := pglimit.AllowAllTx(pglimit.WithID(ctx, "b"), tx, 1, orgFirst...); err != nil || !d.Allowed {
				t.Fatalf("AllowAllTx b = %+v, %v", d, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if n := idRows(t, pool, schema, org) + idRows(t, pool, schema, user); n != 2 {
				t.Fatalf("%d id rows after b rolled back, want 2 (a's, one a level)", n)
			}
			if d := all("b", 2, orgFirst...); !d.Allowed || d.Levels[0].Replayed || d.Levels[0].Remaining != 0 {
				t.Fatalf("b after its rollback = %+v, want admitted afresh", d)
			}
			// The org is full: c is refused and stores nothing.
			if d := all("c", 1, orgFirst...); d.Allowed || d.Levels[0].Replayed {
				t.Fatalf("c on a full org = %+v, want refused", d)
			}
			if n := idRows(t, pool, schema, org) + idRows(t, pool, schema, user); n != 4 {
				t.Fatalf("%d id rows, want 4 (a and b at two levels)", n)
			}
			// Refunded by id at each level, latest first.
			for _, r := range []struct {
				lim pglimit.Limiter
				id  string
				n   int
			}{{org, "b", 2}, {user, "b", 2}, {org, "a", 1}} {
				if ok, err := pglimit.RefundID(ctx, r.lim, r.id, r.n); err != nil || !ok {
					t.Fatalf("RefundID %s of %s = %t, %v", r.id, r.lim.Policy().Namespace, ok, err)
				}
			}
			if p, _ := org.Peek(ctx, "acme", 3); !p.Allowed {
				t.Fatalf("after the refunds the org is %+v, want its 3 units back", p)
			}
			if _, err := pglimit.RefundID(ctx, org, "a", 1); !errors.Is(err, pglimit.ErrAlreadySettled) {
				t.Fatalf("a second RefundID of a: %v, want ErrAlreadySettled", err)
			}
		})
	}
}

// An AllowAll id that another decision holds at a level is ErrInvalidID
// and writes nothing, whichever level holds it; a level in shadow mode
// takes no ids yet.
func TestIDAllowAllConflicts(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	org, user := orgUser(t, pool, schema, pglimit.Upsert, 3)
	for _, held := range []pglimit.Limiter{org, user} {
		id := "held-" + held.Policy().Namespace
		if d, err := held.Allow(pglimit.WithID(ctx, id), "other"); err != nil || !d.Allowed {
			t.Fatalf("Allow %s = %+v, %v", id, d, err)
		}
		_, err := pglimit.AllowAll(pglimit.WithID(ctx, id), 1, pglimit.Charge{Limiter: org, Key: "acme"}, pglimit.Charge{Limiter: user, Key: "bob"})
		if !errors.Is(err, pglimit.ErrInvalidID) {
			t.Errorf("AllowAll with an id %s holds: %v, want ErrInvalidID", held.Policy().Namespace, err)
		}
	}
	if n := idRows(t, pool, schema, org) + idRows(t, pool, schema, user); n != 2 {
		t.Errorf("%d id rows, want 2: the AllowAlls wrote none", n)
	}
	for _, c := range []struct {
		lim pglimit.Limiter
		key string
	}{{org, "acme"}, {user, "bob"}} {
		if p, _ := c.lim.Peek(ctx, c.key, 1); p.Remaining != c.lim.Policy().Limits[0].Burst-1 {
			t.Errorf("%s after refused AllowAlls: %+v, want untouched", c.key, p)
		}
	}
	shadow := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Namespace: "shadow", Shadow: true, Cooldown: time.Hour})
	if _, err := pglimit.AllowAll(pglimit.WithID(ctx, "s"), 1, pglimit.Charge{Limiter: org, Key: "acme"}, pglimit.Charge{Limiter: shadow, Key: "x"}); !errors.Is(err, pglimit.ErrUnsupported) {
		t.Errorf("AllowAll with an id and a level in shadow mode: %v, want ErrUnsupported", err)
	}
}

// A retry storm of AllowAll: 8 callers on two instances (one through
// PgBouncer) retry each of 30 ids 4 times; every id is charged once at
// both levels.
func TestIDAllowAllRetryStorm(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := testdb.Schema(t)
	const ids, retries, callers = 30, 4, 8
	type instance struct{ org, user pglimit.Limiter }
	var instances []instance
	for _, pool := range []*pgxpool.Pool{testdb.Pool(t), testdb.PgBouncerPool(t)} {
		org, user := orgUser(t, pool, schema, pglimit.Upsert, 1000)
		instances = append(instances, instance{org, user})
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted = map[string]int{}
	)
	for c := range callers {
		wg.Go(func() {
			in := instances[c%2]
			for i := range ids * retries {
				id := fmt.Sprintf("id-%d", (i*7+c)%ids)
				d, err := pglimit.AllowAll(pglimit.WithID(ctx, id), 1, pglimit.Charge{Limiter: in.org, Key: "acme"}, pglimit.Charge{Limiter: in.user, Key: "bob"})
				if err != nil {
					t.Error(err)
					return
				}
				if !d.Allowed {
					t.Errorf("%s refused: %+v", id, d)
					return
				}
				if !d.Levels[0].Replayed {
					mu.Lock()
					admitted[id]++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for id, n := range admitted {
		if n != 1 {
			t.Errorf("%s first admitted %d times", id, n)
		}
	}
	if len(admitted) != ids {
		t.Errorf("%d ids first admitted, want %d", len(admitted), ids)
	}
	in := instances[0]
	if p, _ := in.org.Peek(ctx, "acme", 1); p.Remaining != 1000-ids-1 {
		t.Errorf("the org has %d left after one more, want %d: %d ids charged", p.Remaining, 1000-ids-1, 1000-p.Remaining-1)
	}
	if p, _ := in.user.Peek(ctx, "bob", 1); p.Remaining != 100-ids-1 {
		t.Errorf("the user has %d left after one more, want %d", p.Remaining, 100-ids-1)
	}
}
