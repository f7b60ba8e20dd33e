package pglimitquota_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/cooldown/pglimit"
	"github.com/pglimit/cooldown/pglimit/pglimitquota"
	"github.com/pglimit/cooldown/pglimit/pglimittest"
)

// The environment variables that rerun TestModelQuota: the seed a failure
// names repeats every sequence's choices; the sequence, only that one.
const (
	envQuotaModelSeed     = "PGLIMIT_QUOTA_MODEL_SEED"
	envQuotaModelSequence = "PGLIMIT_QUOTA_MODEL_SEQUENCE"
)

// TestModelQuota drives a Quota from two pools (two instances) on one key
// with random sequences on the test clock, and checks every answer, and
// the key's Usage after every call, against a reference model written
// from docs/limits.md, "Billing periods" (quotaModel): Allow with and
// without ids and retries of earlier ids (refused or admitted, with
// another cost), AllowTx that commits or rolls back, Grant of credits
// (some expiring at or before now: refused), SetPlan AtOnce and
// AtNextPeriod (anchors mostly of the 28th to the 31st, zones with DST),
// RefundID and SettleID of admitted ids (some refunded or settled
// before, some of a key forgotten since), refused and unknown ids, with
// costs below, at and above the admission's, Forget of the key (its
// ids' retries then decide afresh),
// and moves of the clock by minutes, hours and days, to a period's end
// and a credit's expiry (exactly, or 1 µs before), across month ends, a
// leap February and DST changes in America/New_York and Europe/Paris.
//
// Calls are one after another, so the model predicts every field
// exactly. A failure names the seed, the sequence, its last steps and
// the command to rerun it (PGLIMIT_QUOTA_MODEL_SEED,
// PGLIMIT_QUOTA_MODEL_SEQUENCE). The quick tier (-short) runs 4
// sequences of 80 calls, the full tier 12 of 250.
func TestModelQuota(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envQuotaModelSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envQuotaModelSeed, s, err)
		}
	}
	t.Logf("seed %d (rerun with %s=%d)", seed, envQuotaModelSeed, seed)
	sequences, ops := 4, 80
	if !testing.Short() {
		sequences, ops = 12, 250
	}
	only := -1
	if s := os.Getenv(envQuotaModelSequence); s != "" {
		var err error
		if only, err = strconv.Atoi(s); err != nil || only < 0 || only >= sequences {
			t.Fatalf("%s=%q: want a sequence from 0 to %d", envQuotaModelSequence, s, sequences-1)
		}
	}
	for seq := range sequences {
		if only >= 0 && seq != only {
			continue
		}
		t.Run(fmt.Sprint("sequence-", seq), func(t *testing.T) {
			t.Parallel()
			s := &quotaSequence{
				t:     t,
				rng:   rand.New(rand.NewPCG(seed, uint64(seq))),
				name:  fmt.Sprintf("seed %d, sequence %d", seed, seq),
				rerun: fmt.Sprintf("%s=%d %s=%d go test -run 'TestModelQuota$' ./pglimit/pglimitquota", envQuotaModelSeed, seed, envQuotaModelSequence, seq),
			}
			s.run(ops)
		})
	}
}

// The zones a sequence uses: one without DST, and two whose changes fall
// on different days.
var modelZones = []string{"UTC", "America/New_York", "Europe/Paris"}

// Starts near month ends, a leap February and the DST changes of 2027
// (New York: 14 March, 7 November; Paris: 28 March, 31 October).
var modelStarts = []string{
	"2027-01-27 10:00", "2027-03-12 21:30", "2027-03-26 23:00", "2027-10-29 22:00",
	"2027-11-05 20:00", "2028-01-28 00:00", "2028-02-26 12:00", "2027-04-29 23:59",
}

// quotaPlan is a plan as the model keeps it: every field resolved.
type quotaPlan struct {
	month     time.Month // 1 for a Monthly quota
	day       int
	zone      string
	allowance int64
	hardCap   int64
}

