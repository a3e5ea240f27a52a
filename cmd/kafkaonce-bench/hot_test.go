package main

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// The cells without hot accounts keep their names and JSON, so results
// saved before hot rows existed still parse and match.
func TestCellsWithoutAccountsUnchanged(t *testing.T) {
	if got, want := base.String(), "p=12 empty ids=uuidv7 dup=0% update 100B batch=1000"; got != want {
		t.Fatalf("base cell is %q, want %q", got, want)
	}
	b, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "accounts") {
		t.Fatalf("base cell's JSON names accounts: %s", b)
	}
	saved := `{"partitions":12,"prefilled":false,"ids":"uuidv7","duplicates":0,"effect":"update","size":100,"max_batch":1000}`
	var c cell
	if err := json.Unmarshal([]byte(saved), &c); err != nil {
		t.Fatal(err)
	}
	if c != base {
		t.Fatalf("saved base cell reads back as %+v", c)
	}
}

// -only transfer selects the two hot cells, each with the four modes.
func TestHotCellsInPlan(t *testing.T) {
	var hot []planned
	for _, p := range buildPlan(options{}) {
		if strings.Contains(p.c.String(), "transfer") {
			hot = append(hot, p)
		}
	}
	if len(hot) != 2 {
		t.Fatalf("%d cells contain transfer, want 2", len(hot))
	}
	for i, n := range []string{"accounts=50", "accounts=5"} {
		if s := hot[i].c.String(); !strings.HasSuffix(s, n) || hot[i].c.Partitions != 12 || hot[i].c.MaxBatch != 1000 {
			t.Errorf("hot cell %d is %s", i, s)
		}
		if got := strings.Join(hot[i].modes, ","); got != "naive-pp,optimum,kafkaonce,kafkaonce-batch" {
			t.Errorf("hot cell %d runs %s", i, got)
		}
	}
}

// Transfers are between two distinct hot accounts, in values of the
// cell's size, spread over every partition.
func TestTransferMessages(t *testing.T) {
	c := base
	c.Effect, c.Accounts = effectTransfer, 5
	g := newGenerator(c, 1)
	partitions := map[int]bool{}
	for range 2000 {
		m := g.next()
		if len(m.Value) != c.Size {
			t.Fatalf("value of %d bytes, want %d", len(m.Value), c.Size)
		}
		from, to := transferOf(m.Value)
		if from == to || from < 0 || to < 0 || from >= 5 || to >= 5 {
			t.Fatalf("transfer from %d to %d", from, to)
		}
		partitions[m.Partition] = true
	}
	if len(partitions) != c.Partitions {
		t.Fatalf("transfers on %d partitions, want %d", len(partitions), c.Partitions)
	}
	var s transferSet
	s.add(transferValue(3, 1))
	s.add(transferValue(1, 4))
	if got := s.accounts(); len(got) != 3 || got[0] != 1 || got[1] != 3 || got[2] != 4 {
		t.Fatalf("accounts to lock: %v, want [1 3 4]", got)
	}
}

func transferValue(from, to int) []byte {
	v := make([]byte, transferBytes)
	binary.BigEndian.PutUint32(v[8:], uint32(from))
	binary.BigEndian.PutUint32(v[12:], uint32(to))
	return v
}

func TestLongestStall(t *testing.T) {
	at := func(s float64) time.Time { return time.Unix(100, 0).Add(time.Duration(s * float64(time.Second))) }
	rec := newRecorder(6)
	rec.stalls = newStalls([]int{3, 3, 0})
	rec.start(at(0))
	rec.add(0, 1, at(1))
	rec.add(1, 3, at(0.5)) // partition 1 done
	rec.add(0, 1, at(3))   // 2 s since its last commit
	rec.stop(at(3.5))
	if got := rec.longestStall(); got != 2*time.Second {
		t.Fatalf("longest stall %v, want 2s", got)
	}
	// Partition 0 never finished: stalled from its last commit to the end.
	rec.stop(at(6))
	if got := rec.longestStall(); got != 3*time.Second {
		t.Fatalf("longest stall %v, want 3s", got)
	}
	if got := rec.elapsed(); got != 6*time.Second {
		t.Fatalf("a partial run's time is %v, want 6s (until it stopped)", got)
	}
}

func TestCheckTransfers(t *testing.T) {
	c := base
	c.Effect, c.Accounts = effectTransfer, 50
	b := backlog{total: 10, unique: 8}
	rec := newRecorder(10)
	rec.add(0, 10, time.Now())
	if got, err := check(c, b, rec, totals{5, 100}, totals{5, 116}); err != nil || got != "once each" {
		t.Fatalf("check: %q, %v", got, err)
	}
	if _, err := check(c, b, rec, totals{5, 100}, totals{5, 118}); err == nil {
		t.Fatal("a transfer applied twice passed the check")
	}
	partial := newRecorder(10)
	if _, err := check(c, b, partial, totals{5, 100}, totals{6, 101}); err == nil {
		t.Fatal("a half-applied transfer passed the check")
	}
}
