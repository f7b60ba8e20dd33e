package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
)

// tenancy is an organisation's limiter and its users' on one pool: the
// org on the Upsert table, its users on NoWait's with per-key limits.
type tenancy struct {
	pool      *pgxpool.Pool
	org, user pglimit.Limiter
	orgCfg    pglimit.Config
	userCfg   pglimit.Config
}

func newTenancy(t *testing.T, schema string, pool *pgxpool.Pool, orgRate, userRate int) *tenancy {
	t.Helper()
	tn := &tenancy{pool: pool,
		orgCfg: pglimit.Config{Schema: schema, Namespace: "org", Limits: []pglimit.Limit{{Name: "org", Rate: orgRate, Period: time.Hour, Burst: orgRate}}},
		userCfg: pglimit.Config{Schema: schema, Namespace: "user", Strategy: pglimit.NoWait, Overrides: true, Limits: []pglimit.Limit{
			{Name: "user", Rate: userRate, Period: time.Hour, Burst: userRate},
			{Name: "user-daily", Rate: 100, Algorithm: pglimit.FixedWindow, Calendar: "day"},
		}},
	}
	tn.org, tn.user = newLimiterOn(t, pool, tn.orgCfg), newLimiterOn(t, pool, tn.userCfg)
	return tn
}

// left is what Inspect says key has left under cfg's first limit.
func left(t *testing.T, pool *pgxpool.Pool, cfg pglimit.Config, key string) int {
	t.Helper()
	st, err := pglimit.Inspect(context.Background(), testdb.Limiter(t, pool, &cfg), key)
	if err != nil {
		t.Fatal(err)
	}
	return st.Limits[0].Remaining
}

// A request refused at one level charges none: neither the user whom the
// org refused nor the org of a user refused.
func TestAllowAllAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tn := newTenancy(t, testdb.Schema(t), testdb.Pool(t), 3, 2)
	call := func(user string) pglimit.Decisions {
		t.Helper()
		d, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: tn.user, Key: user}, pglimit.Charge{Limiter: tn.org, Key: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for range 2 {
		if d := call("bob"); !d.Allowed || len(d.Levels) != 2 || d.Levels[0].Granted != 1 || d.Levels[1].Granted != 1 {
			t.Fatalf("bob within both limits: %+v", d)
		}
	}
	d := call("bob")
	if d.Allowed || !slices.Equal(d.Refused(), []int{0}) || d.RetryAfter != d.Levels[0].RetryAfter || d.RetryAfter <= 0 || d.Levels[1].Granted != 0 {
		t.Fatalf("bob past his limit: %+v; want refused by level 0 alone, nothing granted", d)
	}
	if got := left(t, tn.pool, tn.orgCfg, "acme"); got != 1 {
		t.Fatalf("the org after bob's refusal: %d left, want 1: a refused request charged it", got)
	}
	if d := call("carol"); !d.Allowed {
		t.Fatalf("carol, with one left in the org: %+v", d)
	}
	d = call("dave")
	if d.Allowed || !slices.Equal(d.Refused(), []int{1}) || d.RetryAfter != d.Levels[1].RetryAfter || d.Levels[1].Limit.Name != "org" {
		t.Fatalf("dave in a spent org: %+v; want refused by level 1, the org", d)
	}
	if got := left(t, tn.pool, tn.userCfg, "dave"); got != 2 {
		t.Errorf("dave after the org refused him: %d left, want 2: a refused request charged him", got)
	}

	// Each admitted level's decision is its limiter's to refund; a level
	// of a refused request was charged nothing.
	tn2 := newTenancy(t, testdb.Schema(t), tn.pool, 3, 2)
	ok, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: tn2.org, Key: "acme"}, pglimit.Charge{Limiter: tn2.user, Key: "erin"})
	if err != nil || !ok.Allowed {
		t.Fatalf("erin: %+v, %v", ok, err)
	}
	if back, err := tn2.user.Refund(ctx, ok.Levels[1], 1); err != nil || !back || left(t, tn.pool, tn2.userCfg, "erin") != 2 {
		t.Errorf("Refund of erin's level: %t, %v; want her unit back", back, err)
	}
	if _, err := tn.org.Refund(ctx, d.Levels[0], 1); !errors.Is(err, pglimit.ErrNotAdmitted) {
		t.Errorf("Refund of a level of a refused request: %v, want ErrNotAdmitted", err)
	}
}