// quotaCredit is a credit the model holds.
type quotaCredit struct {
	units   int64
	expires time.Time
}

// quotaTicket is an admitted id as the model keeps it: its first
// decision, the period it was charged in, the units it took from each
// credit (in take order), and whether it was refunded or settled.
type quotaTicket struct {
	d     pglimitquota.Decision
	start time.Time
	takes []quotaCredit
	done  bool
}

// quotaModel is the reference model of one key, from docs/limits.md,
// "Billing periods".
type quotaModel struct {
	cfg    pglimitquota.Config
	months int // 1 or 12

	exists   bool // decided, granted or planned
	plan     quotaPlan
	since    time.Time // the plan's anchor took effect; no period starts before
	next     *quotaPlan
	nextFrom time.Time

	// The counters of the period that starts at periodStart.
	periodStart time.Time
	a, c, o     int64
	credits     []quotaCredit // in grant order
	ids         map[string]*quotaTicket
	refusedIDs  []string
	admittedIDs []string
}

// due puts a next plan in force once its time has come.
func (m *quotaModel) due(now time.Time) {
	if m.next != nil && !now.Before(m.nextFrom) {
		m.plan, m.since, m.next = *m.next, m.nextFrom, nil
	}
}

// fresh is the plan of a key with no row: anchored now in the Config's
// zone, on the Config's plan.
func (m *quotaModel) fresh(now time.Time) quotaPlan {
	loc := mustZone(m.cfg.TimeZone)
	local := now.In(loc)
	p := quotaPlan{month: time.January, day: local.Day(), zone: m.cfg.TimeZone, allowance: m.cfg.Allowance, hardCap: m.cfg.HardCap}
	if m.months == 12 {
		p.month = local.Month()
	}
	if p.hardCap == 0 {
		p.hardCap = p.allowance
	}
	return p
}

// current is the plan in force and its anchor's start at now.
func (m *quotaModel) current(now time.Time) (quotaPlan, time.Time) {
	if !m.exists {
		return m.fresh(now), now
	}
	m.due(now)
	return m.plan, m.since
}

// bound is the instant the period of month index k (12 * year + month -
// 1) starts: local midnight of the anchor's day clamped to the month.
func bound(p quotaPlan, k int) time.Time {
	y, mo := k/12, time.Month(k%12+1)
	last := time.Date(y, mo+1, 0, 0, 0, 0, 0, time.UTC).Day()
	return time.Date(y, mo, min(p.day, last), 0, 0, 0, 0, mustZone(p.zone))
}

// period is [start, end) of the period that holds now.
func (m *quotaModel) period(now time.Time) (quotaPlan, time.Time, time.Time) {
	p, since := m.current(now)
	local := now.In(mustZone(p.zone))
	mi := local.Year()*12 + int(local.Month()) - 1
	k := mi - ((mi-(int(p.month)-1))%m.months+m.months)%m.months
	if bound(p, k).After(now) {
		k -= m.months
	}
	start := bound(p, k)
	if since.After(start) {
		start = since
	}
	return p, start, bound(p, k+m.months)
}

// counters are the period's charges at now.
func (m *quotaModel) counters(start time.Time) (a, c, o int64) {
	if m.exists && m.periodStart.Equal(start) {
		return m.a, m.c, m.o
	}
	return 0, 0, 0
}

// live are the credits usable at now, earliest expiry first (ties in
// grant order), and their units.
func (m *quotaModel) live(now time.Time) ([]int, int64) {
	var idx []int
	var sum int64
	for i, c := range m.credits {
		if c.units > 0 && now.Before(c.expires) {
			idx = append(idx, i)
			sum += c.units
		}
	}
	slices.SortStableFunc(idx, func(x, y int) int { return m.credits[x].expires.Compare(m.credits[y].expires) })
	return idx, sum
}

