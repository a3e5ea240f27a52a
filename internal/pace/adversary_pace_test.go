package pace

import (
	"testing"
	"time"
)

// The claim (pace.go, the brief): "Serialized, a transaction may cover
// many messages again: the time it holds the gate is kept to about
// TargetSerialized, so that a partition waiting its turn behind the others
// never waits long." With messages that each take a little longer than
// TargetSerialized (a 60ms handler: an HTTP call, a slow query), a
// one-message commit that held the gate 60ms takes the additive-increase
// branch (n > 1 is false), so the next turn covers 1 + MaxBatch/16 = 63
// messages and holds the gate ~3.8s, 75 times the target; then 1, then 63
// again. Every partition queued behind it waits seconds at the gate.
func TestAdvSlowSingleMessagesOscillateFarAboveTheTarget(t *testing.T) {
	const perMessage = 60 * time.Millisecond
	g := NewGate()
	p := New(1000, g)
	p.Contended(1000, false, time.Unix(1_000_000, 0)) // the consumer is serialized
	var worst time.Duration
	var sizes []int
	for i := range 20 {
		n := p.Limit(true) // a partition with a backlog fills its turn
		held := time.Duration(n) * perMessage
		if i > 0 { // the first turn's size is not yet adapted to the hold
			worst = max(worst, held)
		}
		sizes = append(sizes, n)
		p.Committed(n, held, held)
	}
	t.Logf("serialized turns (messages): %v; longest hold after the first turn %v", sizes, worst)
	if worst > 4*TargetSerialized {
		t.Fatalf("a serialized transaction held the gate %v, %.0f× TargetSerialized (%v)", worst, float64(worst)/float64(TargetSerialized), TargetSerialized)
	}
}
