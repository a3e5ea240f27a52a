package recent

import (
	"strconv"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

func fp(s string) dedupe.Fingerprint { return dedupe.FingerprintOf(nil, []byte(s)) }

func TestObserve(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	w := New(3, time.Minute)
	if _, s := w.Observe(fp("a"), "id-1", 1, now); s {
		t.Fatal("first sighting flagged")
	}
	if _, s := w.Observe(fp("a"), "id-1", 1, now); s {
		t.Fatal("the same message again flagged")
	}
	prev, s := w.Observe(fp("a"), "id-2", 2, now.Add(time.Second))
	if !s || prev.MessageID != "id-1" || prev.Offset != 1 {
		t.Fatalf("same content, new id: got %v %v", prev, s)
	}
	if _, s := w.Observe(fp("a"), "id-3", 3, now.Add(2*time.Minute)); s {
		t.Fatal("a sighting older than the span flagged")
	}
	// The ring forgets: after three other contents, "a" is gone.
	for i := range 3 {
		w.Observe(fp("x"+strconv.Itoa(i)), "x"+strconv.Itoa(i), int64(10+i), now.Add(2*time.Minute))
	}
	if _, s := w.Observe(fp("a"), "id-4", 20, now.Add(2*time.Minute)); s {
		t.Fatal("an evicted sighting flagged")
	}
	if len(w.byFP) > 3 {
		t.Fatalf("the index holds %d entries for a ring of 3", len(w.byFP))
	}
}

func BenchmarkObserve(b *testing.B) {
	w := New(20000, 10*time.Minute)
	fps := make([]dedupe.Fingerprint, 1<<16)
	ids := make([]string, len(fps))
	for i := range fps {
		fps[i] = fp(strconv.Itoa(i))
		ids[i] = strconv.Itoa(i)
	}
	now := time.Now()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i & (len(fps) - 1)
		w.Observe(fps[j], ids[j], int64(i), now)
	}
}