// usage is what Usage answers at now.
func (m *quotaModel) usage(now time.Time) pglimitquota.Usage {
	p, start, end := m.period(now)
	a, c, o := m.counters(start)
	_, left := m.live(now)
	return pglimitquota.Usage{Used: a + c + o, FromAllowance: a, FromCredits: c, Overage: o,
		Allowance: p.allowance, HardCap: p.hardCap, CreditsLeft: left, PeriodStart: start, PeriodEnd: end, Now: now}
}

// allow is the decision of cost units with id ("" for none) at now;
// commit applies it (false: a transaction that rolled back).
func (m *quotaModel) allow(now time.Time, id string, cost int64, commit bool) pglimitquota.Decision {
	if r, ok := m.ids[id]; ok && id != "" {
		d := r.d
		d.Replayed = true
		return d
	}
	p, start, _ := m.period(now)
	a, c, o := m.counters(start)
	idx, left := m.live(now)
	ta := min(cost, max(p.allowance-a, 0))
	tc := min(cost-ta, left)
	to := cost - ta - tc
	d := pglimitquota.Decision{Cost: cost}
	if to > 0 && a+ta+o+to > p.hardCap {
		d.Usage = m.usage(now)
		if id != "" {
			m.refusedIDs = append(m.refusedIDs, id)
		}
		return d
	}
	d.Allowed, d.FromAllowance, d.FromCredits, d.Overage = true, ta, tc, to
	u := m.usage(now)
	u.FromAllowance, u.FromCredits, u.Overage = a+ta, c+tc, o+to
	u.Used, u.CreditsLeft = u.FromAllowance+u.FromCredits+u.Overage, left-tc
	d.Usage = u
	if !commit {
		return d
	}
	if !m.exists {
		m.exists, m.plan, m.since = true, p, now
	}
	m.periodStart, m.a, m.c, m.o = start, u.FromAllowance, u.FromCredits, u.Overage
	takes := m.spend(idx, tc)
	if id != "" {
		m.ids[id] = &quotaTicket{d: d, start: start, takes: takes}
		m.admittedIDs = append(m.admittedIDs, id)
	}
	return d
}

// spend takes units from the live credits idx, in order, and returns
// what it took from each.
func (m *quotaModel) spend(idx []int, units int64) []quotaCredit {
	var takes []quotaCredit
	for _, i := range idx {
		take := min(units, m.credits[i].units)
		if take > 0 {
			m.credits[i].units -= take
			takes = append(takes, quotaCredit{take, m.credits[i].expires})
		}
		units -= take
	}
	return takes
}

// forget is Forget: the key is as one never decided, granted or
// planned, and its ids are gone (a retry of one decides afresh; a
// refund or settle of one is "not admitted").
func (m *quotaModel) forget() {
	m.exists, m.next, m.periodStart = false, nil, time.Time{}
	m.a, m.c, m.o = 0, 0, 0
	m.credits = nil
	clear(m.ids)
}

// ticket is the admitted id's ticket, or the error class of a refund or
// settle of it: "not admitted" or "settled".
func (m *quotaModel) ticket(id string) (*quotaTicket, string) {
	r, ok := m.ids[id]
	switch {
	case !ok:
		return nil, "not admitted"
	case r.done:
		return nil, "settled"
	}
	return r, ""
}

// refund is RefundID's answer at now (n checked), or its error class.
func (m *quotaModel) refund(now time.Time, id string, n int64) (pglimitquota.Refund, string) {
	r, class := m.ticket(id)
	switch {
	case class != "":
		return pglimitquota.Refund{}, class
	case n > r.d.Cost:
		return pglimitquota.Refund{}, "cost"
	}
	return m.giveBack(now, r, n), ""
}

