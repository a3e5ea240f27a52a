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
//   - The partition's transactions are serialized for a while: they take the
//     consumer's gate (a transaction-scoped advisory lock) before anything
//     else, so they commit one after another, in every process of the
//     consumer, and cannot deadlock each other. Serialized, a transaction
//     may cover many messages again: it is kept to about TargetSerialized,
//     so that a partition waiting its turn behind the others never waits
//     long. After Hold the partition leaves the gate and races again; if it
//     loses again, it goes back for twice as long (up to MaxHold).
//
// Pace holds no lock and no clock of its own: the caller passes the time,
// which keeps it deterministic under test.
package pace

import "time"

// Tuning. The figures behind them are in BENCHMARKS.md ("Hot rows").
const (
	// TargetSerialized bounds the duration of a serialized transaction,
	// and with it the wait of the partitions queued behind it at the gate.
	TargetSerialized = 50 * time.Millisecond
	// Hold is how long a partition stays serialized after its first
	// contention; each return doubles it, up to MaxHold.
	Hold    = 15 * time.Second
	MaxHold = 4 * time.Minute
	// Forgive: a partition that met no contention for this long starts
	// over at Hold.
	Forgive = 10 * time.Minute
)

// Pace is one partition's state. The zero value is not usable: see New.
type Pace struct {
	max   int
	limit int
	// serializedUntil: transactions take the gate until then.
	serializedUntil time.Time
	// hold is how long the next serialization lasts.
	hold time.Duration
	// lastContention is when the partition last lost a race (zero: never).
	lastContention time.Time
	// retries counts contentions since New.
	retries int64
}

// New returns the state of a partition whose batches hold up to most
// messages.
func New(most int) *Pace {
	most = max(most, 1)
	return &Pace{max: most, limit: most, hold: Hold}
}

// Limit is how many messages the next transaction may cover.
func (p *Pace) Limit() int { return p.limit }

// Serialized reports whether a transaction starting at now takes the gate.
func (p *Pace) Serialized(now time.Time) bool { return now.Before(p.serializedUntil) }

// SerializedUntil is when the current serialization ends (zero, or in the
// past, when there is none).
func (p *Pace) SerializedUntil() time.Time { return p.serializedUntil }

// Retries counts the transactions that lost a race, since New.
func (p *Pace) Retries() int64 { return p.retries }

// LastContention is when the partition last lost a race (zero: never).
func (p *Pace) LastContention() time.Time { return p.lastContention }

// Contended records that a transaction over n messages, started at a time
// when it was serialized or not (serialized), lost a race at now. It
// reports whether the partition now starts serializing.
func (p *Pace) Contended(n int, serialized bool, now time.Time) (entered bool) {
	p.retries++
	if !p.lastContention.IsZero() && now.Sub(p.lastContention) > Forgive {
		p.hold = Hold
	}
	p.lastContention = now
	p.limit = max(1, min(p.limit, n/2))
	if serialized || p.Serialized(now) {
		// Lost to a transaction outside the gate (another consumer, an
		// API): the gate cannot help with those, the smaller batch can.
		return false
	}
	p.serializedUntil = now.Add(p.hold)
	p.hold = min(2*p.hold, MaxHold)
	return true
}

// Committed records that a transaction over n messages, started serialized
// or not, committed after took.
func (p *Pace) Committed(n int, serialized bool, took time.Duration) {
	if serialized && took > TargetSerialized && n > 1 {
		// Queued partitions wait for this one: keep it near the target.
		p.limit = max(1, min(p.limit, int(int64(n)*int64(TargetSerialized)/int64(took))))
		return
	}
	if p.limit < p.max {
		p.limit = min(p.max, p.limit+max(1, p.max/16))
	}
}
