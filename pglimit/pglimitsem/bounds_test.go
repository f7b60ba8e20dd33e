package pglimitsem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/onpglimit/testdb"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsem"
)

// boundSlack is the bound every entry point keeps past its deadline (the
// caller's context, or the semaphore's Timeout, whichever comes first):
// the time to hear the server's error or to give up on the connection.
const boundSlack = 500 * time.Millisecond

// semCall is one public entry point of a Semaphore. held is a slot of key
// acquired beforehand, the only one of key (Slots is 1).
type semCall struct {
	name string
	tx   bool // runs in a transaction of the condition's pool
	run  func(ctx context.Context, sem *pglimitsem.Semaphore, tx pgx.Tx, key string, held pglimitsem.Slot) error
}

var semCalls = []semCall{
	{name: "Acquire", run: func(ctx context.Context, sem *pglimitsem.Semaphore, _ pgx.Tx, key string, _ pglimitsem.Slot) error {
		_, err := sem.Acquire(ctx, key)
		return err
	}},
	{name: "AcquireTx", tx: true, run: func(ctx context.Context, sem *pglimitsem.Semaphore, tx pgx.Tx, key string, _ pglimitsem.Slot) error {
		_, err := sem.AcquireTx(ctx, tx, key)
		return err
	}},
	{name: "AcquireLevel", run: func(ctx context.Context, sem *pglimitsem.Semaphore, _ pgx.Tx, key string, _ pglimitsem.Slot) error {
		_, err := sem.AcquireLevel(ctx, key, "level")
		return err
	}},
	{name: "Extend", run: func(ctx context.Context, sem *pglimitsem.Semaphore, _ pgx.Tx, _ string, held pglimitsem.Slot) error {
		_, err := sem.Extend(ctx, held)
		return err
	}},
	{name: "Release", run: func(ctx context.Context, sem *pglimitsem.Semaphore, _ pgx.Tx, _ string, held pglimitsem.Slot) error {
		return sem.Release(ctx, held)
	}},
	{name: "ReleaseTx", tx: true, run: func(ctx context.Context, sem *pglimitsem.Semaphore, tx pgx.Tx, _ string, held pglimitsem.Slot) error {
		return sem.ReleaseTx(ctx, tx, held)
	}},
}