// giveBack gives back n units of r's admission at now, as docs/limits.md,
// "Billing periods", says: off the overage, then to the credits taken
// from (the last first), then to the allowance; the allowance and
// overage part only while the admission's period is the current one, a
// credit's only while it lives, to the first live credit of its expiry,
// else to a new one while the key holds fewer than MaxCredits.
func (m *quotaModel) giveBack(now time.Time, r *quotaTicket, n int64) pglimitquota.Refund {
	r.done = true
	out := pglimitquota.Refund{Units: n}
	bo := min(n, r.d.Overage)
	bc := min(n-bo, r.d.FromCredits)
	ba := n - bo - bc
	_, start, _ := m.period(now)
	cur := m.exists && m.periodStart.Equal(start) && start.Equal(r.start)
	back := map[time.Time]int64{}
	var order []time.Time
	for i := len(r.takes) - 1; i >= 0 && bc > 0; i-- {
		u := min(bc, r.takes[i].units)
		bc -= u
		e := r.takes[i].expires.UTC()
		if !now.Before(e) {
			continue
		}
		if _, ok := back[e]; !ok {
			order = append(order, e)
		}
		back[e] += u
	}
	slices.SortFunc(order, time.Time.Compare)
	idx, _ := m.live(now)
	fresh := 0
	for _, e := range order {
		placed := false
		for _, i := range idx {
			if m.credits[i].expires.Equal(e) {
				m.credits[i].units += back[e]
				placed = true
				break
			}
		}
		if !placed {
			fresh++
			if len(idx)+fresh > pglimitquota.MaxCredits {
				continue
			}
			m.credits = append(m.credits, quotaCredit{back[e], e})
		}
		out.FromCredits += back[e]
	}
	if cur {
		out.FromAllowance, out.Overage = min(ba, m.a), min(bo, m.o)
		m.a, m.c, m.o = m.a-out.FromAllowance, max(m.c-out.FromCredits, 0), m.o-out.Overage
	}
	out.Kept = n - out.FromAllowance - out.FromCredits - out.Overage
	out.Usage = m.usage(now)
	return out
}

// settle is SettleID's answer at now (cost checked), or its error class.
func (m *quotaModel) settle(now time.Time, id string, cost int64) (pglimitquota.Settlement, string) {
	r, class := m.ticket(id)
	if class != "" {
		return pglimitquota.Settlement{}, class
	}
	out := pglimitquota.Settlement{Estimate: r.d.Cost, Cost: cost}
	if cost <= r.d.Cost {
		out.Returned = m.giveBack(now, r, r.d.Cost-cost)
		out.Usage = out.Returned.Usage
		return out, ""
	}
	r.done = true
	excess := cost - r.d.Cost
	p, start, _ := m.period(now)
	a, c, o := m.counters(start)
	idx, left := m.live(now)
	ta := min(excess, max(p.allowance-a, 0))
	tc := min(excess-ta, left)
	to := min(excess-ta-tc, max(p.hardCap-a-ta-o, 0))
	out.FromAllowance, out.FromCredits, out.Overage, out.Forgiven = ta, tc, to, excess-ta-tc-to
	m.periodStart, m.a, m.c, m.o = start, a+ta, c+tc, o+to
	m.spend(idx, tc)
	out.Usage = m.usage(now)
	return out, ""
}

// grant is Grant's error class at now: "" (granted), "cost" or "config".
func (m *quotaModel) grant(now time.Time, units int64, expires time.Time) string {
	idx, _ := m.live(now)
	switch {
	case !expires.After(now):
		return "cost"
	case len(idx) >= pglimitquota.MaxCredits:
		return "config"
	}
	if !m.exists {
		m.exists, m.plan, m.since = true, m.fresh(now), now
	}
	m.credits = append(m.credits, quotaCredit{units, expires})
	return ""
}

// setPlan is SetPlan's answer at now: when the plan takes effect.
func (m *quotaModel) setPlan(now time.Time, p quotaPlan, later bool) time.Time {
	if !m.exists {
		m.exists, m.plan, m.since = true, p, now
		return now
	}
	cur, _, end := m.period(now)
	if later {
		m.next, m.nextFrom = &p, end
		return end
	}
	// The same anchor and zone keep the period and its counters; any
	// other starts a period now with nothing used.
	if cur.month != p.month || cur.day != p.day || cur.zone != p.zone {
		m.since = now
		m.periodStart, m.a, m.c, m.o = time.Time{}, 0, 0, 0
	}
	m.plan, m.next = p, nil
	return now
}

