package pglimitquota_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

// The deadline tests' bounds, from the quota's own: a call returns by
// Timeout with ErrTimeout, AllowTx a second later on a server that does
// not answer (the quota's txClientTimeoutMargin: the server's
// lock_timeout ends a wait on a row before that). deadlineSlack is room
// past the bound for a loaded 2-core machine under the race detector to
// hear the server's error or give up on the connection.
const (
	deadlineTimeout = 200 * time.Millisecond
	txMargin        = time.Second
	deadlineSlack   = 2 * time.Second
)

// idRetries is how many calls at once the deadline tests make of one
// decision with an id: retries of one decision, charged once at most.
const idRetries = 5

// deadlineCall is one call of a quota under a fault.
type deadlineCall struct {
	name  string
	bound time.Duration // Timeout, or Timeout and txMargin for AllowTx
	reads bool          // takes no lock: it answers while a row is locked
	id    bool          // Allow with the id on keys.idKey
	txID  bool          // AllowTx with the id on keys.txIDKey, in a transaction of its own
	call  func(ctx context.Context) error
	// commit commits the transaction of a call of AllowTx with an id.
	commit func(ctx context.Context) error
}

// deadlineKeys are a deadline test's keys: the calls' key, that of the
// calls of Allow with an id, that of AllowTx with an id and that of
// Forget, apart so that nothing else charges them.
type deadlineKeys struct{ key, idKey, txIDKey, forgetKey string }

// testKeys are the keys of a deadline test.
var testKeys = deadlineKeys{"k", "k-id", "k-txid", "k-forget"}

// quotaID is the decision id of the deadline tests' calls on idKey.
func quotaID(idKey string) string { return "id/" + idKey }

// newDeadlineCalls readies every call of q that reaches a key's row, and
// Usage, while the server answers: it gives each key its row (one unit
// charged; keys.forgetKey's with an id, so that Forget has an id to
// delete too) and begins AllowTx's transactions on pool. Allow with an id is
// called idRetries times at once on keys.idKey, and AllowTx with an id
// as many times on keys.txIDKey, each in a transaction of its own. With
// txUsable, AllowTx checks that its error left the transaction usable.
func newDeadlineCalls(t *testing.T, q *pglimitquota.Quota, pool *pgxpool.Pool, keys deadlineKeys, txUsable bool) []deadlineCall {
	t.Helper()
	ctx := context.Background()
	for _, k := range []string{keys.key, keys.idKey, keys.txIDKey} {
		if err := testdb.Ready(func() error { _, err := q.Allow(ctx, k, 1); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Allow(pglimit.WithID(ctx, quotaID(keys.forgetKey)), keys.forgetKey, 1); err != nil {
		t.Fatal(err)
	}
	tx := begin(t, pool)
	key := keys.key
	calls := []deadlineCall{
		{name: "Allow", call: func(ctx context.Context) error { _, err := q.Allow(ctx, key, 1); return err }},
		{name: "SetPlan", call: func(ctx context.Context) error {
			_, err := q.SetPlan(ctx, key, pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 1}, Allowance: 5}, pglimitquota.AtOnce)
			return err
		}},
		{name: "Grant", call: func(ctx context.Context) error { return q.Grant(ctx, key, 1, time.Now().Add(time.Hour)) }},
		{name: "AllowTx", bound: txMargin, call: func(ctx context.Context) error {
			_, err := q.AllowTx(ctx, tx, key, 1)
			if txUsable {
				if _, xerr := tx.Exec(ctx, "SELECT 1"); xerr != nil {
					t.Errorf("AllowTx left tx unusable: %v", xerr)
				}
			}
			return err
		}},
		{name: "Usage", reads: true, call: func(ctx context.Context) error { _, err := q.Usage(ctx, key); return err }},
		{name: "Forget", call: func(ctx context.Context) error { return q.Forget(ctx, keys.forgetKey) }},
	}
	for i := range idRetries {
		calls = append(calls, deadlineCall{name: fmt.Sprintf("Allow with an id (%d)", i+1), id: true, call: func(ctx context.Context) error {
			_, err := q.Allow(pglimit.WithID(ctx, quotaID(keys.idKey)), keys.idKey, 1)
			return err
		}})
		tx := begin(t, pool)
		calls = append(calls, deadlineCall{name: fmt.Sprintf("AllowTx with an id (%d)", i+1), bound: txMargin, txID: true, commit: tx.Commit,
			call: func(ctx context.Context) error {
				_, err := q.AllowTx(pglimit.WithID(ctx, quotaID(keys.txIDKey)), tx, keys.txIDKey, 1)
				if txUsable {
					if _, xerr := tx.Exec(ctx, "SELECT 1"); xerr != nil {
						t.Errorf("AllowTx with an id left tx unusable: %v", xerr)
					}
				}
				return err
			}})
	}
	for i := range calls {
		calls[i].bound += deadlineTimeout
	}
	return calls
}

// begin begins a transaction on pool, rolled back (within a second: the
// server may not answer) when the test ends unless it was committed. A
// test that fails with a transaction open then fails at once: the
// pool's close at its end would otherwise wait for the connection for
// ever.
func begin(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = tx.Rollback(ctx)
	})
	return tx
}