// Every entry point keeps the semaphore's bounds: it returns by its
// deadline plus boundSlack while another transaction holds the slot's row
// or the table locked; the server's lock_timeout and statement_timeout
// come back as ErrTimeout (carrying 55P03 or 57014), a read-only server as
// ErrReadOnly; bad input is a typed error. A call the server refused, and
// bad input, change nothing, and a caller's transaction stays usable
// after the server refused a statement in it.
func TestSemaphoreBounds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		params  map[string]string // the pool's per-connection settings
		lock    string            // what another transaction holds during the call: "", "row" or "table"
		timeout time.Duration     // the semaphore's Timeout
		ctx     time.Duration     // the caller's deadline; 0 for none
		bad     bool              // the call gets bad input: an invalid key, a slot never acquired
		// want is the error of a call that waits (every call under a
		// table lock, those that write the held row under a row lock);
		// code its SQLSTATE, when the server raised it.
		want     error
		code     string
		deadline time.Duration // the call returns by deadline + boundSlack
		// unchanged: the table is as it was after the call, since the
		// server rolled back whatever it began.
		unchanged bool
	}{
		{name: "row locked, Timeout", lock: "row", timeout: time.Second, want: pglimit.ErrTimeout, deadline: time.Second},
		{name: "table locked, Timeout", lock: "table", timeout: time.Second, want: pglimit.ErrTimeout, deadline: time.Second},
		{name: "table locked, caller's deadline", lock: "table", timeout: 5 * time.Second, ctx: 300 * time.Millisecond, want: context.DeadlineExceeded, deadline: 300 * time.Millisecond},
		{name: "lock_timeout", params: map[string]string{"lock_timeout": "300ms"}, lock: "table", timeout: time.Second,
			want: pglimit.ErrTimeout, code: "55P03", deadline: time.Second, unchanged: true},
		{name: "statement_timeout", params: map[string]string{"statement_timeout": "300ms"}, lock: "table", timeout: 5 * time.Second,
			want: pglimit.ErrTimeout, code: "57014", deadline: 300 * time.Millisecond, unchanged: true},
		{name: "read-only", params: map[string]string{"default_transaction_read_only": "on"}, timeout: time.Second,
			want: pglimit.ErrReadOnly, code: "25006", deadline: time.Second, unchanged: true},
		{name: "bad input", bad: true, timeout: time.Second, deadline: 0, unchanged: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			schema := testdb.Schema(t)
			plain := testdb.Pool(t)
			pool := poolWith(t, c.params)
			cfg := pglimitsem.Config{Schema: schema, Slots: 1, TTL: time.Minute, Timeout: c.timeout,
				Levels: []pglimitsem.Level{{Name: "level", Max: 1}}}
			holder, sem := newSemaphore(t, plain, cfg), newSemaphore(t, pool, cfg)
			for _, call := range semCalls {
				t.Run(call.name, func(t *testing.T) {
					key := call.name
					held, err := holder.Acquire(ctx, key)
					if err != nil || !held.Acquired {
						t.Fatalf("Acquire beforehand: %+v, %v", held, err)
					}
					before := slotRows(t, plain, schema)
					unlock := lockSlots(t, plain, schema, c.lock, key)
					var tx pgx.Tx
					if call.tx {
						if tx, err = pool.Begin(ctx); err != nil {
							t.Fatal(err)
						}
						defer tx.Rollback(ctx)
					}
					callCtx := ctx
					if c.ctx > 0 {
						var cancel context.CancelFunc
						callCtx, cancel = context.WithTimeout(ctx, c.ctx)
						defer cancel()
					}
					if c.bad {
						key, held = "", pglimitsem.Slot{}
					}
					start := time.Now()
					err = call.run(callCtx, sem, tx, key, held)
					took := time.Since(start)
					unlock()

					if took > c.deadline+boundSlack {
						t.Errorf("returned after %s, past its deadline %s + %s", took, c.deadline, boundSlack)
					}
					acquires := strings.HasPrefix(call.name, "Acquire")
					waits := c.lock != "row" || !acquires
					switch {
					case c.bad && acquires:
						if !errors.Is(err, pglimit.ErrInvalidKey) {
							t.Fatalf("an invalid key: %v, want ErrInvalidKey", err)
						}
					case c.bad:
						if !errors.Is(err, pglimitsem.ErrSlotLost) {
							t.Fatalf("a slot never acquired: %v, want ErrSlotLost", err)
						}
					case !waits:
						// Acquiring skips a locked row: a refusal, at once.
						if err != nil {
							t.Fatalf("under a row lock: %v, want a refusal", err)
						}
					case !errors.Is(err, c.want):
						t.Fatalf("%v, want %v", err, c.want)
					case c.code != "" && sqlState(err) != c.code:
						t.Fatalf("%v: SQLSTATE %q, want %s", err, sqlState(err), c.code)
					}
					if c.unchanged {
						if after := slotRows(t, plain, schema); after != before {
							t.Fatalf("the slots changed:\nbefore %s\nafter  %s", before, after)
						}
					}
					if tx != nil && sqlState(err) != "" {
						var one int
						if err := tx.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
							t.Fatalf("the transaction is not usable after the server refused a statement: %v", err)
						}
					}
				})
			}
		})
	}
}

// poolWith returns a pool like testdb.Pool's whose connections start with
// params set, as ALTER ROLE ... SET would set them.
func poolWith(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// lockSlots has another transaction lock what: the row of key's slot, the
// whole table, or nothing. It returns the function that ends the
// transaction.
func lockSlots(t *testing.T, pool *pgxpool.Pool, schema, what, key string) func() {
	t.Helper()
	if what == "" {
		return func() {}
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	table := pgx.Identifier{schema, "pglimit_slots"}.Sanitize()
	switch what {
	case "row":
		var n int
		err = tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT FROM "+table+" WHERE key = $1 FOR UPDATE) AS locked", key).Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("locked %d rows, want 1", n)
		}
	case "table":
		_, err = tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
	}
	if err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx) }
}

// slotRows is every row of the slots table in schema, as text.
func slotRows(t *testing.T, db pglimit.DB, schema string) string {
	t.Helper()
	var s string
	q := "SELECT coalesce(string_agg(format('%s/%s/%s/%s/%s', namespace, key, slot, holder, expires_at), ' ' ORDER BY key, slot), '') FROM " +
		pgx.Identifier{schema, "pglimit_slots"}.Sanitize()
	if err := db.QueryRow(context.Background(), q).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// sqlState is the SQLSTATE err carries, or "".
func sqlState(err error) string {
	if e, ok := errors.AsType[*pgconn.PgError](err); ok {
		return e.Code
	}
	return ""
}
