// Command pglimit answers the questions of the person on call about a
// pglimit limiter, and changes what they need changed: why a key is
// refused and until when, lift its limit for an hour, reset it, which
// keys are at their limits, whether the cleanup job keeps up, and a key's
// billing period, or forget it.
//
//	pglimit [flags] inspect KEY
//	pglimit [flags] limited [-n N] [-after KEY] [-max M]
//	pglimit [flags] overrides list [-after KEY] [-max M]
//	pglimit [flags] overrides set [-for DURATION] KEY NAME=RATE[/BURST] ...
//	pglimit [flags] overrides clear KEY
//	pglimit [flags] reset KEY
//	pglimit [flags] cleaner [-tables T1,T2] [-retention DURATION]
//	pglimit [flags] health [NAME]
//	pglimit [flags] usage [-yearly] [-allowance N] [-hard-cap N] [-tz ZONE] KEY
//	pglimit [flags] forget [-yearly] [-allowance N] [-hard-cap N] [-tz ZONE] KEY
//
// The limiter is the one its namespace recorded: a limiter records its
// policy (strategy, limits, per-key limits) in its schema at its first
// decision (pglimit.RecordedPolicies), so -namespace (or
// PGLIMIT_NAMESPACE) and -schema are enough. A description given as well
// (-strategy, -limit, -cooldown, -overrides, or their PGLIMIT_ variables)
// is checked against it: one that differs from the latest recorded policy,
// and from the one before it, which a rolling deploy may still run, is
// refused with exit status 2 naming each difference, as is a namespace
// that recorded none, naming those that did, closest first. In a schema
// migrated before limiters recorded their policies, the description is
// taken as given, with a warning. The database URL comes from -database-url or
// DATABASE_URL. Every command is one statement of the library's Go API
// (Inspect, LimitedKeys, ListKeyLimits, SetKeyLimits, SetKeyLimitsFor,
// Reset, pglimitclean.Inspect, pglimithealth.Status, pglimitquota's Usage
// and Forget, for which -namespace names the quota's namespace; forget
// reads the key's Usage first, to print what it deleted). With -dry-run a command that writes runs in a
// transaction that it rolls back, and prints what it would have done.
// With -json it prints JSON instead of tables.
//
// Exit status: 0 done, 1 the database or the command failed, 2 bad input.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitclean"
	"github.com/pglimit/cooldown/pglimit/pglimithealth"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// usageError is bad input: exit status 2.
type usageError struct{ error }

// options are the flags every command takes, before the command's name.
type options struct {
	databaseURL string
	cfg         pglimit.Config
	json        bool
	dryRun      bool
	given       given // what the flags describe of the limiter
}

const usage = `usage: pglimit [flags] COMMAND [ARGS]

Commands:
  inspect KEY                     where KEY stands under each limit, and its own limits
  limited [-n N] [-after KEY] [-max M]
                                  keys that would refuse N units now (N=1: at their limit)
  overrides list [-after KEY] [-max M]
                                  keys with limits of their own
  overrides set [-for D] KEY NAME=RATE[/BURST] ...
                                  give KEY its own rate and/or burst (for D, else for good)
  overrides clear KEY             take KEY's own limits away
  reset KEY                       clear KEY's state: every limit back to full
  cleaner [-tables T,...] [-retention D]
                                  the cleanup job's leader and each table's backlog
  health [NAME]                   each health throttle's rate now, and why (or NAME's)
  usage [-yearly] [-allowance N] [-hard-cap N] [-tz ZONE] KEY
                                  KEY's billing period (pglimitquota, of -namespace): used,
                                  allowance, credits left, overage, its end; the flags are
                                  the quota's Config, for a key without a plan of its own
  forget [-yearly] [-allowance N] [-hard-cap N] [-tz ZONE] KEY
                                  delete KEY's billing state (pglimitquota, of -namespace):
                                  plan, counters, credits and ids; prints its period before.
                                  Its threshold events stay until taken

A limit (-limit, repeated; or PGLIMIT_LIMITS, separated by ";"):
  [NAME=]RATE/PERIOD[,burst=N][,debt=N][,fixed|,sliding][,tz=ZONE]
  such as per-minute=5/1m,burst=3  daily=1000/day,tz=Europe/Paris  hourly=100/1h,sliding

Flags:
`

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, rest, err := parseFlags(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err == nil {
		err = o.command(ctx, rest, stdout, stderr)
	}
	if err == nil {
		return 0
	}
	// The library's errors name it already.
	fmt.Fprintln(stderr, "pglimit: "+strings.TrimPrefix(err.Error(), "pglimit: "))
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, pglimit.ErrInvalidKey) || errors.Is(err, pglimit.ErrInvalidConfig) ||
		errors.Is(err, pglimit.ErrInvalidCost) || errors.Is(err, pglimit.ErrUnsupported) {
		return 2
	}
	return 1
}

