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

// Export is a row of the GORM example's table.
type Export struct {
	ID     uint
	UserID string
	Format string `gorm:"check:format IN ('csv', 'pdf')"`
}

// A user may start one export an hour. The decision is taken inside the
// GORM transaction that records the export, so it counts only if the
// export is recorded: bob's first export fails its check, the transaction
// rolls back, and his next one is admitted.
func Example_gorm() {
	ctx := context.Background()
	url, schema, drop := setUp(ctx)
	defer drop()

	// GORM's PostgreSQL driver opens the *sql.DB with pgx's driver, which
	// the limiter's own statements use.
	db, err := gorm.Open(postgres.Open(url), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		panic(err)
	}
	defer sqlDB.Close()
	lim, err := pglimit.New(pglimitsql.DB(sqlDB), &pglimit.Config{Schema: schema, Namespace: "export", Cooldown: time.Hour})
	if err != nil {
		panic(err)
	}
	exports := db.Table(schema + ".exports")
	if err := exports.AutoMigrate(&Export{}); err != nil {
		panic(err)
	}

	export := func(user, format string) error {
		return exports.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			d, err := lim.AllowTx(ctx, pglimitsql.Tx(tx.Statement.ConnPool), user)
			if err != nil {
				return err
			}
			if !d.Allowed {
				return errTooSoon
			}
			return tx.Create(&Export{UserID: user, Format: format}).Error
		})
	}
	fmt.Println("alice, csv:", outcome(export("alice", "csv")))
	fmt.Println("alice, pdf:", outcome(export("alice", "pdf")))
	fmt.Println("bob, xls:", outcome(export("bob", "xls")))
	fmt.Println("bob, pdf:", outcome(export("bob", "pdf")))

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