func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return loc
}

// quotaSequence is one random sequence of calls on one key.
type quotaSequence struct {
	t       *testing.T
	rng     *rand.Rand
	name    string
	rerun   string
	history []string

	clock  *pglimittest.Clock
	now    time.Time
	pools  [2]*pgxpool.Pool
	quotas [2]*pglimitquota.Quota
	m      *quotaModel
	nextID int
	stats  map[string]int // what the sequence reached, logged at its end
}

func (s *quotaSequence) run(ops int) {
	t := s.t
	cfg := pglimitquota.Config{
		Namespace: "m",
		TimeZone:  modelZones[s.rng.IntN(len(modelZones))],
		Allowance: s.rng.Int64N(25),
	}
	months := 1
	if s.rng.IntN(5) == 0 {
		cfg.Period, months = pglimitquota.Yearly, 12
	}
	if s.rng.IntN(3) > 0 {
		cfg.HardCap = cfg.Allowance + s.rng.Int64N(15)
	}
	start, err := time.ParseInLocation("2006-01-02 15:04", modelStarts[s.rng.IntN(len(modelStarts))], mustZone(cfg.TimeZone))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, cfg, start)
	s.clock, s.now, s.pools[0], s.quotas[0] = b.clock, start, b.pool, b.q
	s.pools[1] = b.clock.Pool(t)
	cfg.Schema = b.schema
	if s.quotas[1], err = pglimitquota.New(s.pools[1], &cfg); err != nil {
		t.Fatal(err)
	}
	s.m = &quotaModel{cfg: cfg, months: months, ids: map[string]*quotaTicket{}}
	s.logf("config: %s, zone %s, allowance %d, hard cap %d, start %s", map[int]string{1: "monthly", 12: "yearly"}[months], cfg.TimeZone, cfg.Allowance, cfg.HardCap, start)
	s.stats = map[string]int{}
	for range ops {
		s.step()
		if t.Failed() {
			return
		}
	}
	t.Logf("%s: %v", s.name, s.stats)
}

func (s *quotaSequence) logf(format string, args ...any) {
	s.history = append(s.history, fmt.Sprintf(format, args...))
}

// fail ends the sequence with its last steps and how to rerun it.
func (s *quotaSequence) fail(format string, args ...any) {
	s.t.Helper()
	h := s.history[max(0, len(s.history)-25):]
	s.t.Fatalf("%s: %s\nlast steps:\n  %s\nrerun: %s", s.name, fmt.Sprintf(format, args...), strings.Join(h, "\n  "), s.rerun)
}

// cost is a random cost, mostly small.
func (s *quotaSequence) cost() int64 {
	if s.rng.IntN(8) == 0 {
		return 5 + s.rng.Int64N(20)
	}
	return 1 + s.rng.Int64N(5)
}

func (s *quotaSequence) step() {
	ctx := context.Background()
	i := s.rng.IntN(2)
	q := s.quotas[i]
	switch r := s.rng.IntN(100); {
	case r < 22: // Allow without an id
		s.checkAllow(ctx, q, i, "", s.cost(), 0)
	case r < 34: // Allow with a new id
		s.nextID++
		s.checkAllow(ctx, q, i, fmt.Sprint("id-", s.nextID), s.cost(), 0)
	case r < 42: // a retry of an earlier id, maybe with another cost
		ids := s.m.admittedIDs
		if len(s.m.refusedIDs) > 0 && (len(ids) == 0 || s.rng.IntN(3) == 0) {
			ids = s.m.refusedIDs
		}
		if len(ids) == 0 {
			return
		}
		s.checkAllow(ctx, q, i, ids[s.rng.IntN(len(ids))], s.cost(), 0)
	case r < 50: // AllowTx that commits (1) or rolls back (2)
		id := ""
		if s.rng.IntN(2) == 0 {
			s.nextID++
			id = fmt.Sprint("id-", s.nextID)
		}
		s.checkAllow(ctx, q, i, id, s.cost(), 1+s.rng.IntN(2))
	case r < 58:
		s.grant(ctx, q, i)
	case r < 65:
		s.setPlan(ctx, q, i)
	case r < 73:
		s.settleOrRefund(ctx, q, i)
	case r < 75:
		s.logf("Usage on %d", i)
	case r < 78:
		s.logf("Forget on %d", i)
		if err := q.Forget(ctx, "k"); err != nil {
			s.fail("Forget on %d: %v", i, err)
		}
		s.m.forget()
		s.stats["forget"]++
	default:
		s.move()
	}
	s.checkUsage(ctx, s.quotas[1-i], 1-i)
}

