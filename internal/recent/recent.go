// Package recent remembers, per partition, which message id each recently
// seen content (fingerprint) had, to catch producers that re-send a message
// under a fresh id: the copies carry different ids and the same content, so
// deduplication by id cannot see them.
//
// Memory is bounded: a ring of at most Max sightings, and sightings older
// than Span do not count. Producers re-send with the same key, so copies
// land in the same partition and usually within seconds; that is the case
// this catches in memory at no database cost. Copies that land in another
// partition, or arrive after a restart, are found by the audit instead.
package recent

import (
	"time"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

// Sighting is where a content was seen.
type Sighting struct {
	MessageID string
	Offset    int64
	At        time.Time
}

// Window is the memory of one partition. It is not safe for concurrent use.
type Window struct {
	span time.Duration
	max  int
	ring []slot // grows to max, then wraps
	next int
	byFP map[dedupe.Fingerprint]int32
}

type slot struct {
	fp   dedupe.Fingerprint
	seen Sighting
	used bool
}

// New returns a window of at most max sightings no older than span. It
// grows as sightings arrive: a consumer assigned many quiet partitions does
// not pay max for each of them up front.
func New(max int, span time.Duration) *Window {
	return &Window{span: span, max: max, byFP: map[dedupe.Fingerprint]int32{}}
}

// Observe records a sighting of fp under id, and returns the previous
// sighting of fp when it was under another id within the span.
func (w *Window) Observe(fp dedupe.Fingerprint, id string, offset int64, now time.Time) (Sighting, bool) {
	var prev Sighting
	suspect := false
	if i, ok := w.byFP[fp]; ok {
		s := &w.ring[i]
		if s.seen.MessageID != id && now.Sub(s.seen.At) <= w.span && s.seen.Offset != offset {
			prev, suspect = s.seen, true
		}
		if s.seen.MessageID == id {
			// The same message again (a retry of the batch, a redelivery):
			// keep the first sighting.
			return prev, suspect
		}
	}
	if len(w.ring) < w.max && w.next == len(w.ring) {
		w.ring = append(w.ring, slot{})
	}
	s := &w.ring[w.next]
	if s.used {
		if i, ok := w.byFP[s.fp]; ok && int(i) == w.next {
			delete(w.byFP, s.fp)
		}
	}
	*s = slot{fp: fp, seen: Sighting{MessageID: id, Offset: offset, At: now}, used: true}
	w.byFP[fp] = int32(w.next)
	w.next = (w.next + 1) % w.max
	return prev, suspect
}
