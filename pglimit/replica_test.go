package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/internal/pgserver"
	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// replicaPair starts a durable local cluster and a streaming standby of
// it, for the calling test alone. It needs PostgreSQL's server binaries
// (a container has no standby here).
func replicaPair(t *testing.T) (primary, standby *pgserver.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	primary, err := pgserver.Start(ctx, &pgserver.Config{Prefer: pgserver.KindLocal, BinDir: os.Getenv(pglimittest.EnvPGBin), Durable: true})
	if err != nil {
		pglimittest.Missing(t, "a primary and a standby need PostgreSQL's server binaries (apt-get install postgresql): %v", err)
	}
	t.Cleanup(func() {
		if err := primary.Close(); err != nil {
			t.Errorf("primary: %v", err)
		}
	})
	if standby, err = primary.Standby(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := standby.Close(); err != nil {
			t.Errorf("standby: %v", err)
		}
	})
	return primary, standby
}

// serverPool is a pool of url with an empty search_path, closed when the
// test ends.
func serverPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// caughtUp waits until standby has replayed everything primary has
// written so far.
func caughtUp(t *testing.T, primary, standby *pgxpool.Pool) {
	t.Helper()
	var lsn string
	if err := primary.QueryRow(t.Context(), "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby to replay "+lsn, func() bool {
		var done bool
		err := standby.QueryRow(t.Context(), "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn).Scan(&done)
		return err == nil && done
	})
}

// A limiter pointed at a standby fails with ErrReadOnly: every strategy's
// Allow, AllowTx and Reset, a pool that asks for a read-write server and
// finds only the standby, and Migrate, whether the schema was migrated on
// the primary or never (then not ErrExtension either). No error names Citus, which these servers do not
// have. Peek reads the replicated state.
func TestReadOnlyServer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary, standby := replicaPair(t)
	pp, sp := serverPool(t, primary.URL()), serverPool(t, standby.URL())
	const schema = "replicated"
	if err := pglimit.Migrate(ctx, pp, schema); err != nil {
		t.Fatal(err)
	}
	newLim := func(db pglimit.DB, s pglimit.Strategy) pglimit.Limiter {
		t.Helper()
		cfg := &pglimit.Config{Strategy: s, Schema: schema, Limits: []pglimit.Limit{{Rate: 1, Period: time.Hour, Burst: 2}}}
		if s == pglimit.Range {
			cfg.Limits, cfg.Cooldown = nil, time.Hour
		}
		lim, err := pglimit.New(db, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	onPrimary := map[pglimit.Strategy]pglimit.Decision{}
	for _, s := range pglimit.Strategies() {
		lim := newLim(pp, s)
		if d, err := lim.Allow(ctx, "k"); err != nil || !d.Allowed {
			t.Fatalf("%s on the primary: %+v, %v", s, d, err)
		}
		p, err := lim.Peek(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		onPrimary[s] = p
	}
	caughtUp(t, pp, sp)

	readOnly := func(what string, err error) {
		t.Helper()
		switch {
		case !errors.Is(err, pglimit.ErrReadOnly):
			t.Errorf("%s: %v; want ErrReadOnly", what, err)
		case strings.Contains(err.Error(), "Citus"):
			t.Errorf("%s: %v names Citus", what, err)
		}
	}
	readWrite := serverPool(t, fmt.Sprintf("%s&target_session_attrs=read-write", standby.URL()))
	for _, s := range pglimit.Strategies() {
		lim := newLim(sp, s)
		d, err := lim.Allow(ctx, "k")
		readOnly(fmt.Sprintf("%s Allow", s), err)
		if d.Allowed {
			t.Errorf("%s: the standby admitted", s)
		}
		readOnly(fmt.Sprintf("%s Reset", s), lim.Reset(ctx, "k"))
		tx, err := sp.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = lim.AllowTx(ctx, tx, "k")
		readOnly(fmt.Sprintf("%s AllowTx", s), err)
		if err := tx.Rollback(ctx); err != nil {
			t.Errorf("%s: the caller's transaction: %v", s, err)
		}
		if p, err := lim.Peek(ctx, "k", 1); err != nil || p.Allowed != onPrimary[s].Allowed || p.Remaining != onPrimary[s].Remaining {
			t.Errorf("%s Peek on the standby: %+v, %v; on the primary %+v", s, p, err, onPrimary[s])
		}

		_, err = newLim(readWrite, s).Allow(ctx, "k")
		readOnly(fmt.Sprintf("%s Allow, target_session_attrs=read-write", s), err)
	}
	readOnly("Migrate, migrated", pglimit.Migrate(ctx, sp, schema))
	readOnly("Migrate, a new schema", pglimit.Migrate(ctx, sp, "never"))
	err := pglimit.Migrate(ctx, sp, "public")
	readOnly("Migrate, public, never migrated", err)
	if errors.Is(err, pglimit.ErrExtension) {
		t.Errorf("Migrate on a standby: %v; the extension is not what is missing", err)
	}
}
