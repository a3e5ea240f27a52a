package engine

import (
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/pauses"
)

func TestPauseSet(t *testing.T) {
	at := time.Unix(1700000000, 0)
	topicPause := pauses.Pause{Consumer: "c", Scope: pauses.Topic("t"), At: at, By: "ops"}

	t.Run("nothing is known, and no partition fetches, until the first read", func(t *testing.T) {
		s := newPauseSet()
		_, paused, loaded, changed := s.state("t", 0)
		if paused || loaded {
			t.Fatalf("before any read: paused %v, loaded %v; want neither", paused, loaded)
		}
		s.set(s.startRead(), nil)
		select {
		case <-changed:
		default:
			t.Fatal("the first read, even of no pauses, did not wake the waiters")
		}
		if _, paused, loaded, _ = s.state("t", 0); paused || !loaded {
			t.Fatalf("after reading no pauses: paused %v, loaded %v; want loaded and not paused", paused, loaded)
		}
	})

	t.Run("a change wakes the waiters, and the same list again does not", func(t *testing.T) {
		s := newPauseSet()
		s.set(s.startRead(), nil)
		_, _, _, changed := s.state("t", 0)
		s.set(s.startRead(), nil)
		select {
		case <-changed:
			t.Fatal("an unchanged list woke the waiters")
		default:
		}
		s.set(s.startRead(), []pauses.Pause{topicPause})
		select {
		case <-changed:
		default:
			t.Fatal("a new pause did not wake the waiters")
		}
		p, paused, _, changed := s.state("t", 3)
		if !paused || p.By != "ops" {
			t.Fatalf("t/3 under a pause of topic t: paused %v by %q", paused, p.By)
		}
		if _, paused, _, _ := s.state("u", 3); paused {
			t.Fatal("u/3 paused by a pause of topic t")
		}
		again := topicPause
		again.Reason = "now with a reason"
		s.set(s.startRead(), []pauses.Pause{again})
		select {
		case <-changed:
		default:
			t.Fatal("a pause whose reason changed did not wake the waiters")
		}
	})

	t.Run("a read that started first and ends last does not put back what it found", func(t *testing.T) {
		s := newPauseSet()
		slow := s.startRead()  // a poll, before the pause was written
		fresh := s.startRead() // Consumer.Pause's read, after it
		s.set(fresh, []pauses.Pause{topicPause})
		s.set(slow, nil)
		if _, paused, _, _ := s.state("t", 0); !paused {
			t.Fatal("a stale read lifted a pause")
		}
	})
}
