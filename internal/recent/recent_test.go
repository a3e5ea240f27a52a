package recent

import (
	"crypto/sha256"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

func fp(s string) Fingerprint { return sha256.Sum256([]byte(s)) }

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
	if n := w.entries(); n > 3 {
		t.Fatalf("the index holds %d entries for a ring of 3", n)
	}
}

func (w *Window) entries() int {
	n := 0
	for _, e := range w.index {
		if e != 0 {
			n++
		}
	}
	return n
}

// TestObserveMatchesModel drives the window and a plain model (scan the
// last max sightings, newest first) with the same random sightings, from a
// small set of contents and ids so that repeats, re-sends and evictions are
// frequent, and compares every answer. It also checks that the index holds
// exactly one entry per content still in the ring, after every step.
func TestObserveMatchesModel(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 2, 7, 100, 1000} {
		rng := rand.New(rand.NewPCG(uint64(size), 1))
		w := New(size, 50*time.Second)
		type sighting struct {
			fp     Fingerprint
			id     string
			offset int64
			at     time.Time
		}
		var kept []sighting // the model's ring: every recorded sighting, oldest first
		now := time.Unix(1000, 0)
		for step := range 20000 {
			now = now.Add(time.Duration(rng.IntN(3)) * time.Second)
			content := fp("c" + strconv.Itoa(rng.IntN(2*size+3)))
			id := "id-" + strconv.Itoa(rng.IntN(3*size+5))
			offset := int64(step)

			// The model: the newest sighting of the content among the last
			// size recorded ones.
			var want Sighting
			wantSuspect, same := false, false
			for i := len(kept) - 1; i >= 0 && i >= len(kept)-size; i-- {
				if kept[i].fp != content {
					continue
				}
				if kept[i].id == id {
					same = true
				} else if now.Sub(kept[i].at) <= 50*time.Second && kept[i].offset != offset {
					want, wantSuspect = Sighting{MessageID: kept[i].id, Offset: kept[i].offset, At: kept[i].at}, true
				}
				break
			}
			if !same {
				kept = append(kept, sighting{content, id, offset, now})
			}

			got, suspect := w.Observe(content, id, offset, now)
			if suspect != wantSuspect || got.MessageID != want.MessageID || got.Offset != want.Offset || !got.At.Equal(want.At) {
				t.Fatalf("size %d step %d: got %+v %v, want %+v %v", size, step, got, suspect, want, wantSuspect)
			}
			distinct := map[Fingerprint]bool{}
			for i := max(0, len(kept)-size); i < len(kept); i++ {
				distinct[kept[i].fp] = true
			}
			if n := w.entries(); n != len(distinct) {
				t.Fatalf("size %d step %d: index has %d entries, ring has %d contents", size, step, n, len(distinct))
			}
		}
	}
}

func BenchmarkObserve(b *testing.B) {
	w := New(20000, 10*time.Minute)
	fps := make([]Fingerprint, 1<<16)
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

// ObserveRepeat tells a message seen again under its own id (a redelivery
// or a re-send) from a first sighting, and points at the first copy.
func TestObserveRepeat(t *testing.T) {
	w := New(10, time.Minute)
	now := time.Now()
	if _, _, r := w.ObserveRepeat(fp("a"), "id-1", 5, now); r != -1 {
		t.Fatalf("first sighting: repeatOf %d, want -1", r)
	}
	if _, s, r := w.ObserveRepeat(fp("a"), "id-1", 9, now); s || r != 5 {
		t.Fatalf("re-send: suspect %v, repeatOf %d; want false, 5 (the first copy)", s, r)
	}
	// The same content under another id: a suspect, not a repeat, and it
	// becomes the id the content is remembered with.
	if _, s, r := w.ObserveRepeat(fp("a"), "id-2", 12, now); !s || r != -1 {
		t.Fatalf("another id: suspect %v, repeatOf %d; want true, -1", s, r)
	}
	if _, _, r := w.ObserveRepeat(fp("a"), "id-2", 13, now); r != 12 {
		t.Fatalf("re-send under the second id: repeatOf %d, want 12", r)
	}
	// Another content under a known id is not a repeat of it.
	if _, _, r := w.ObserveRepeat(fp("b"), "id-2", 14, now); r != -1 {
		t.Fatalf("new content under a known id: repeatOf %d, want -1", r)
	}
}
