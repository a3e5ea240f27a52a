// Package pace sizes one partition's transactions while they lose races for
// rows to other transactions (deadlocks, serialization failures, lock
// timeouts), and says when they should wait their turn behind the
// consumer's other transactions instead of racing them.
//
// A batch transaction holds the row locks of everything its messages
// touched until it commits. When many partitions' batches touch the same
// few rows (a ledger's hot accounts), each takes those locks in its own
// message order, and they deadlock: Postgres breaks each deadlock only after
// deadlock_timeout (one second by default), and the whole batch rolls back.
// Retrying the same batch the same way fails the same way. Pace answers in
// two ways, both per partition:
//
//   - The batch shrinks: each contention halves the number of messages the
//     next transaction covers, and every commit adds a sixteenth of the
//     maximum back (additive increase, multiplicative decrease), so a
//     partition that stops losing races is back at full size after sixteen
//     commits.
//   - The consumer's transactions are serialized for a while: they take the
//     consumer's gate (a transaction-scoped advisory lock) before anything
//     else, so they commit one after another, in every process of the
//     consumer, and cannot deadlock each other. Serialized, a transaction
//     may cover many messages again: the time it holds the gate is kept to
//     about TargetSerialized, so that a partition waiting its turn behind
//     the others never waits long. After Hold the transactions race again;
//     if they lose again, they go back for twice as long (up to MaxHold).
//
// Pace reads no clock: the caller passes the time, which keeps it
// deterministic under test. A Pace belongs to one partition's worker; the
// Gate is shared by all of them.
package pace

import (
	"sync"
	"time"
)

// Tuning. The figures behind them are in BENCHMARKS.md ("Hot rows").
const (
	// TargetSerialized bounds the duration of a serialized transaction,
	// and with it the wait of the partitions queued behind it at the gate.
	TargetSerialized = 50 * time.Millisecond
	// Hold is how long a partition stays serialized after its first
	// contention; each return doubles it, up to MaxHold.
	Hold    = 15 * time.Second
	MaxHold = 4 * time.Minute
	// Forgive means a consumer that met no contention for this long starts
	// over at Hold.
	Forgive = 10 * time.Minute
	// RaceLockTimeout is the lock_timeout of a transaction over several
	// messages that races the others: a lock it waits for longer than this
	// is contention. Postgres finds a deadlock only when a waiter has
	// waited deadlock_timeout (a second by default), and breaks one cycle
	// at a time: with many partitions on a few hot rows, their first
	// batches, all racing, form many cycles, and without this they would
	// be broken one second after another.
	RaceLockTimeout = 200 * time.Millisecond
	// GateWait bounds a wait at the gate. Turns are kept near
	// TargetSerialized, so a dozen partitions queued pass well within it;
	// a longer wait means the holder is stuck (a hung handler, a row
	// locked outside the consumer), and the waiter races instead.
	GateWait = time.Second
	// GateBypass is how long a partition whose wait at the gate ran out
	// races instead: a stuck holder usually stays stuck for a lock or
	// handler timeout, and each new wait would cost GateWait again.
	GateBypass = 5 * time.Second
)

// Gate is the consumer's side of the gate: when its transactions take it.
// It is one per consumer, not per partition: the partitions of a consumer
// on hot rows all race each other, and each partition learning it alone
// would cost each its own deadlock. It is safe for concurrent use.
type Gate struct {
	mu sync.Mutex
	// until means transactions take the gate until then.
	until time.Time
	// hold is how long the next serialization lasts.
	hold time.Duration
	// last is when a transaction last lost a race (zero: never).
	last time.Time
}

// NewGate returns a gate that no transaction takes yet.
func NewGate() *Gate { return &Gate{hold: Hold} }

// Serialized reports whether a transaction starting at now takes the gate.
func (g *Gate) Serialized(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return now.Before(g.until)
}

// Until is when the current serialization ends (zero, or in the past, when
// there is none).
func (g *Gate) Until() time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.until
}

// contended records that a transaction, started serialized or not, lost a
// race at now, and reports whether transactions now start taking the gate.
func (g *Gate) contended(serialized bool, now time.Time) (entered bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.last.IsZero() && now.Sub(g.last) > Forgive {
		g.hold = Hold
	}
	g.last = now
	if serialized || now.Before(g.until) {
		// Lost to a transaction outside the gate (another consumer, an
		// API), or to one that started before the gate closed: the gate
		// cannot help with the first, and is closed for the second.
		return false
	}
	g.until = now.Add(g.hold)
	g.hold = min(2*g.hold, MaxHold)
	return true
}

// Pace is one partition's state. The zero value is not usable: see New.
type Pace struct {
	gate  *Gate
	max   int
	limit int
	// perMessage is a running estimate of a message's share of a
	// committed transaction's time (0: none yet), which sizes a
	// serialized transaction before it holds the gate.
	perMessage time.Duration
	// lastContention is when the partition last lost a race (zero: never).
	lastContention time.Time
	// retries counts contentions since New.
	retries int64
}

// New returns the state of a partition whose batches hold up to most
// messages, and whose transactions take gate when it says so.
func New(most int, gate *Gate) *Pace {
	most = max(most, 1)
	return &Pace{gate: gate, max: most, limit: most}
}

// Limit is how many messages the next transaction may cover, serialized or
// not. A serialized transaction is also held to what TargetSerialized
// allows at the partition's recent time per message (a sixteenth of the
// maximum when there is no estimate yet), so that even its first turn at
// the gate is short.
func (p *Pace) Limit(serialized bool) int {
	if !serialized {
		return p.limit
	}
	if p.perMessage == 0 {
		return min(p.limit, max(1, p.max/16))
	}
	return min(p.limit, max(1, int(TargetSerialized/p.perMessage)))
}

// Retries counts the transactions that lost a race, since New.
func (p *Pace) Retries() int64 { return p.retries }

// LastContention is when the partition last lost a race (zero: never).
func (p *Pace) LastContention() time.Time { return p.lastContention }

// Contended records that a transaction over n messages, started serialized
// or not, lost a race at now. It reports whether the consumer's
// transactions now start taking the gate.
func (p *Pace) Contended(n int, serialized bool, now time.Time) (entered bool) {
	p.retries++
	p.lastContention = now
	p.limit = max(1, min(p.limit, n/2))
	return p.gate.contended(serialized, now)
}

// Committed records that a transaction over n messages committed after
// took; held is how long it held the gate (0 when it did not take it).
func (p *Pace) Committed(n int, took, held time.Duration) {
	if n <= 0 {
		return
	}
	spent := took
	if held > 0 {
		spent = held
	}
	if per := spent / time.Duration(n); p.perMessage == 0 {
		p.perMessage = per
	} else {
		p.perMessage = (p.perMessage + per) / 2
	}
	if held > TargetSerialized {
		// Queued partitions wait for this one: keep it near the target.
		p.limit = max(1, min(p.limit, int(int64(n)*int64(TargetSerialized)/int64(held))))
		return
	}
	if p.limit < p.max {
		p.limit = min(p.max, p.limit+max(1, p.max/16))
	}
}