// checkAllow calls Allow (tx 0) or AllowTx that commits (1) or rolls
// back (2), and compares its decision with the model's.
func (s *quotaSequence) checkAllow(ctx context.Context, q *pglimitquota.Quota, i int, id string, cost int64, tx int) {
	s.t.Helper()
	what := fmt.Sprintf("Allow(%d, id %q) on %d", cost, id, i)
	if tx > 0 {
		what = fmt.Sprintf("AllowTx(%d, id %q) on %d, then %s", cost, id, i, map[int]string{1: "commit", 2: "rollback"}[tx])
	}
	s.logf("%s", what)
	if id != "" {
		ctx = pglimit.WithID(ctx, id)
	}
	var got pglimitquota.Decision
	var err error
	if tx == 0 {
		got, err = q.Allow(ctx, "k", cost)
	} else {
		t, berr := s.pools[i].Begin(ctx)
		if berr != nil {
			s.fail("%s: begin: %v", what, berr)
		}
		got, err = q.AllowTx(ctx, t, "k", cost)
		if tx == 1 {
			if cerr := t.Commit(ctx); cerr != nil {
				s.fail("%s: commit: %v", what, cerr)
			}
		} else if rerr := t.Rollback(ctx); rerr != nil {
			s.fail("%s: rollback: %v", what, rerr)
		}
	}
	if err != nil {
		s.fail("%s: %v", what, err)
	}
	want := s.m.allow(s.now, id, cost, tx != 2)
	if norm(got) != norm(want) {
		s.fail("%s:\n got  %+v\n want %+v", what, norm(got), norm(want))
	}
	switch {
	case got.Replayed:
		s.stats["replayed"]++
	case !got.Allowed:
		s.stats["refused"]++
	case got.Overage > 0:
		s.stats["overage"]++
	case got.FromCredits > 0:
		s.stats["credits"]++
	default:
		s.stats["allowance"]++
	}
	s.logf("  -> allowed %v, replayed %v, split %d/%d/%d, used %d", got.Allowed, got.Replayed, got.FromAllowance, got.FromCredits, got.Overage, got.Usage.Used)
}

