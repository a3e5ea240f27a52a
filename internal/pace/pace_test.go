package pace

import (
	"testing"
	"time"
)

func TestContentionHalvesTheBatchAndCommitsGrowItBack(t *testing.T) {
	p := New(1000, NewGate())
	now := time.Unix(1_000_000, 0)
	if !p.Contended(1000, false, now) {
		t.Fatal("the first contention did not serialize the consumer")
	}
	if p.Limit(false) != 500 {
		t.Fatalf("limit after one contention = %d, want 500", p.Limit(false))
	}
	p.Contended(500, true, now)
	p.Contended(250, true, now)
	if p.Limit(false) != 125 || p.Retries() != 3 || !p.LastContention().Equal(now) {
		t.Fatalf("limit = %d, retries = %d, last = %v; want 125, 3, %v", p.Limit(false), p.Retries(), p.LastContention(), now)
	}
	for range 20 {
		p.Committed(p.Limit(false), 0, 0)
	}
	if p.Limit(false) != 1000 {
		t.Fatalf("limit after 20 commits = %d, want 1000 (never above the maximum)", p.Limit(false))
	}
}

func TestTheBatchNeverShrinksBelowOne(t *testing.T) {
	p := New(4, NewGate())
	now := time.Unix(1_000_000, 0)
	for range 5 {
		p.Contended(1, false, now)
	}
	if p.Limit(false) != 1 {
		t.Fatalf("limit = %d, want 1", p.Limit(false))
	}
	p.Committed(1, time.Hour, 0)
	if p.Limit(false) != 2 {
		t.Fatalf("limit after a commit = %d, want 2 (a step is at least one message, and one message is never cut)", p.Limit(false))
	}
}

func TestTheGateIsHeldNearTheTarget(t *testing.T) {
	p := New(1000, NewGate())
	p.Contended(1000, false, time.Unix(1_000_000, 0))
	p.Committed(500, 4*TargetSerialized, 4*TargetSerialized)
	if p.Limit(false) != 125 {
		t.Fatalf("limit after holding the gate 4× too long = %d, want 125", p.Limit(false))
	}
	p.Committed(125, TargetSerialized/2, TargetSerialized/2)
	if want := 125 + 1000/16; p.Limit(false) != want {
		t.Fatalf("limit after a short turn at the gate = %d, want %d", p.Limit(false), want)
	}
}

func TestOnePartitionsContentionSerializesThemAll(t *testing.T) {
	g := NewGate()
	a, b := New(100, g), New(100, g)
	now := time.Unix(1_000_000, 0)
	a.Contended(100, false, now)
	if !g.Serialized(now.Add(time.Second)) {
		t.Fatal("the gate did not close")
	}
	if b.Limit(false) != 100 {
		t.Fatalf("the other partition's batch shrank to %d: sizes are per partition", b.Limit(false))
	}
	if b.Contended(100, false, now.Add(time.Millisecond)) {
		t.Fatal("a transaction that started before the gate closed closed it again")
	}
}

func TestSerializationEndsAndReturnsForLonger(t *testing.T) {
	g := NewGate()
	p := New(100, g)
	t0 := time.Unix(1_000_000, 0)
	if !p.Contended(100, false, t0) || !g.Serialized(t0.Add(Hold-time.Millisecond)) {
		t.Fatal("not serialized for Hold after the first contention")
	}
	if g.Serialized(t0.Add(Hold)) {
		t.Fatal("still serialized after Hold")
	}
	if p.Contended(50, true, t0.Add(time.Second)) {
		t.Fatal("a contention while serialized (with a writer outside the gate) re-entered the gate")
	}
	t1 := t0.Add(Hold + time.Second)
	if !p.Contended(50, false, t1) || !g.Serialized(t1.Add(2*Hold-time.Millisecond)) || g.Serialized(t1.Add(2*Hold)) {
		t.Fatal("the second serialization did not last twice as long")
	}
	tn := t1
	for range 10 {
		tn = g.Until().Add(time.Second)
		p.Contended(10, false, tn)
	}
	if got := g.Until().Sub(tn); got != MaxHold {
		t.Fatalf("serialization grew to %v, want the cap %v", got, MaxHold)
	}
	quiet := g.Until().Add(Forgive + time.Second)
	p.Contended(10, false, quiet)
	if got := g.Until().Sub(quiet); got != Hold {
		t.Fatalf("after %v without contention the serialization lasts %v, want %v", Forgive, got, Hold)
	}
}

func TestAFirstTurnAtTheGateIsSizedFromThePartitionsPace(t *testing.T) {
	p := New(1000, NewGate())
	if got := p.Limit(true); got != 62 {
		t.Fatalf("serialized limit with no estimate = %d, want a sixteenth of the maximum", got)
	}
	p.Committed(1000, time.Second, 0) // racing: 1ms a message
	if got := p.Limit(true); got != 50 {
		t.Fatalf("serialized limit at 1ms a message = %d, want TargetSerialized's worth, 50", got)
	}
	if got := p.Limit(false); got != 1000 {
		t.Fatalf("racing limit = %d, want 1000: the estimate only bounds turns at the gate", got)
	}
}

// Messages that each take a little longer than TargetSerialized (a 60ms
// handler): a turn at the gate stays one message long instead of growing
// by MaxBatch/16 after each one-message turn (seconds at the gate), and
// the first turn after the gate closes is sized too.
func TestSlowMessagesKeepTurnsAtTheGateNearTheTarget(t *testing.T) {
	const perMessage = 60 * time.Millisecond
	g := NewGate()
	p := New(1000, g)
	p.Committed(100, 100*perMessage, 0)               // racing, before any contention
	p.Contended(1000, false, time.Unix(1_000_000, 0)) // the consumer is serialized
	var worst time.Duration
	var sizes []int
	for range 20 {
		n := p.Limit(true) // a partition with a backlog fills its turn
		held := time.Duration(n) * perMessage
		worst = max(worst, held)
		sizes = append(sizes, n)
		p.Committed(n, held, held)
	}
	t.Logf("serialized turns (messages): %v; longest hold %v", sizes, worst)
	if worst > 4*TargetSerialized {
		t.Fatalf("a serialized transaction held the gate %v, %.0f× TargetSerialized (%v)", worst, float64(worst)/float64(TargetSerialized), TargetSerialized)
	}
}
