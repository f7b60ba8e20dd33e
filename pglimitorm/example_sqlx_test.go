package pglimitorm_test

import (
	"context"
	"fmt"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/jmoiron/sqlx"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

// The GORM example with sqlx: one export an hour per user, decided in the
// transaction that records it.
func Example_sqlx() {
	ctx := context.Background()
	url, schema, drop := setUp(ctx)
	defer drop()

	db, err := sqlx.Connect("pgx", url)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	lim, err := pglimit.New(pglimitsql.DB(db.DB), &pglimit.Config{Schema: schema, Namespace: "export", Cooldown: time.Hour})
	if err != nil {
		panic(err)
	}
	table := schema + ".exports"
	db.MustExecContext(ctx, `CREATE TABLE `+table+` (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id text NOT NULL,
		format text NOT NULL CHECK (format IN ('csv', 'pdf')))`)

	export := func(user, format string) error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx), user)
		if err != nil {
			return err
		}
		if !d.Allowed {
			return errTooSoon
		}
		if _, err := tx.NamedExecContext(ctx, `INSERT INTO `+table+` (user_id, format) VALUES (:user, :format)`,
			map[string]any{"user": user, "format": format}); err != nil {
			return err
		}
		return tx.Commit()
	}
	fmt.Println("alice, csv:", outcome(export("alice", "csv")))
	fmt.Println("alice, pdf:", outcome(export("alice", "pdf")))
	fmt.Println("bob, xls:", outcome(export("bob", "xls")))
	fmt.Println("bob, pdf:", outcome(export("bob", "pdf")))

	var n int
	if err := db.GetContext(ctx, &n, `SELECT count(*) FROM `+table); err != nil {
		panic(err)
	}
	fmt.Println("exports recorded:", n)
	// Output:
	// alice, csv: recorded
	// alice, pdf: too soon
	// bob, xls: failed, not counted
	// bob, pdf: recorded
	// exports recorded: 2
}
