package pglimitquota_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// A monthly plan from a customer's signup day: 100 units, overage up to
// 130 in all, and a one-off credit of 50 units for 30 days. Charges take the
// allowance first, then the credit, then overage, and stop at the hard
// cap; a retried request with the same Idempotency-Key is charged once.
func Example() {
	ctx := context.Background()
	url, err := pglimittest.ServerURL()
	if err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	billing, err := pglimitquota.New(pool, &pglimitquota.Config{
		Namespace:  "example-billing",
		Thresholds: []float64{0.8, 1},
	})
	if err != nil {
		panic(err)
	}
	customer := "customer-" + rand.Text() // a new customer on each run

	// Signed up on the 31st: the period resets on the 30th in April and
	// on 28 or 29 February.
	plan := pglimitquota.Plan{Anchor: pglimitquota.Anchor{Day: 31}, TimeZone: "Europe/Berlin", Allowance: 100, HardCap: 130}
	if _, err := billing.SetPlan(ctx, customer, plan, pglimitquota.AtOnce); err != nil {
		panic(err)
	}
	if err := billing.Grant(ctx, customer, 50, time.Now().AddDate(0, 0, 30)); err != nil {
		panic(err)
	}
	for _, cost := range []int64{90, 40, 40, 15} {
		d, err := billing.Allow(ctx, customer, cost)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%d: allowed %v, allowance %d, credits %d, overage %d\n", cost, d.Allowed, d.FromAllowance, d.FromCredits, d.Overage)
	}

	// A request retried with its Idempotency-Key is charged once.
	request := pglimit.WithID(ctx, "idem-"+customer)
	first, _ := billing.Allow(request, customer, 3)
	retry, _ := billing.Allow(request, customer, 3)
	fmt.Println("retry replayed:", retry.Replayed, "overage:", retry.Overage == first.Overage)

	u, err := billing.Usage(ctx, customer)
	if err != nil {
		panic(err)
	}
	fmt.Printf("used %d of %d (overage %d), credits left %d\n", u.Used, u.Allowance, u.Overage, u.CreditsLeft)
	// Output:
	// 90: allowed true, allowance 90, credits 0, overage 0
	// 40: allowed true, allowance 10, credits 30, overage 0
	// 40: allowed true, allowance 0, credits 20, overage 20
	// 15: allowed false, allowance 0, credits 0, overage 0
	// retry replayed: true overage: true
	// used 173 of 100 (overage 23), credits left 0
}