// Two instances, one through PgBouncer, users of one org calling with the
// levels in either order: exactly the org's capacity is admitted, no user
// past their own, every admission charged at both levels (audited on the
// rows), and no call deadlocks or fails.
func TestAllowAllConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	const orgRate, userRate, users, tries = 20, 5, 8, 8
	instances := []*tenancy{newTenancy(t, schema, testdb.Pool(t), orgRate, userRate), newTenancy(t, schema, testdb.PgBouncerPool(t), orgRate, userRate)}
	var (
		admitted [users]atomic.Int64
		wg       sync.WaitGroup
	)
	for u := range users {
		for i, tn := range instances {
			wg.Go(func() {
				user := fmt.Sprintf("u%d", u)
				for range tries {
					charges := []pglimit.Charge{{Limiter: tn.org, Key: "acme"}, {Limiter: tn.user, Key: user}}
					if rand.IntN(2) == i%2 {
						slices.Reverse(charges)
					}
					d, err := pglimit.AllowAll(ctx, 1, charges...)
					if err != nil {
						t.Errorf("AllowAll: %v", err)
						return
					}
					if d.Allowed {
						admitted[u].Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	total := 0
	for u := range users {
		n := int(admitted[u].Load())
		total += n
		if n > userRate {
			t.Errorf("u%d: %d admitted, past the user limit of %d", u, n, userRate)
		}
		if got := userRate - left(t, instances[0].pool, instances[0].userCfg, fmt.Sprintf("u%d", u)); got != n {
			t.Errorf("u%d: %d admitted, %d charged to the user", u, n, got)
		}
	}
	if total != orgRate {
		t.Errorf("%d admitted in all, want exactly the org's %d", total, orgRate)
	}
	if got := orgRate - left(t, instances[0].pool, instances[0].orgCfg, "acme"); got != total {
		t.Errorf("%d admitted, %d charged to the org", total, got)
	}
}

// A user's own limits count at their level, and a limiter in shadow mode
// is charged when it admits and never refuses.
func TestAllowAllOwnLimitsAndShadow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	tn := newTenancy(t, schema, pool, 100, 1)
	if err := pglimit.SetKeyLimits(ctx, tn.user, "vip", pglimit.Limit{Name: "user", Burst: 3}); err != nil {
		t.Fatal(err)
	}
	shadowCfg := pglimit.Config{Schema: schema, Namespace: "shadow-org", Shadow: true, Limits: []pglimit.Limit{{Name: "org", Rate: 1, Period: time.Hour, Burst: 1}}}
	shadow := newLimiterOn(t, pool, shadowCfg)
	for i := range 3 {
		d, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: tn.user, Key: "vip"}, pglimit.Charge{Limiter: shadow, Key: "acme"})
		if err != nil || !d.Allowed || d.Levels[0].Limit.Burst != 3 || d.Levels[1].Shadow != (i > 0) {
			t.Fatalf("vip's call %d: %+v, %v; want admitted under his burst of 3, the shadow org refusing from the second", i+1, d, err)
		}
	}
	if d, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: tn.user, Key: "vip"}, pglimit.Charge{Limiter: shadow, Key: "acme"}); err != nil || d.Allowed || !slices.Equal(d.Refused(), []int{0}) {
		t.Fatalf("vip's 4th call: %+v, %v; want refused by his own burst, not by the shadow org", d, err)
	}
	if got := left(t, pool, shadowCfg, "acme"); got != 0 {
		t.Errorf("the shadow org: %d left, want 0: charged by the one call it admitted", got)
	}
}