// settleOrRefund refunds or settles an id by its id: mostly an admitted
// one (refunded or settled before, or not), sometimes a refused or
// unknown one, some units or a cost below, at or above the admission's,
// sometimes more units than it took.
func (s *quotaSequence) settleOrRefund(ctx context.Context, q *pglimitquota.Quota, i int) {
	var id string
	switch r := s.rng.IntN(10); {
	case r < 8 && len(s.m.admittedIDs) > 0:
		id = s.m.admittedIDs[s.rng.IntN(len(s.m.admittedIDs))]
	case r < 9 && len(s.m.refusedIDs) > 0:
		id = s.m.refusedIDs[s.rng.IntN(len(s.m.refusedIDs))]
	default:
		id = "unknown"
	}
	var cost int64 = 1
	if t, ok := s.m.ids[id]; ok {
		cost = t.d.Cost
	}
	errs := map[string]error{"not admitted": pglimit.ErrNotAdmitted, "settled": pglimit.ErrAlreadySettled, "cost": pglimit.ErrInvalidCost}
	check := func(op, what string, err error, class string) {
		s.stats[op+" "+cmp.Or(class, "ok")]++
		if class == "" && err != nil || class != "" && !errors.Is(err, errs[class]) {
			s.fail("%s: %v, want %q", what, err, class)
		}
	}
	if s.rng.IntN(2) == 0 {
		n := 1 + s.rng.Int64N(cost+1) // sometimes one more than it took
		what := fmt.Sprintf("RefundID(%q, %d) on %d", id, n, i)
		s.logf("%s", what)
		got, err := q.RefundID(ctx, id, n)
		want, class := s.m.refund(s.now, id, n)
		check("refund", what, err, class)
		if got.Kept > 0 {
			s.stats["refund kept"]++
		}
		if got.FromCredits > 0 {
			s.stats["refund to credits"]++
		}
		if class == "" && normRefund(got) != normRefund(want) {
			s.fail("%s:\n got  %+v\n want %+v", what, normRefund(got), normRefund(want))
		}
		s.logf("  -> back %d/%d/%d, kept %d", got.FromAllowance, got.FromCredits, got.Overage, got.Kept)
		return
	}
	settled := max(cost+s.rng.Int64N(11)-5, 0)
	what := fmt.Sprintf("SettleID(%q, %d) on %d", id, settled, i)
	s.logf("%s", what)
	got, err := q.SettleID(ctx, id, settled)
	want, class := s.m.settle(s.now, id, settled)
	check("settle", what, err, class)
	if got.Forgiven > 0 {
		s.stats["settle forgiven"]++
	}
	if got.Cost > got.Estimate {
		s.stats["settle charged"]++
	}
	got.Returned, want.Returned = normRefund(got.Returned), normRefund(want.Returned)
	got.Usage, want.Usage = normUsage(got.Usage), normUsage(want.Usage)
	if class == "" && got != want {
		s.fail("%s:\n got  %+v\n want %+v", what, got, want)
	}
	s.logf("  -> returned %+v, charged %d/%d/%d, forgiven %d", got.Returned, got.FromAllowance, got.FromCredits, got.Overage, got.Forgiven)
}

// grant grants a credit expiring from 1 µs before now to 40 days after.
func (s *quotaSequence) grant(ctx context.Context, q *pglimitquota.Quota, i int) {
	units := 1 + s.rng.Int64N(12)
	var expires time.Time
	switch s.rng.IntN(10) {
	case 0:
		expires = s.now
	case 1:
		expires = s.now.Add(-time.Microsecond)
	case 2, 3:
		expires = s.now.Add(time.Duration(1+s.rng.IntN(600)) * time.Minute)
	default:
		expires = s.now.Add(time.Duration(1+s.rng.IntN(40*24*60)) * time.Minute)
	}
	what := fmt.Sprintf("Grant(%d, expires %s) on %d", units, expires.UTC().Format(time.RFC3339Nano), i)
	s.logf("%s", what)
	err := q.Grant(ctx, "k", units, expires)
	want := s.m.grant(s.now, units, expires)
	switch {
	case want == "" && err != nil,
		want == "cost" && !errors.Is(err, pglimit.ErrInvalidCost),
		want == "config" && !errors.Is(err, pglimit.ErrInvalidConfig):
		s.fail("%s: %v, want %q", what, err, want)
	}
	s.stats["grant "+cmp.Or(want, "ok")]++
}