// runDeadlineCalls makes the calls at once and checks that each returned
// by its bound plus deadlineSlack with ErrTimeout; with the server up, a
// call that takes no lock answers instead.
func runDeadlineCalls(t *testing.T, calls []deadlineCall, serverDown bool) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var latest time.Duration
	for _, c := range calls {
		wg.Go(func() {
			start := time.Now()
			err := c.call(context.Background())
			took := time.Since(start)
			mu.Lock()
			latest = max(latest, took-c.bound)
			mu.Unlock()
			switch {
			case took > c.bound+deadlineSlack:
				t.Errorf("%s returned after %s, bound %s (err %v)", c.name, took.Round(time.Millisecond), c.bound, err)
			case c.reads && !serverDown:
				if err != nil {
					t.Errorf("%s, which takes no lock: %v, want an answer", c.name, err)
				}
			case !errors.Is(err, pglimit.ErrTimeout):
				t.Errorf("%s: %v, want an error wrapping ErrTimeout", c.name, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls; the latest returned %s past its bound", len(calls), latest.Round(time.Millisecond))
}

// usedBefore is what idKey has used before the fault.
func usedBefore(t *testing.T, q *pglimitquota.Quota, idKey string) int64 {
	t.Helper()
	var u pglimitquota.Usage
	if err := testdb.Ready(func() (err error) { u, err = q.Usage(context.Background(), idKey); return err }); err != nil {
		t.Fatal(err)
	}
	return u.Used
}

// checkIDOnce checks, once the fault is over and its statements have
// ended (testdb.Quiesce), that the calls of Allow with an id on idKey,
// which used before them, charged it once at most:
// a retry of the id is admitted (a replay if one of them was admitted,
// its caller having got an error), and then idKey is charged the id's
// one unit once, as its counters in the database show.
func checkIDOnce(t *testing.T, q *pglimitquota.Quota, idKey string, before int64) {
	t.Helper()
	ctx := context.Background()
	var d pglimitquota.Decision
	err := testdb.Ready(func() (err error) {
		d, err = q.Allow(pglimit.WithID(ctx, quotaID(idKey)), idKey, 1)
		return err
	})
	if err != nil || !d.Allowed {
		t.Fatalf("a retry of the id after the fault: %+v, %v; want it admitted", d, err)
	}
	after := usedBefore(t, q, idKey)
	t.Logf("after the fault the id's retry was admitted (replayed: %t); the key used %d before, %d after", d.Replayed, before, after)
	if after != before+1 {
		t.Errorf("the id's calls and its retry charged %d units, want 1: an id is charged once", after-before)
	}
}

// checkTxIDOnce checks, once the fault is over and its statements have
// ended, that the calls of AllowTx with an id on txIDKey, which used
// before them, all of which failed, charged nothing: their transactions
// are committed where the fault left them usable (the call's savepoint
// rolled back) and ended otherwise, and then txIDKey has used what it did
// before and the id has no row: it was never admitted. A retry of the id
// in a transaction of its own that commits is then admitted afresh, and
// charges the key once.
func checkTxIDOnce(t *testing.T, q *pglimitquota.Quota, pool *pgxpool.Pool, schema string, calls []deadlineCall, txIDKey string, before int64) {
	t.Helper()
	ctx := context.Background()
	committed := 0
	for _, c := range calls {
		if !c.txID {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if c.commit(cctx) == nil {
			committed++
		}
		cancel()
	}
	id := quotaID(txIDKey)
	var rows int
	q1 := "SELECT count(*) FROM " + pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize() + " WHERE id = $1"
	if err := pool.QueryRow(ctx, q1, id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	used := usedBefore(t, q, txIDKey)
	t.Logf("after the fault %d of the transactions of AllowTx with an id committed; the id has %d rows, the key used %d before, %d after",
		committed, rows, before, used)
	if rows != 0 || used != before {
		t.Errorf("once the failed calls' transactions ended (%d committed), id %q has %d rows and the key used %d more: a call that failed was recorded as admitted",
			committed, id, rows, used-before)
	}
	var d pglimitquota.Decision
	err := testdb.Ready(func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if d, err = q.AllowTx(pglimit.WithID(ctx, id), tx, txIDKey, 1); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	if err != nil || !d.Allowed || d.Replayed {
		t.Fatalf("a retry of the id in a transaction of its own after the fault: %+v, %v; want it admitted afresh", d, err)
	}
	if after := usedBefore(t, q, txIDKey); after != before+1 {
		t.Errorf("the id's calls and its retry charged %d units, want 1: an id is charged once", after-before)
	}
}

// forgetBefore is forgetKey's rows of the key and ids tables before the
// fault, which it must find as they were or gone.
func forgetBefore(t *testing.T, db *pgxpool.Pool, schema, forgetKey string) string {
	t.Helper()
	var s string
	if err := testdb.Ready(func() (err error) { s, err = forgetRows(db, schema, forgetKey); return err }); err != nil {
		t.Fatal(err)
	}
	if s == "" {
		t.Fatalf("%s has no rows to forget", forgetKey)
	}
	return s
}

// forgetRows is key's rows of the key and ids tables, as text.
func forgetRows(db *pgxpool.Pool, schema, key string) (string, error) {
	var s string
	err := db.QueryRow(context.Background(), `
		SELECT coalesce((SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM `+pgx.Identifier{schema, "pglimit_quota_keys"}.Sanitize()+` AS t WHERE t.key = $1), '')
		    || coalesce((SELECT string_agg(t::text, E'\n' ORDER BY t::text) FROM `+pgx.Identifier{schema, "pglimit_quota_ids"}.Sanitize()+` AS t WHERE t.key = $1), '')`,
		key).Scan(&s)
	return s, err
}

// checkForgetAtomic checks, once the fault is over and its statements
// have ended, that the Forget that failed under it left forgetKey's rows
// as they were or deleted them all: its row and its id's row together.
// A Forget then deletes them.
func checkForgetAtomic(t *testing.T, q *pglimitquota.Quota, db *pgxpool.Pool, schema, forgetKey, before string) {
	t.Helper()
	var after string
	if err := testdb.Ready(func() (err error) { after, err = forgetRows(db, schema, forgetKey); return err }); err != nil {
		t.Fatal(err)
	}
	t.Logf("after the fault %s's rows are untouched: %t, gone: %t", forgetKey, after == before, after == "")
	if after != before && after != "" {
		t.Fatalf("a Forget that failed left part of %s's rows:\n%s\nbefore:\n%s", forgetKey, after, before)
	}
	if err := q.Forget(context.Background(), forgetKey); err != nil {
		t.Fatal(err)
	}
	if after, err := forgetRows(db, schema, forgetKey); err != nil || after != "" {
		t.Fatalf("after a Forget once the fault is over, %s has rows: %q, %v", forgetKey, after, err)
	}
}

// deadlinePool opens a pool of cfg with a connection for each of a
// deadline test's calls at once, so that none waits for the pool, whose
// connections have the application_name app (testdb.Quiesce).
func deadlinePool(t *testing.T, cfg *pgxpool.Config, app string) *pgxpool.Pool {
	t.Helper()
	cfg.MaxConns = 24
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	return testdb.AppPool(t, cfg, app)
}

// sharedPool is deadlinePool of the shared server.
func sharedPool(t *testing.T, app string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	return deadlinePool(t, cfg, app)
}

// newDeadlineQuota is a quota of deadlineTimeout on db, in schema.
func newDeadlineQuota(t *testing.T, db pglimit.DB, schema string) *pglimitquota.Quota {
	t.Helper()
	q, err := pglimitquota.New(db, &pglimitquota.Config{Schema: schema, Namespace: "n", Allowance: 10, Timeout: deadlineTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// Every call returns by the quota's Timeout while another transaction
// holds the key's row, with ErrTimeout, and AllowTx leaves the caller's
// transaction usable; Usage reads without a lock and answers at once.
// Allow and AllowTx with an id lock the key's row before they read or
// write the id's, so the key's row is what they wait for
// (TestDeadlineHeldID holds the ids instead); once the row is free, each
// id is charged once, and AllowTx's failed calls, their transactions
// committed, charged nothing (checkTxIDOnce).
func TestDeadlineLockedRow(t *testing.T) {
	schema, app := testdb.Schema(t), testdb.AppName(t)
	pool := sharedPool(t, app)
	q := newDeadlineQuota(t, pool, schema)
	keys := testKeys
	calls := newDeadlineCalls(t, q, pool, keys, true)
	before, txBefore := usedBefore(t, q, keys.idKey), usedBefore(t, q, keys.txIDKey)
	forgot := forgetBefore(t, pool, schema, keys.forgetKey)
	unlock := testdb.Lock(t, testdb.Pool(t), schema, "pglimit_quota_keys", keys.key, keys.idKey, keys.txIDKey, keys.forgetKey)
	runDeadlineCalls(t, calls, false)
	unlock()
	testdb.Quiesce(t, app, pool)
	checkIDOnce(t, q, keys.idKey, before)
	checkTxIDOnce(t, q, pool, schema, calls, keys.txIDKey, txBefore)
	checkForgetAtomic(t, q, pool, schema, keys.forgetKey, forgot)
}

// Allow and AllowTx with an id whose id another transaction holds, an
// AllowTx of the id on another key not yet committed, wait for that
// transaction (the id's primary key) no longer than their bound, with
// ErrTimeout; once the transaction rolls back, a retry charges each id
// once, and AllowTx's failed calls charged nothing.
func TestDeadlineHeldID(t *testing.T) {
	schema, app := testdb.Schema(t), testdb.AppName(t)
	pool := sharedPool(t, app)
	q := newDeadlineQuota(t, pool, schema)
	keys := testKeys
	var calls []deadlineCall
	for _, c := range newDeadlineCalls(t, q, pool, keys, true) {
		if c.id || c.txID {
			calls = append(calls, c)
		}
	}
	before, txBefore := usedBefore(t, q, keys.idKey), usedBefore(t, q, keys.txIDKey)
	ctx := context.Background()
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release := sync.OnceFunc(func() { _ = holder.Rollback(ctx) })
	t.Cleanup(release)
	for _, k := range []string{keys.idKey, keys.txIDKey} {
		if d, err := q.AllowTx(pglimit.WithID(ctx, quotaID(k)), holder, "holder", 1); err != nil || !d.Allowed {
			t.Fatalf("hold the id of %s: %+v, %v", k, d, err)
		}
	}
	runDeadlineCalls(t, calls, false)
	release()
	testdb.Quiesce(t, app, pool)
	checkIDOnce(t, q, keys.idKey, before)
	checkTxIDOnce(t, q, pool, schema, calls, keys.txIDKey, txBefore)
}

// Every call returns by its bound on a server stopped with SIGSTOP (a
// host that stops answering: connections stay open, new ones are
// accepted by the kernel and never answered), with ErrTimeout; once the
// server goes on, each id is charged once, none by AllowTx's calls.
func TestDeadlineFrozenServer(t *testing.T) {
	testdb.Slow(t)
	srv := testdb.OwnMigratedServer(t)
	app := testdb.AppName(t)
	pool := deadlinePool(t, testdb.ServerPoolConfig(t, srv, 16), app)
	schema := "public"
	q := newDeadlineQuota(t, pool, schema)
	keys := testKeys
	calls := newDeadlineCalls(t, q, pool, keys, false)
	before, txBefore := usedBefore(t, q, keys.idKey), usedBefore(t, q, keys.txIDKey)
	forgot := forgetBefore(t, pool, schema, keys.forgetKey)
	thaw := testdb.Frozen(t, srv)
	runDeadlineCalls(t, calls, true)
	thaw()
	testdb.Quiesce(t, app, pool)
	checkIDOnce(t, q, keys.idKey, before)
	checkTxIDOnce(t, q, pool, schema, calls, keys.txIDKey, txBefore)
	checkForgetAtomic(t, q, pool, schema, keys.forgetKey, forgot)
}

// Every call returns by its bound on a dead connection: every connection
// to the server, those in the pool and those dialled during the calls,
// goes silent (testdb.StallProxy), with ErrTimeout. Once the bytes flow
// again the statements held back reach the server after their callers
// gave up, and each id is still charged once, none by AllowTx's calls.
func TestDeadlineDeadConnection(t *testing.T) {
	proxy, pcfg := testdb.NewStallProxy(t)
	app := testdb.AppName(t)
	pool := deadlinePool(t, pcfg, app)
	schema := testdb.Schema(t)
	q := newDeadlineQuota(t, pool, schema)
	keys := testKeys
	calls := newDeadlineCalls(t, q, pool, keys, false)
	before, txBefore := usedBefore(t, q, keys.idKey), usedBefore(t, q, keys.txIDKey)
	forgot := forgetBefore(t, pool, schema, keys.forgetKey)
	proxy.Stall()
	t.Cleanup(proxy.Unstall) // before the pool closes and the transaction rolls back
	runDeadlineCalls(t, calls, true)
	proxy.Unstall()
	testdb.Quiesce(t, app, pool)
	checkIDOnce(t, q, keys.idKey, before)
	checkTxIDOnce(t, q, pool, schema, calls, keys.txIDKey, txBefore)
	checkForgetAtomic(t, q, pool, schema, keys.forgetKey, forgot)
}