// Bad charges are refused with typed errors, and charge nothing.
func TestAllowAllBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := testdb.Schema(t)
	pool := testdb.Pool(t)
	tn := newTenancy(t, schema, pool, 3, 2)
	other := newLimiterOn(t, testdb.Pool(t), tn.orgCfg)
	rng := newLimiterOn(t, pool, pglimit.Config{Schema: schema, Strategy: pglimit.Range, Cooldown: time.Second})
	org, user := pglimit.Charge{Limiter: tn.org, Key: "acme"}, pglimit.Charge{Limiter: tn.user, Key: "bob"}
	for _, c := range []struct {
		name    string
		n       int
		charges []pglimit.Charge
		want    error
	}{
		{"no charges", 1, nil, pglimit.ErrInvalidConfig},
		{"too many", 1, slices.Repeat([]pglimit.Charge{org}, pglimit.MaxLevels+1), pglimit.ErrInvalidConfig},
		{"n = 0", 0, []pglimit.Charge{org, user}, pglimit.ErrInvalidCost},
		{"n past the user's burst", 3, []pglimit.Charge{org, user}, pglimit.ErrInvalidCost},
		{"a key twice", 1, []pglimit.Charge{org, user, {Limiter: tn.org, Key: "acme"}}, pglimit.ErrInvalidConfig},
		{"an empty key", 1, []pglimit.Charge{org, {Limiter: tn.user, Key: ""}}, pglimit.ErrInvalidKey},
		{"another pool", 1, []pglimit.Charge{user, {Limiter: other, Key: "x"}}, pglimit.ErrInvalidConfig},
		{"Range", 1, []pglimit.Charge{org, {Limiter: rng, Key: "x"}}, pglimit.ErrUnsupported},
		{"a nil limiter", 1, []pglimit.Charge{org, {Key: "x"}}, pglimit.ErrInvalidConfig},
	} {
		if _, err := pglimit.AllowAll(ctx, c.n, c.charges...); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if got := left(t, pool, tn.orgCfg, "acme"); got != 3 {
		t.Errorf("the org after bad calls: %d left, want 3", got)
	}
}