// parseFlags reads the flags before the command, with the environment's
// values as defaults.
func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (*options, []string, error) {
	o := &options{}
	fs := flag.NewFlagSet("pglimit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	env := func(name, def string) string {
		if v := getenv(name); v != "" {
			return v
		}
		return def
	}
	var limits []string
	if v := getenv("PGLIMIT_LIMITS"); v != "" {
		limits = strings.Split(v, ";")
	}
	fromEnv := limits != nil
	var strategy string
	fs.StringVar(&o.databaseURL, "database-url", env("DATABASE_URL", ""), "PostgreSQL URL (env DATABASE_URL)")
	fs.StringVar(&o.cfg.Schema, "schema", env("PGLIMIT_SCHEMA", ""), `the limiter's schema (env PGLIMIT_SCHEMA; "" means public)`)
	fs.StringVar(&o.cfg.Namespace, "namespace", env("PGLIMIT_NAMESPACE", ""), "the limiter's Config.Namespace (env PGLIMIT_NAMESPACE; empty: derived from -limit, as the library does, or else the only one the schema recorded)")
	fs.StringVar(&strategy, "strategy", env("PGLIMIT_STRATEGY", "upsert"), "upsert or nowait (env PGLIMIT_STRATEGY)")
	fs.Func("limit", "one of the limiter's limits, in its order; repeat for each (env PGLIMIT_LIMITS; default: those the namespace recorded, which a description must match)", func(s string) error {
		if fromEnv {
			limits, fromEnv = nil, false // the flags replace the environment's
		}
		limits = append(limits, s)
		return nil
	})
	fs.DurationVar(&o.cfg.Cooldown, "cooldown", 0, "the limiter's Config.Cooldown, instead of -limit")
	fs.BoolVar(&o.cfg.Overrides, "overrides", env("PGLIMIT_OVERRIDES", "") == "true", "the limiter reads per-key limits (Config.Overrides; env PGLIMIT_OVERRIDES=true)")
	fs.DurationVar(&o.cfg.Timeout, "timeout", 10*time.Second, "the longest a command's statement may take")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of tables")
	fs.BoolVar(&o.dryRun, "dry-run", false, "run a command that writes in a transaction that is rolled back, and print what it would do")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, nil, err
		}
		return nil, nil, usageError{err}
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "strategy":
			o.given.strategy = true
		case "limit", "cooldown":
			o.given.limits = true
		case "overrides":
			o.given.overrides = true
		}
	})
	o.given.strategy = o.given.strategy || getenv("PGLIMIT_STRATEGY") != ""
	o.given.limits = o.given.limits || limits != nil
	o.given.overrides = o.given.overrides || getenv("PGLIMIT_OVERRIDES") != ""
	var err error
	if o.cfg.Strategy, err = pglimit.ParseStrategy(strategy); err != nil {
		return nil, nil, err
	}
	for _, s := range limits {
		l, err := parseLimit(strings.TrimSpace(s))
		if err != nil {
			return nil, nil, usageError{err}
		}
		o.cfg.Limits = append(o.cfg.Limits, l)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, nil, usageError{errors.New("no command")}
	}
	return o, fs.Args(), nil
}

