package engine

import (
	"context"
	"log/slog"
	"slices"

	"github.com/kafkaonce/kafkaonce/pauses"
)

// coveringAny says whether a pause covers any partition of topics (and
// which), whether the pauses were read at all, and the channel closed at
// the next change.
func (s *pauseSet) coveringAny(topics []string) (p pauses.Pause, paused, loaded bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.list {
		if t := p.Scope.Topic(); t == "" || slices.Contains(topics, t) {
			return p, true, s.loaded, s.changed
		}
	}
	return pauses.Pause{}, false, s.loaded, s.changed
}

// waitWhilePaused holds a share group member before its next poll while a
// pause covers any of its topics or partitions, or until the pauses are
// first read. A share member owns no partitions and cannot choose what a
// poll hands it, so any pause stops its polling altogether: it acquires
// nothing, so no record's delivery is spent (a release counts one) and
// none is skipped; the records stay with the group, for a member of
// another consumer or for this one once resumed. The records of a poll in
// hand when the pause comes are finished first.
func (s *shareMember) waitWhilePaused(stop context.Context) {
	logged := false
	for {
		p, paused, loaded, changed := s.pauses.coveringAny(s.cfg.Topics)
		if loaded && !paused {
			if logged {
				s.log.Info("share group member resumed")
			}
			return
		}
		if loaded && !logged {
			s.log.Info("share group member paused: it polls no records until resumed", slog.String("scope", p.Scope.String()),
				slog.String("by", p.By), slog.String("reason", p.Reason))
			logged = true
		}
		select {
		case <-stop.Done():
			return
		case <-changed:
		}
	}
}
