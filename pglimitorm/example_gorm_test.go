package pglimitorm_test

import (
	"context"
	"fmt"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitsql"
)

// Export is a row of the application's exports table.
type Export struct {
	ID     uint
	UserID string
	Format string `gorm:"check:format IN ('csv', 'pdf')"`
}

// newExporter returns a function that records a user's export in db, the
// GORM handle of the exports table, at most one an hour per user. The
// limiter decides in the transaction that records the export, so an export
// that fails is not counted. schema is pglimit's ("" for public).
func newExporter(db *gorm.DB, schema string) (func(ctx context.Context, user, format string) error, error) {
	sqlDB, err := db.DB() // GORM's PostgreSQL driver opens it with pgx's driver
	if err != nil {
		return nil, err
	}
	lim, err := pglimit.New(pglimitsql.DB(sqlDB), &pglimit.Config{Schema: schema, Namespace: "export", Cooldown: time.Hour})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, user, format string) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx.Statement.ConnPool), user)
			if err != nil {
				return err
			}
			if !d.Allowed {
				return errTooSoon // rolls back; d.RetryAfter says how long
			}
			return tx.Create(&Export{UserID: user, Format: format}).Error
		})
	}, nil
}

// A user may start one export an hour. The decision is taken inside the
// GORM transaction that records the export, so it counts only if the
// export is recorded: bob's first export fails its check, the transaction
// rolls back, and his next one is admitted.
func Example_gorm() {
	ctx := context.Background()
	url, schema, drop := setUp(ctx)
	defer drop()

	db, err := gorm.Open(postgres.Open(url), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	exports := db.Table(schema + ".exports")
	if err := exports.AutoMigrate(&Export{}); err != nil {
		panic(err)
	}
	export, err := newExporter(exports, schema)
	if err != nil {
		panic(err)
	}
	fmt.Println("alice, csv:", outcome(export(ctx, "alice", "csv")))
	fmt.Println("alice, pdf:", outcome(export(ctx, "alice", "pdf")))
	fmt.Println("bob, xls:", outcome(export(ctx, "bob", "xls")))
	fmt.Println("bob, pdf:", outcome(export(ctx, "bob", "pdf")))

	var n int64
	if err := db.Table(schema + ".exports").Count(&n).Error; err != nil {
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
