package pglimit_test

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// distribute prepares a Citus cluster for pglimit's limiters: on the
// coordinator, as the owner of the schema, it applies the migrations and
// distributes the tables by key. Both steps are safe to run again.
func distribute(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pglimit.Migrate(ctx, pool, "public"); err != nil {
		return err
	}
	return pglimit.Distribute(ctx, pool, "public")
}

// A deployment step, run against the coordinator. (Compiled, not run: the
// Citus tests distribute a schema of their own in the same two steps.)
func ExampleDistribute() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@coordinator:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := distribute(ctx, pool); err != nil {
		panic(err)
	}
}