// command runs the command args names.
func (o *options) command(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	name, args := args[0], args[1:]
	if name == "overrides" {
		if len(args) == 0 {
			return usageError{errors.New("overrides: want list, set or clear")}
		}
		name, args = "overrides "+args[0], args[1:]
	}
	fs := flag.NewFlagSet("pglimit "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("n", 1, "units a request asks for")
	after := fs.String("after", "", "list the keys after this one")
	max := fs.Int("max", 50, "list at most this many")
	ttl := fs.Duration("for", 0, "how long the key's own limits count (0: for good)")
	tables := fs.String("tables", "", "the cleaner's tables, separated by commas (default: the library's)")
	retention := fs.Duration("retention", 0, "the cleaner's Retention (default: the library's, 10m)")
	var quota pglimitquota.Config
	yearly := fs.Bool("yearly", false, "the quota's periods are yearly (default: monthly)")
	fs.Int64Var(&quota.Allowance, "allowance", 0, "the quota's Config.Allowance")
	fs.Int64Var(&quota.HardCap, "hard-cap", 0, "the quota's Config.HardCap")
	fs.StringVar(&quota.TimeZone, "tz", "", "the quota's Config.TimeZone (default UTC)")
	// Also after the command, where they are easy to add to one.
	fs.BoolVar(&o.json, "json", o.json, "print JSON instead of tables")
	fs.BoolVar(&o.dryRun, "dry-run", o.dryRun, "roll back what the command writes")
	if err := fs.Parse(args); err != nil {
		return usageError{fmt.Errorf("%s: %w", name, err)}
	}
	args = fs.Args()
	if usages[name] == "no arguments" && len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", name, args)}
	}
	// wantKey is the command's key, followed by more arguments or none.
	wantKey := func(more bool) (string, error) {
		if len(args) == 0 || more && len(args) == 1 || !more && len(args) > 1 {
			return "", usageError{fmt.Errorf("%s: want %s", name, usages[name])}
		}
		return args[0], pglimit.ValidateKey(args[0])
	}
	if _, ok := usages[name]; !ok {
		return usageError{fmt.Errorf("unknown command %q", name)}
	}
	if o.databaseURL == "" {
		return usageError{errors.New("no database: set -database-url or DATABASE_URL")}
	}
	pool, err := pgxpool.New(ctx, o.databaseURL)
	if err != nil {
		return usageError{fmt.Errorf("database URL: %w", err)}
	}
	defer pool.Close()
	p := printer{w: stdout, json: o.json}
	var lim pglimit.Limiter // the limiter described, for the commands that read
	if name != "cleaner" && name != "usage" && name != "forget" {
		if err := o.resolve(ctx, pool, stderr); err != nil {
			return err
		}
		if lim, err = pglimit.New(pool, &o.cfg); err != nil {
			return err
		}
	}
	if strings.HasPrefix(name, "overrides ") && !o.cfg.Overrides {
		return usageError{fmt.Errorf("%s: the limiter described reads no per-key limits: pass -overrides before the command (or set PGLIMIT_OVERRIDES=true), as its Config sets Overrides", name)}
	}

	switch name {
	case "inspect":
		key, err := wantKey(false)
		if err != nil {
			return err
		}
		st, err := pglimit.Inspect(ctx, lim, key)
		if err != nil {
			return err
		}
		return p.state(o.cfg, st)
	case "limited":
		states, err := pglimit.LimitedKeys(ctx, lim, *n, *after, *max)
		if err != nil {
			return err
		}
		return p.limited(*n, *max, states)
	case "overrides list":
		own, err := pglimit.ListKeyLimits(ctx, lim, *after, *max)
		if err != nil {
			return err
		}
		return p.own(*max, own)
	case "overrides set", "overrides clear", "reset":
		key, err := wantKey(name == "overrides set")
		if err != nil {
			return err
		}
		var own []pglimit.Limit
		for _, s := range args[1:] {
			l, err := parseOwn(s)
			if err != nil {
				return usageError{err}
			}
			own = append(own, l)
		}
		return o.write(ctx, pool, p, name, key, own, *ttl)
	case "cleaner":
		cfg := pglimitclean.Config{Schema: o.cfg.Schema, Retention: *retention}
		if *tables != "" {
			cfg.Tables = strings.Split(*tables, ",")
		}
		st, err := pglimitclean.Inspect(ctx, pool, &cfg)
		if err != nil {
			return err
		}
		return p.cleaner(st)
	case "health":
		if len(args) > 1 {
			return usageError{fmt.Errorf("health: want %s", usages[name])}
		}
		var throttle string
		if len(args) == 1 {
			throttle = args[0]
		}
		ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
		defer cancel()
		st, err := pglimithealth.Status(ctx, pool, o.cfg.Schema, throttle)
		if err != nil {
			return err
		}
		return p.health(throttle, st)
	case "usage", "forget":
		key, err := wantKey(false)
		if err != nil {
			return err
		}
		quota.Schema, quota.Namespace, quota.Timeout = o.cfg.Schema, o.cfg.Namespace, o.cfg.Timeout
		if *yearly {
			quota.Period = pglimitquota.Yearly
		}
		if name == "forget" {
			return o.forget(ctx, pool, p, key, &quota)
		}
		q, err := pglimitquota.New(pool, &quota)
		if err != nil {
			return err
		}
		u, err := q.Usage(ctx, key)
		if err != nil {
			return err
		}
		return p.usage(key, u)
	}
	return nil
}

