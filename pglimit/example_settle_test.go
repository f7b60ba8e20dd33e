package pglimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
)

// An LLM gateway limits each user to 1,000 tokens a minute. A request is
// admitted on an estimate of its tokens and settled with what it used: a
// short answer gives tokens back, a long one is charged, into a debt of at
// most 500 tokens, which the next minute repays.
func ExampleSettle() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-settle",
		Limits: []pglimit.Limit{{Name: "tokens", Rate: 1000, Algorithm: pglimit.FixedWindow, Calendar: "minute",
			Debt: 500}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "user-42")

	// completion admits a request estimated at estimate tokens, which then
	// uses used tokens.
	completion := func(estimate, used int) string {
		d, err := lim.AllowN(ctx, "user-42", estimate)
		if err != nil {
			panic(err)
		}
		if !d.Allowed {
			return "refused: it owes tokens"
		}
		s, err := pglimit.Settle(ctx, lim, d, used)
		if err != nil {
			panic(err)
		}
		return fmt.Sprintf("%+v", s)
	}
	// A new minute may start between the calls; wait for one that has
	// time left, so that all three fall in it.
	for time.Now().Second() > 50 {
		time.Sleep(time.Second)
	}
	fmt.Println(completion(400, 150))
	fmt.Println(completion(400, 1200))
	fmt.Println(completion(10, 10))
	// Output:
	// {Returned:250 Charged:0 Forgiven:0}
	// {Returned:0 Charged:800 Forgiven:0}
	// refused: it owes tokens
}

// The same gateway, where the debt cap stops a runaway request: 550
// tokens used of 1,000, and a request estimated at 400 uses 1,900. Its
// 1,500 past the estimate are charged up to the cap, 1,000 + 500 in all,
// and the rest is forgiven.
func ExampleSettle_cap() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool, ""); err != nil {
		panic(err)
	}
	lim, err := pglimit.New(pool, &pglimit.Config{
		Namespace: "example-settle-cap",
		Limits:    []pglimit.Limit{{Name: "tokens", Rate: 1000, Period: time.Hour, Algorithm: pglimit.FixedWindow, Debt: 500}},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Reset(ctx, "user-42")
	if _, err := lim.AllowN(ctx, "user-42", 550); err != nil {
		panic(err)
	}
	d, err := lim.AllowN(ctx, "user-42", 400)
	if err != nil {
		panic(err)
	}
	s, err := pglimit.Settle(ctx, lim, d, 1900)
	fmt.Printf("%+v %v\n", s, err)
	// Output:
	// {Returned:0 Charged:550 Forgiven:950} <nil>
}
