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
	"crypto/sha256"
	"encoding/binary"
	"time"
)

// Fingerprint is the digest of a message's content: a SHA-256 sum, such as
// the dedupe.Fingerprint the consumer computes for each message.
type Fingerprint = [sha256.Size]byte

// Sighting is where a content was seen.
type Sighting struct {
	MessageID string
	Offset    int64
	At        time.Time
}

// Window is the memory of one partition. It is not safe for concurrent use.
//
// Observe runs for every message, so the window is built to cost little:
// a ring of compact slots, and an open-addressing index from fingerprint to
// ring slot (the fingerprints are SHA-256 sums, so their first bytes are
// already a uniform hash). A Go map keyed by the 32-byte fingerprint cost
// several times more time and garbage per message.
//
// The ring is kept in pages of pageSlots slots, added as it grows: growing
// one slice by append copied it each time, and the copies were garbage of
// several times the final ring (Go grows large slices by a quarter).
type Window struct {
	span  int64 // nanoseconds
	max   int
	pages []*[pageSlots]slot // the ring: grows to max slots, then wraps
	size  int                // slots in use, up to max
	next  int
	index []int32 // ring position + 1; 0 is empty. Never more than half full.
}

// pageSlots is the size of a page of the ring: 16 KiB.
const pageSlots = 256

// slot returns ring position i.
func (w *Window) slot(i int) *slot { return &w.pages[i/pageSlots][i%pageSlots] }

type slot struct {
	fp     Fingerprint
	id     string
	offset int64
	at     int64 // UnixNano; 0 while the slot is unused
}

// New returns a window of at most max sightings no older than span. It
// grows as sightings arrive: a consumer assigned many quiet partitions does
// not pay max for each of them up front.
func New(max int, span time.Duration) *Window {
	return &Window{span: int64(span), max: max, index: make([]int32, 64)}
}

// Observe records a sighting of fp under id, and returns the previous
// sighting of fp when it was under another id within the span.
func (w *Window) Observe(fp Fingerprint, id string, offset int64, now time.Time) (Sighting, bool) {
	prev, suspect, _ := w.ObserveRepeat(fp, id, offset, now)
	return prev, suspect
}

// ObserveRepeat is Observe, and it also reports, as repeatOf, the offset
// at which fp was first seen under id itself when it was (this message
// fetched again, or a re-send of it under the same id), else -1. Only the
// last id seen with fp is remembered.
func (w *Window) ObserveRepeat(fp Fingerprint, id string, offset int64, now time.Time) (prev Sighting, suspect bool, repeatOf int64) {
	at := now.UnixNano()
	ix, found := w.find(&fp)
	if found {
		s := w.slot(int(w.index[ix]) - 1)
		if s.id == id {
			// The same message again (a retry of the batch, a redelivery,
			// a re-send): keep the first sighting.
			return prev, false, s.offset
		}
		if at-s.at <= w.span && s.offset != offset {
			prev, suspect = Sighting{MessageID: s.id, Offset: s.offset, At: time.Unix(0, s.at)}, true
		}
	}
	if w.size < w.max && w.next == w.size {
		if w.size%pageSlots == 0 {
			w.pages = append(w.pages, new([pageSlots]slot))
		}
		w.size++
		if 2*w.size > len(w.index) {
			w.grow()
			ix, found = w.find(&fp)
		}
	}
	s := w.slot(w.next)
	if s.at != 0 {
		// Forget the sighting this slot held, if the index still points
		// at it (a later sighting of the same content may have taken over).
		w.forget(&s.fp, int32(w.next+1))
		ix, found = w.find(&fp)
	}
	*s = slot{fp: fp, id: id, offset: offset, at: at}
	// ix is fp's entry (now pointing here) or the empty entry where fp
	// belongs.
	w.index[ix] = int32(w.next + 1)
	w.next = (w.next + 1) % w.max
	return prev, suspect, -1
}

// home is where fp's probe sequence starts.
func (w *Window) home(fp *Fingerprint) int {
	return int(binary.LittleEndian.Uint64(fp[:8]) & uint64(len(w.index)-1))
}

// find returns the index entry of fp and true, or the empty entry where it
// would go and false.
func (w *Window) find(fp *Fingerprint) (int, bool) {
	mask := len(w.index) - 1
	for i := w.home(fp); ; i = (i + 1) & mask {
		e := w.index[i]
		if e == 0 {
			return i, false
		}
		if w.slot(int(e)-1).fp == *fp {
			return i, true
		}
	}
}

// forget removes fp's entry if it points at ring position pos-1, shifting
// the entries after it back so that no probe sequence has a hole.
func (w *Window) forget(fp *Fingerprint, pos int32) {
	i, ok := w.find(fp)
	if !ok || w.index[i] != pos {
		return
	}
	mask := len(w.index) - 1
	for j := (i + 1) & mask; w.index[j] != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole at i when i lies on its probe
		// sequence, between its home and j.
		k := w.home(&w.slot(int(w.index[j]) - 1).fp)
		if (j-k)&mask >= (j-i)&mask {
			w.index[i] = w.index[j]
			i = j
		}
	}
	w.index[i] = 0
}

// grow doubles the index and re-inserts its entries.
func (w *Window) grow() {
	old := w.index
	w.index = make([]int32, 2*len(old))
	for _, e := range old {
		if e != 0 {
			i, _ := w.find(&w.slot(int(e) - 1).fp)
			w.index[i] = e
		}
	}
}
