package pace

import (
	"testing"
	"time"
)

func TestContentionHalvesTheBatchAndCommitsGrowItBack(t *testing.T) {
	p := New(1000)
	now := time.Unix(1_000_000, 0)
	if !p.Contended(1000, false, now) {
		t.Fatal("the first contention did not serialize the partition")
	}
	if p.Limit() != 500 {
		t.Fatalf("limit after one contention = %d, want 500", p.Limit())
	}
	p.Contended(500, true, now)
	p.Contended(250, true, now)
	if p.Limit() != 125 || p.Retries() != 3 {
		t.Fatalf("limit = %d, retries = %d; want 125, 3", p.Limit(), p.Retries())
	}
	for range 20 {
		p.Committed(p.Limit(), false, time.Millisecond)
	}
	if p.Limit() != 1000 {
		t.Fatalf("limit after 20 quick commits = %d, want 1000 (never above the maximum)", p.Limit())
	}
}

func TestTheBatchNeverShrinksBelowOne(t *testing.T) {
	p := New(4)
	now := time.Unix(1_000_000, 0)
	for range 5 {
		p.Contended(1, false, now)
	}
	if p.Limit() != 1 {
		t.Fatalf("limit = %d, want 1", p.Limit())
	}
	p.Committed(1, false, time.Millisecond)
	if p.Limit() != 2 {
		t.Fatalf("limit after a commit = %d, want 2 (a step is at least one message)", p.Limit())
	}
}

func TestSerializedTransactionsAreKeptNearTheTarget(t *testing.T) {
	p := New(1000)
	now := time.Unix(1_000_000, 0)
	p.Contended(1000, false, now)
	p.Committed(500, true, 4*TargetSerialized)
	if p.Limit() != 125 {
		t.Fatalf("limit after a serialized transaction 4× too long = %d, want 125", p.Limit())
	}
	p.Committed(125, true, TargetSerialized/2)
	if p.Limit() != 125+1000/16 {
		t.Fatalf("limit after a quick serialized transaction = %d, want %d", p.Limit(), 125+1000/16)
	}
	// Outside the gate, duration does not matter.
	p.Committed(p.Limit(), false, time.Hour)
	if p.Limit() != 125+2*(1000/16) {
		t.Fatalf("limit = %d, want %d", p.Limit(), 125+2*(1000/16))
	}
}

func TestSerializationEndsAndReturnsForLonger(t *testing.T) {
	p := New(100)
	t0 := time.Unix(1_000_000, 0)
	if !p.Contended(100, false, t0) || !p.Serialized(t0.Add(Hold-time.Millisecond)) {
		t.Fatal("not serialized for Hold after the first contention")
	}
	if p.Serialized(t0.Add(Hold)) {
		t.Fatal("still serialized after Hold")
	}
	if p.Contended(50, true, t0.Add(time.Second)) {
		t.Fatal("a contention while serialized (with a writer outside the gate) re-entered the gate")
	}
	t1 := t0.Add(Hold + time.Second)
	if !p.Contended(50, false, t1) || !p.Serialized(t1.Add(2*Hold-time.Millisecond)) || p.Serialized(t1.Add(2*Hold)) {
		t.Fatal("the second serialization did not last twice as long")
	}
	tn := t1
	for range 10 {
		tn = p.SerializedUntil().Add(time.Second)
		p.Contended(10, false, tn)
	}
	if got := p.SerializedUntil().Sub(tn); got != MaxHold {
		t.Fatalf("serialization grew to %v, want the cap %v", got, MaxHold)
	}
	quiet := p.SerializedUntil().Add(Forgive + time.Second)
	p.Contended(10, false, quiet)
	if got := p.SerializedUntil().Sub(quiet); got != Hold {
		t.Fatalf("after %v without contention the serialization lasts %v, want %v", Forgive, got, Hold)
	}
}
