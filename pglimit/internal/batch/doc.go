// Package batch is group commit for a limiter's Allow and AllowN: the
// concurrent calls of one limiter in one process share statements, so that
// many decisions cost one round trip, one transaction and one WAL flush.
// A [Group] serves any limits on Upsert and NoWait: a single GCRA limit (a
// cooldown among them) with batch.allow, which also leases; any other set
// with batch.general (internal/queries).
//
// The package knows no Decision: a Group is generic over its answer, D.
// It takes plain values ([Config]: the SQL, the namespace, the lock class,
// T and Burst*T, the timeout) and a [Decider], which runs a call's own
// statement and builds a D from the numbers a statement returned
// ([Answer], [Row]).
//
// # Gathering
//
// While fewer of the limiter's statements run than its in-flight level, a
// call runs its own single-key statement at once, on its own goroutine: a
// lone caller pays a mutex and nothing else, and never waits for a window.
// Calls that arrive while the level is reached gather in one open batch,
// which is sent as soon as one of the running statements returns (or at
// once when it holds [MaxKeys] keys).
//
// # The level
//
// How many statements may run at once is measured, not set: where the
// server has cores to spare, statements of one key each decide the most
// (no call gathers once the level reaches the callers); where it has few,
// one statement for many keys spares it a statement's fixed cost each.
// The level starts at 2 and moves by a hill climb on what the Group sees.
//
//   - An epoch is at least 64 statements and 8 rounds of the level's
//     statements, counted once the statements sent under the previous
//     level have returned. It measures the power at the level: the
//     decisions a second of the statements that ended in it, over their
//     calls' mean time from arrival to answer (Kleinrock's power: with a
//     fixed number of callers it grows with throughput, with a fixed rate
//     of arrivals it falls with latency). Calls served by a lease, or
//     refused by what another call's statement found, do not count.
//   - After an epoch at the level, the next epoch probes one step away. A
//     probe is kept when its power beats the level's by more than twice
//     the noise (how far apart two epochs at one level are, relative, as
//     a moving average; at least 2%) in two epochs in a row, and the
//     search goes on the same way; otherwise the level goes back, is measured again (a sample of
//     the noise), and the next probe goes the other way. The first probe
//     waits for two epochs at the start. Steps are factors of 2, then of
//     2^(1/2), then of 2^(1/4), each at least one statement, once neither
//     way pays at a step. At the finest step the probes rest between
//     tries, twice as long after each pair that finds nothing, up to 16
//     epochs: once settled, at most one epoch in 17 runs at a probe level.
//   - A level's power moving between two of its epochs by more than four
//     times the noise, and by 25% at least, means the load changed: the
//     search starts again from steps of 2.
//   - A level that no call found reached, where none gathered, is not
//     probed upwards: a higher one would change nothing.
//
// Bounds: the level is at least 1, and at most the pool's size less the
// connections others hold (Config.Pool, read at the end of every epoch),
// or [MaxKeys] where the pool's bound is not known. No caller starves: every statement that returns sends what
// gathered while fewer than the level run, and the level is never 0. A
// lower level takes effect as statements return; none is cancelled. An
// open batch waits for a running statement at most four of the Group's
// mean round trips (a tenth of Config.Timeout before any has returned),
// then goes past the level: a statement held up by a row that a long
// transaction locks holds back no other key, even at a level of 1. The
// level keeps no state per key: a few words per Group.
//
// Its tests need no server: a simulated database of 1 to 64 lanes, each
// statement paying a fixed cost, a cost per key and a WAL flush that
// covers every commit ready when it starts, driven by closed-loop callers
// (level_test.go).
//
// Calls on one key merge into one entry: the entry asks for up to the sum of
// its calls' units, and the units go to the calls in arrival order, each all
// or nothing, exactly as their own statements would have decided one after
// the other at that clock reading. Calls on a key whose entry is already on
// its way (or has another cost) wait for its answer: they are refused at
// once if that answer leaves them no room, and try again otherwise.
//
// A Group has no goroutine of its own: a batch runs on a goroutine that
// ends with its statement, so there is nothing to close, and a batch whose
// callers have all returned still ends within Config.Timeout. A lease's
// give-back runs on its timer's goroutine, bounded by Config.Timeout too.
//
// # Leases
//
// Leases let a busy key of a high-rate limit be admitted without a round
// trip per call. The Group's statement for the key takes, beside its
// callers' units, up to a lease's worth more, exactly as AllowN would: the
// key's TAT moves past them. This process then hands those units out
// locally, each only while the database clock is inside the range its
// slot allows, so that every admission, leased or not, is one the
// database could have made at that instant.
//
// # The rule
//
// Every admitted unit i holds a slot of the key's schedule: the
// TAT just after it, tat_i. Slots are disjoint (each is T wide, as the
// row's TAT only moves forward past them), and a unit admitted at instant
// a_i satisfies tat_i - Burst*T <= a_i <= tat_i - T. Then any window of
// width w, [s, s+w], sees at most Burst + w/T admissions: each of its
// admissions has tat_i in [s+T, s+w+Burst*T], and there are at most
// (w + Burst*T - T)/T + 1 disjoint T-wide slots there. The database's own
// admissions satisfy both bounds (tat_i = max(TAT, now) + T). A lease of k
// units from tat = start satisfies the lower bound for all of them when
// start + k*T <= now + Burst*T at the statement's clock reading, which the
// statement ensures; the upper bound, start + j*T for unit j, is the
// deadline by which unit j must be handed out.
//
// The database clock is read once per statement, at t0, between the local
// instants s (sent) and r (answered). A unit handed out at local time L
// was handed out at database time no later than t0 + (L - s), so unit j is
// handed out only while L <= s + (start + j*T - t0): a round trip of each
// unit's range is lost rather than risk a unit late. The lower bound needs
// nothing: L >= r, so the database time is past t0.
//
// Unit j's deadline is start + j*T, so a lease's unused units expire at
// the limit's own rate, one every T, from start on. A lease is therefore
// dated ahead of the statement's clock reading (start >= t0 + ahead, ahead
// a quarter of Burst*T, or twice the recent round trip if that is longer,
// at most half): the key's schedule then runs ahead of real time, and the
// units of each lease stay usable for a while whatever the process's pace.
// The slots skipped to date a lease ahead were unused; on a key that keeps
// busy the schedule stays ahead, and each lease starts where the last one
// ended, skipping nothing.
//
// A lease reaches past where a call could be admitted now, by a quarter of
// Burst*T (at most 10 ms): its later units become usable later, at their
// slot's lower bound, mapped onto the local clock as late as it can be.
// While the lease's next units are not usable yet, or the key's row had no
// room by what its last statement read, a call is refused here, without a
// round trip, as the database would refuse it: the row's TAT only grows,
// but for a Reset, which drops the lease. This is what lets a key whose
// limit binds answer every call at once.
//
// The lease's size follows this process's demand for the key: none at
// first, so that a key called by one caller at a time decides exactly as
// without leases; then as many units as the demand since the last lease
// (units used, calls that met a statement or were refused here) would use
// in a horizon of four round trips (between a sixteenth and a quarter of
// Burst*T), doubled while calls meet statements and no unit expires, at
// most a quarter of the burst, so that the dating ahead and two instances'
// leases fit in it. While the Group's statements take longer than half
// of Burst*T on average, a lease would expire on its way, and none is
// taken. The next lease is asked for, together with whatever else
// gathers, when the lease falls to half its size, so that a busy key's
// callers do not wait for the database.
//
// A lease no call has come to for half of Burst*T gives the units of its
// last run back, if the key's row is still as the statement that leased
// them left it (its TAT, and the transaction that wrote it): the row's TAT
// moves back over them, so that another instance may admit them. Each
// slot is still handed out at most once: the units leave the lease before
// the statement is sent, and come back only if it changed nothing. A
// shorter pause keeps them: they serve this process when its calls
// resume, where a lease dated ahead would skip most of them.
//
// A Reset forgets the key's lease in this process at once, and in the
// others through the Invalidator (pglimit's Config.Invalidator), which calls [Group.Forget] and [Group.Clear]. Without one, a
// lease taken before another instance's Reset keeps handing out its units
// after it, until their deadlines: at most the lease's units, within
// Burst*T of the Reset; and the refusals of a full key go on until the
// TAT its last statement read, at most Burst*T plus the reach.
package batch