// setPlan sets a random plan, anchors mostly of the 28th to the 31st.
func (s *quotaSequence) setPlan(ctx context.Context, q *pglimitquota.Quota, i int) {
	days := []int{28, 29, 30, 31, 28, 29, 30, 31, 1, 15}
	p := pglimitquota.Plan{
		Anchor:    pglimitquota.Anchor{Month: time.Month(1 + s.rng.IntN(12)), Day: days[s.rng.IntN(len(days))]},
		Allowance: s.rng.Int64N(25),
	}
	if s.rng.IntN(4) > 0 {
		p.TimeZone = modelZones[s.rng.IntN(len(modelZones))]
	}
	if s.rng.IntN(3) > 0 {
		p.HardCap = p.Allowance + s.rng.Int64N(15)
	}
	when := pglimitquota.When(s.rng.IntN(2))
	what := fmt.Sprintf("SetPlan(%+v, %v) on %d", p, map[pglimitquota.When]string{pglimitquota.AtOnce: "AtOnce", pglimitquota.AtNextPeriod: "AtNextPeriod"}[when], i)
	s.logf("%s", what)
	got, err := q.SetPlan(ctx, "k", p, when)
	if err != nil {
		s.fail("%s: %v", what, err)
	}
	mp := quotaPlan{month: p.Anchor.Month, day: p.Anchor.Day, zone: p.TimeZone, allowance: p.Allowance, hardCap: p.HardCap}
	if s.m.months == 1 {
		mp.month = time.January
	}
	if mp.zone == "" {
		mp.zone = s.m.cfg.TimeZone
	}
	if mp.hardCap == 0 {
		mp.hardCap = mp.allowance
	}
	want := s.m.setPlan(s.now, mp, when == pglimitquota.AtNextPeriod)
	s.stats[map[bool]string{false: "plan at once", true: "plan at next"}[when == pglimitquota.AtNextPeriod]]++
	if !got.Equal(want) {
		s.fail("%s: takes effect at %s, want %s", what, got.UTC(), want.UTC())
	}
}

// move moves the clock: by minutes, hours or days, or to the period's
// end or a credit's expiry, exactly or 1 µs before.
func (s *quotaSequence) move() {
	var d time.Duration
	switch r := s.rng.IntN(10); {
	case r < 2:
		d = time.Duration(1+s.rng.IntN(59)) * time.Minute
	case r < 4:
		d = time.Duration(1+s.rng.IntN(23)) * time.Hour
	case r < 6:
		d = time.Duration(1+s.rng.IntN(9)) * 24 * time.Hour
	case r < 7:
		d = time.Duration(27+s.rng.IntN(6)) * 24 * time.Hour
		if s.m.months == 12 {
			d *= time.Duration(1 + s.rng.IntN(6))
		}
	case r < 9:
		_, _, end := s.m.period(s.now)
		d = end.Sub(s.now) - time.Duration(s.rng.IntN(2))*time.Microsecond
	default:
		idx, _ := s.m.live(s.now)
		if len(idx) == 0 {
			return
		}
		d = s.m.credits[idx[0]].expires.Sub(s.now) - time.Duration(s.rng.IntN(2))*time.Microsecond
	}
	if d <= 0 {
		return
	}
	_, before, _ := s.m.period(s.now)
	s.now = s.now.Add(d)
	s.clock.Set(s.now)
	if _, after, _ := s.m.period(s.now); !after.Equal(before) {
		s.stats["new period"]++
	}
	s.logf("clock to %s (+%s)", s.now.UTC().Format(time.RFC3339Nano), d)
}

// checkUsage compares q's Usage with the model's.
func (s *quotaSequence) checkUsage(ctx context.Context, q *pglimitquota.Quota, i int) {
	got, err := q.Usage(ctx, "k")
	if err != nil {
		s.fail("Usage on %d: %v", i, err)
	}
	if want := s.m.usage(s.now); normUsage(got) != normUsage(want) {
		s.fail("Usage on %d:\n got  %+v\n want %+v", i, normUsage(got), normUsage(want))
	}
}

// norm and normUsage put times in UTC, so that == compares instants.
func norm(d pglimitquota.Decision) pglimitquota.Decision {
	d.Usage = normUsage(d.Usage)
	return d
}

func normRefund(r pglimitquota.Refund) pglimitquota.Refund {
	r.Usage = normUsage(r.Usage)
	return r
}

func normUsage(u pglimitquota.Usage) pglimitquota.Usage {
	u.PeriodStart, u.PeriodEnd, u.Now = u.PeriodStart.UTC(), u.PeriodEnd.UTC(), u.Now.UTC()
	return u
}
