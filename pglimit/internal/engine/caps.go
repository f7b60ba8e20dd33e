package engine

import (
	"fmt"
	"slices"

	"github.com/pglimit/cooldown/pglimit/internal/fault"
)

// Op is an operation, named as pglimit's Op names it (the root's
// constants are these).
type Op string

// The operations.
const (
	Allow           Op = "Allow"
	AllowN          Op = "AllowN"
	AllowTx         Op = "AllowTx"
	AllowTxN        Op = "AllowTxN"
	AllowAtMost     Op = "AllowAtMost"
	Reserve         Op = "Reserve"
	AllowAll        Op = "AllowAll"
	Peek            Op = "Peek"
	Reset           Op = "Reset"
	Refund          Op = "Refund"
	RefundID        Op = "RefundID"
	Settle          Op = "Settle"
	SettleID        Op = "SettleID"
	Pause           Op = "Pause"
	Inspect         Op = "Inspect"
	LimitedKeys     Op = "LimitedKeys"
	SetKeyLimits    Op = "SetKeyLimits"
	SetKeyLimitsFor Op = "SetKeyLimitsFor"
	ListKeyLimits   Op = "ListKeyLimits"

	// Open is the check of a limiter's table that every operation runs
	// before its first statement on it: the rows every operation shares.
	Open Op = "Open"

	// Distribute is pglimit.Distribute, of a schema rather than a limiter.
	Distribute Op = "Distribute"
)

// Strategy is a limiter's strategy, as pglimit.Strategy spells it.
type Strategy string

// The strategies.
const (
	Upsert Strategy = "upsert"
	NoWait Strategy = "nowait"
	Range  Strategy = "range"
)

// Deployment is what the database makes of a limiter's table.
type Deployment int

const (
	// Unchecked: not found out yet (no statement has run); it answers
	// nothing.
	Unchecked Deployment = iota
	// OneServer: a table of one server, or one that Citus does not
	// distribute.
	OneServer
	// Distributed: a table Citus distributes, with pglimit's functions
	// installed there (pglimit.Distribute).
	Distributed
	// DistributedBare: a table Citus distributes, without pglimit's
	// functions.
	DistributedBare
	// NoCitus: Distribute's, a database without the citus extension.
	NoCitus
)

// Limit is what the table reads of one of a limiter's limits.
type Limit struct {
	Name      string
	Algorithm string // as pglimit.Algorithm prints it
	GCRA      bool
	Calendar  bool // a calendar window
	Debt      bool // a Debt above zero
}

// Shape is what an operation may depend on: the limiter's facets, what
// the database made of its table, and the call's own. The fields below
// Shadow only name things in the messages.
type Shape struct {
	Strategy   Strategy
	Limits     []Limit
	Overrides  bool // per-key limits (Config.Overrides)
	Shadow     bool
	Deployment Deployment

	// ID: the call carries a decision id (pglimit.WithID) and reads it;
	// only the decision methods and AllowAll read one.
	ID bool
	// Leased: Refund's and Settle's decision had its units from a lease.
	Leased bool

	Schema string // the table's schema
	Table  string // the table, schema-qualified and quoted
	Level  int    // AllowAll's: the charge's index in charges
}

// Check is nil when op works on s, and otherwise an error that wraps
// fault.ErrUnsupported and says why, naming op. It is the one place
// that raises ErrUnsupported for a limiter's operation.
func Check(op Op, s Shape) error {
	why := own(op, s)
	if why == "" && op != Distribute {
		why = shared(s)
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %s", fault.ErrUnsupported, why)
}

// own is op's own rows: why it does not work on s, or "".
func own(op Op, s Shape) string {
	rangeOrOverrides := s.Strategy == Range || s.Overrides
	distributed := s.Deployment == Distributed
	switch op {
	case Allow, AllowN, AllowTx, AllowTxN, AllowAtMost:
		return withID(s)
	case Reserve:
		if s.Strategy == Range {
			return fmt.Sprintf("Reserve on the %s strategy", s.Strategy)
		}
		for _, lim := range s.Limits {
			if !lim.GCRA {
				return fmt.Sprintf("Reserve on limit %q, which is %s, not GCRA", lim.Name, lim.Algorithm)
			}
		}
		return withID(s)
	case AllowAll:
		switch {
		case s.Strategy == Range:
			return fmt.Sprintf("AllowAll on the Range strategy (charges[%d])", s.Level)
		case s.ID && rangeOrOverrides:
			return fmt.Sprintf("a decision id on AllowAll with charges[%d] on the %s strategy or with Overrides (not yet)", s.Level, s.Strategy)
		case s.ID && s.Shadow:
			return fmt.Sprintf("a decision id on AllowAll with charges[%d] in shadow mode (not yet)", s.Level)
		case distributed:
			return fmt.Sprintf("AllowAll on a table Citus distributes (%s)", s.Table)
		}
	case Refund, Settle:
		switch {
		case s.Strategy == Range:
			return fmt.Sprintf("%s on the %s strategy", op, s.Strategy)
		case distributed:
			return fmt.Sprintf("%s on a Citus distributed table", op)
		case s.Leased:
			return fmt.Sprintf("%s of units served from a lease", op)
		}
	case RefundID, SettleID:
		switch {
		case rangeOrOverrides:
			return fmt.Sprintf("%s on the %s strategy or with Overrides (not yet)", op, s.Strategy)
		case distributed:
			return fmt.Sprintf("%s on a Citus distributed table", op)
		}
	case Inspect, LimitedKeys:
		if s.Strategy == Range {
			return fmt.Sprintf("%s on the Range strategy, whose rows are admissions; use Peek", op)
		}
	case Pause:
		single := len(s.Limits) == 1 && s.Limits[0].GCRA && !s.Overrides
		switch {
		case !single || s.Strategy == Range:
			return "Pause needs one GCRA limit without per-key limits on the Upsert or NoWait strategy"
		case distributed:
			return "Pause on a Citus distributed table"
		}
	case Distribute:
		if s.Deployment == NoCitus {
			return "distribute: the citus extension is not installed in this database (CREATE EXTENSION citus, on a Citus cluster's coordinator)"
		}
	}
	return ""
}

// withID is the rows of a decision method's id.
func withID(s Shape) string {
	switch {
	case !s.ID:
	case s.Strategy == Range || s.Overrides:
		return fmt.Sprintf("a decision id on the %s strategy or with Overrides (not yet)", s.Strategy)
	case s.Deployment == Distributed:
		return "a decision id on a table Citus distributes (not yet)"
	}
	return ""
}

// shared is the rows every operation on a limiter's table shares
// ([Open]'s): why none works on s, or "".
func shared(s Shape) string {
	switch s.Deployment {
	case DistributedBare:
		return fmt.Sprintf("%s is a Citus distributed table without pglimit's functions; run pglimit.Distribute on schema %s", s.Table, s.Schema)
	case Distributed:
		if i := slices.IndexFunc(s.Limits, func(l Limit) bool { return l.Debt }); i >= 0 {
			// Its functions know no debt, and Settle does not run there.
			return fmt.Sprintf("limit %s has a Debt, on %s, a Citus distributed table", s.Limits[i].Name, s.Table)
		}
		if s.Overrides || slices.ContainsFunc(s.Limits, func(l Limit) bool { return l.Calendar }) {
			// The distributed statements decide in PL/pgSQL, which knows
			// the limiter's own limits and windows of a fixed length only.
			return "calendar windows and per-key limits on a Citus distributed table"
		}
	}
	return ""
}