// usages are the commands' arguments, for their errors.
var usages = map[string]string{
	"inspect": "KEY", "limited": "no arguments", "overrides list": "no arguments",
	"overrides set": "KEY NAME=RATE[/BURST] ...", "overrides clear": "KEY", "reset": "KEY", "cleaner": "no arguments",
	"health": "[NAME]", "usage": "KEY", "forget": "KEY",
}

// writer is what a command that writes sends its statements through:
// pool, or with -dry-run a transaction on it that end rolls back.
func (o *options) writer(ctx context.Context, pool *pgxpool.Pool) (db pglimit.DB, end func(), err error) {
	if !o.dryRun {
		return pool, func() {}, nil
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, nil, err
	}
	return tx, func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }, nil // the dry run's end
}

// forget forgets key of the quota of cfg, and prints its period as it
// stood before. With -dry-run it runs in a transaction that it rolls
// back.
func (o *options) forget(ctx context.Context, pool *pgxpool.Pool, p printer, key string, cfg *pglimitquota.Config) error {
	db, end, err := o.writer(ctx, pool)
	if err != nil {
		return err
	}
	defer end()
	q, err := pglimitquota.New(db, cfg)
	if err != nil {
		return err
	}
	u, err := q.Usage(ctx, key)
	if err != nil {
		return err
	}
	if err := q.Forget(ctx, key); err != nil {
		return err
	}
	return p.forgot(key, o.dryRun, u)
}

// write runs a command that writes (name), on key, then prints the key's
// state as it leaves it. With -dry-run it runs in a transaction, reads the
// state there, and rolls back.
func (o *options) write(ctx context.Context, pool *pgxpool.Pool, p printer, name, key string, own []pglimit.Limit, ttl time.Duration) error {
	db, end, err := o.writer(ctx, pool)
	if err != nil {
		return err
	}
	defer end()
	lim, err := pglimit.New(db, &o.cfg)
	if err != nil {
		return err
	}
	switch {
	case name == "reset":
		err = lim.Reset(ctx, key)
	case name == "overrides clear":
		err = pglimit.SetKeyLimits(ctx, lim, key)
	case ttl != 0:
		err = pglimit.SetKeyLimitsFor(ctx, lim, key, ttl, own...)
	default:
		err = pglimit.SetKeyLimits(ctx, lim, key, own...)
	}
	if err != nil {
		return err
	}
	st, err := pglimit.Inspect(ctx, lim, key)
	if errors.Is(err, pglimit.ErrUnsupported) { // Range: its write is done
		return p.done(name, key, o.dryRun, nil)
	}
	if err != nil {
		return err
	}
	return p.done(name, key, o.dryRun, &st)
}