// AllowAllTx charges every level only if the caller's transaction commits,
// leaves it usable after a refusal, and a level's refund gives back only
// what committed.
func TestAllowAllTx(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	tn := newTenancy(t, testdb.Schema(t), pool, 3, 2)
	charges := []pglimit.Charge{{Limiter: tn.user, Key: "bob"}, {Limiter: tn.org, Key: "acme"}}
	inTx := func(commit bool) pglimit.Decisions {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // after a commit, a no-op
		d, err := pglimit.AllowAllTx(ctx, tx, 1, charges...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("the transaction after AllowAllTx: %v", err)
		}
		if commit {
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}

	rolledBack := inTx(false)
	if !rolledBack.Allowed || left(t, pool, tn.userCfg, "bob") != 2 || left(t, pool, tn.orgCfg, "acme") != 3 {
		t.Fatalf("a rolled-back AllowAllTx: %+v; want admitted in it, and nothing charged after the rollback", rolledBack)
	}
	if back, err := tn.user.Refund(ctx, rolledBack.Levels[0], 1); err != nil || back {
		t.Errorf("Refund of a rolled-back level: %t, %v; want false, nothing to give back", back, err)
	}
	committed := inTx(true)
	if !committed.Allowed || left(t, pool, tn.userCfg, "bob") != 1 || left(t, pool, tn.orgCfg, "acme") != 2 {
		t.Fatalf("a committed AllowAllTx: %+v; want one unit charged at each level", committed)
	}
	if back, err := tn.org.Refund(ctx, committed.Levels[1], 1); err != nil || !back || left(t, pool, tn.orgCfg, "acme") != 3 {
		t.Errorf("Refund of a committed level: %t, %v; want the org's unit back", back, err)
	}
	inTx(true)
	refused := inTx(true)
	if refused.Allowed || !slices.Equal(refused.Refused(), []int{0}) {
		t.Errorf("bob past his limit in a transaction: %+v; want refused by level 0, the transaction usable", refused)
	}
	if _, err := pglimit.AllowAllTx(ctx, nil, 1, charges...); !errors.Is(err, pglimit.ErrInvalidConfig) {
		t.Errorf("AllowAllTx with no transaction: %v, want ErrInvalidConfig", err)
	}
}

// At REPEATABLE READ, a level changed by another decision after the
// caller's snapshot is a refusal, not an error, and the transaction stays
// usable.
func TestAllowAllTxRepeatableRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	tn := newTenancy(t, testdb.Schema(t), pool, 10, 10)
	charges := []pglimit.Charge{{Limiter: tn.org, Key: "acme"}, {Limiter: tn.user, Key: "bob"}}
	if d, err := pglimit.AllowAll(ctx, 1, charges...); err != nil || !d.Allowed {
		t.Fatalf("AllowAll: %+v, %v", d, err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the test's end
	// The transaction's snapshot is taken here.
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if d, err := pglimit.AllowAll(ctx, 1, charges...); err != nil || !d.Allowed {
		t.Fatalf("AllowAll after the snapshot: %+v, %v", d, err)
	}
	d, err := pglimit.AllowAllTx(ctx, tx, 1, charges...)
	if err != nil || d.Allowed {
		t.Fatalf("AllowAllTx on rows changed after its snapshot: %+v, %v; want a refusal", d, err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
		t.Errorf("the transaction after the refusal: %v", err)
	}
}

// A refused AllowAll takes no row lock and writes nothing, in its own
// transaction or in the caller's, which stays open: every level's row
// keeps its version (xmin) and gets no locker (xmax), a key without a row
// gets none, and another request for the admitting level's key does not
// wait for the open transaction.
func TestAllowAllRefusalTakesNoLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	schema := testdb.Schema(t)
	tn := newTenancy(t, schema, pool, 3, 1)
	bob := []pglimit.Charge{{Limiter: tn.org, Key: "acme"}, {Limiter: tn.user, Key: "bob"}}
	if d, err := pglimit.AllowAll(ctx, 1, bob...); err != nil || !d.Allowed {
		t.Fatalf("bob's first request: %+v, %v", d, err)
	}
	versions := func() map[string]string {
		out := rowVersions(t, pool, schema, "pglimit_upsert")
		for k, v := range rowVersions(t, pool, schema, "pglimit_nowait") {
			out["user/"+k] = v
		}
		return out
	}
	before := versions()
	if d, err := pglimit.AllowAll(ctx, 1, bob...); err != nil || d.Allowed {
		t.Fatalf("bob past his limit: %+v, %v; want a refusal", d, err)
	}
	if after := versions(); !maps.Equal(after, before) {
		t.Fatalf("rows after a refused AllowAll: %v, before %v; want untouched", after, before)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // the test's end
	if d, err := pglimit.AllowAllTx(ctx, tx, 1, bob...); err != nil || d.Allowed {
		t.Fatalf("bob past his limit in a transaction: %+v, %v; want a refusal", d, err)
	}
	if after := versions(); !maps.Equal(after, before) {
		t.Fatalf("rows while a refused AllowAllTx's transaction is open: %v, before %v; want untouched", after, before)
	}
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if d, err := pglimit.AllowAll(quick, 1, pglimit.Charge{Limiter: tn.org, Key: "acme"}, pglimit.Charge{Limiter: tn.user, Key: "carol"}); err != nil || !d.Allowed {
		t.Fatalf("carol, while bob's refused transaction is open: %+v, %v; want admitted at once", d, err)
	}

	// The org is spent: a new user is refused by it, and gets no row.
	if d, err := pglimit.AllowAll(ctx, 1, pglimit.Charge{Limiter: tn.org, Key: "acme"}, pglimit.Charge{Limiter: tn.user, Key: "dave"}); err != nil || !d.Allowed {
		t.Fatalf("dave, with the org's last unit: %+v, %v", d, err)
	}
	before = versions()
	d, err := pglimit.AllowAllTx(ctx, tx, 1, pglimit.Charge{Limiter: tn.user, Key: "erin"}, pglimit.Charge{Limiter: tn.org, Key: "acme"})
	if err != nil || d.Allowed || !slices.Equal(d.Refused(), []int{1}) || !d.Levels[0].Allowed || d.Levels[0].Granted != 0 {
		t.Fatalf("erin, new, in a spent org: %+v, %v; want refused by the org alone", d, err)
	}
	if after := versions(); !maps.Equal(after, before) {
		t.Fatalf("rows after erin's refusal: %v, before %v; want untouched, and no row for erin", after, before)
	}
}
