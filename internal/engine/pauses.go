package engine

import (
	"context"
	"fmt"
	"log/slog"

	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// pausePollInterval is how often a running consumer reads its pauses, so
// that one written by another process (kafkaonce pause, the page) takes
// effect on the member that owns the partition.
const pausePollInterval = time.Second

// pauseSet is the consumer's pauses as last read, shared by its workers.
// Until the first read succeeds no partition fetches: a pause an operator
// put on for an incident must hold across a restart even when Postgres
// answers slowly at first.
type pauseSet struct {
	mu     sync.Mutex
	list   []pauses.Pause
	loaded bool
	// reads numbers the reads of the table as they start, and applied is
	// the number of the read list comes from: a read that started before
	// another but finishes after it (a slow poll, overtaken by the read
	// Consumer.Pause makes after its write) must not put back the older
	// state.
	reads, applied uint64
	// changed is closed, and replaced, whenever list changes or is first
	// loaded: the workers waiting on it look again.
	changed chan struct{}
}

func newPauseSet() *pauseSet { return &pauseSet{changed: make(chan struct{})} }

// startRead numbers a read of the table about to start.
func (s *pauseSet) startRead() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	return s.reads
}

// set replaces the pauses with list (in pauses.Store.List's order), what
// read number read found, unless a read that started later was applied.
func (s *pauseSet) set(read uint64, list []pauses.Pause) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if read < s.applied {
		return
	}
	s.applied = read
	if s.loaded && slices.EqualFunc(s.list, list, samePause) {
		return
	}
	s.list, s.loaded = list, true
	close(s.changed)
	s.changed = make(chan struct{})
}

func samePause(a, b pauses.Pause) bool {
	return a.Scope == b.Scope && a.At.Equal(b.At) && a.By == b.By && a.Reason == b.Reason && a.Until.Equal(b.Until)
}

// state says whether a pause covers the partition (and which), whether the
// pauses were read at all, and the channel closed at the next change.
func (s *pauseSet) state(topic string, partition int) (p pauses.Pause, paused, loaded bool, changed <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, paused = pauses.Covering(s.list, topic, partition)
	return p, paused, s.loaded, s.changed
}

// refreshPauses reads the consumer's pauses into its set. A failure leaves
// the set as it was, logged: the next poll tries again.
func (c *deps) refreshPauses(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	read := c.pauses.startRead()
	var list []pauses.Pause
	err := c.readOnly(ctx, func(q querier) (err error) {
		list, err = c.pauseStore.List(ctx, q, c.cfg.Name)
		return err
	})
	if err != nil {
		return err
	}
	c.pauses.set(read, list)
	return nil
}

// pollPauses refreshes the pauses now and then every pausePollInterval
// until ctx ends.
func (c *Consumer) pollPauses(ctx context.Context) {
	t := time.NewTicker(pausePollInterval)
	defer t.Stop()
	failing := false
	for {
		err := c.refreshPauses(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			c.log.Warn("cannot read the consumer's pauses; a partition that has not read them yet waits until they can be read", slog.String("error", err.Error()))
			failing = true
		case err == nil && failing:
			c.log.Info("the consumer's pauses can be read again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pause stores a pause of scope, for d (0: until resumed), and applies it
// in this process at once; other processes' members apply it at their
// next poll. A pause for a time ends at the first poll after its end.
func (c *Consumer) Pause(ctx context.Context, scope pauses.Scope, d time.Duration, reason string) error {
	if err := c.knownTopic(scope); err != nil {
		return err
	}
	return c.pauseAs(ctx, scope, d, pausedBy(), reason)
}

// pauseAs stores a pause of scope by by, for d (0: until resumed), and
// applies it in this process at once.
func (c *deps) pauseAs(ctx context.Context, scope pauses.Scope, d time.Duration, by, reason string) error {
	err := c.inTx(ctx, func(q querier) error {
		var err error
		if d == 0 {
			_, err = c.pauseStore.Pause(ctx, q, c.cfg.Name, scope, by, reason)
		} else {
			_, err = c.pauseStore.PauseFor(ctx, q, c.cfg.Name, scope, d, by, reason)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return c.refreshPauses(ctx)
}

// Resume lifts the pause of scope and applies that in this process at once.
func (c *Consumer) Resume(ctx context.Context, scope pauses.Scope) error {
	if err := c.knownTopic(scope); err != nil {
		return err
	}
	err := c.inTx(ctx, func(q querier) error {
		_, err := c.pauseStore.Resume(ctx, q, c.cfg.Name, scope)
		return err
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return c.refreshPauses(ctx)
}

// knownTopic refuses a scope naming a topic the consumer does not read: a
// typo would otherwise pause nothing, silently.
func (c *deps) knownTopic(scope pauses.Scope) error {
	if t := scope.Topic(); t != "" && !slices.Contains(c.cfg.Topics, t) {
		return fmt.Errorf("consumer: pause or resume %s: topic %q is not one of the consumer's Topics %q", scope, t, c.cfg.Topics)
	}
	return nil
}

// pausedBy names this process, for the pause's record.
func pausedBy() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("Consumer.Pause on %s (pid %d)", host, os.Getpid())
}

// waitWhilePaused returns once the pauses are read and none covers the
// partition, or stop is done. It reports the partition paused when a
// pause covers it, and resumed when it fetches again after that or this
// member stops processing it (so that a gauge fed by the hook does not
// stay up on a member that gave the partition away); paused says whether
// it waited on a pause.
func (w *worker) waitWhilePaused(stop context.Context) (paused bool) {
	var reported *pauses.Pause
	defer func() {
		w.progress.paused.Store(false)
		w.progress.wait(false)
		if reported != nil && stop.Err() != nil {
			w.reportPause(context.WithoutCancel(stop), kafkaoncetype.PartitionPaused{Topic: w.topic, Partition: w.partition, Resumed: true})
		}
	}()
	for {
		p, paused, loaded, changed := w.pauses.state(w.topic, w.partition)
		if loaded && !paused {
			if reported != nil {
				w.breaker.resumed(w.topic, time.Now())
				w.log.Info("partition resumed", w.logAttrs()...)
				w.reportPause(stop, kafkaoncetype.PartitionPaused{Topic: w.topic, Partition: w.partition, Resumed: true})
			}
			return reported != nil
		}
		if paused && (reported == nil || !samePause(*reported, p)) {
			attrs := []any{slog.String("scope", p.Scope.String()), slog.String("paused_by", p.By), slog.String("reason", p.Reason), slog.Time("since", p.At)}
			if !p.Until.IsZero() {
				attrs = append(attrs, slog.Time("until", p.Until))
			}
			w.log.Info("partition paused: it fetches nothing until resumed or the pause ends", w.logAttrs(attrs...)...)
			w.reportPause(stop, kafkaoncetype.PartitionPaused{Topic: w.topic, Partition: w.partition, Scope: p.Scope.String(), By: p.By, Reason: p.Reason, Since: p.At, Until: p.Until})
			reported = &p
			w.progress.paused.Store(true)
			w.progress.wait(true)
		}
		select {
		case <-stop.Done():
			return reported != nil
		case <-changed:
		}
	}
}

// afterPause reads the partition's stored position again once a pause is
// lifted: an operator may have moved it meanwhile (offsets.Store.Reset on
// a paused partition), and processing resumes from the stored position. A
// position moved forward is taken as it is, and marked for Kafka; one
// moved back is taken too (the messages from it on are processed again,
// the claims deciding what is a duplicate); one gone comes back as a
// positionLostError, for the worker to start again as after any loss of
// it. Either way before the next fetch, which may find nothing new.
func (w *worker) afterPause(stop, work context.Context) (*positionLostError, error) {
	var st positions.Stored
	var current kafkaclient.TopicID
	var lost *positionLostError
	err := w.retryUntil(stop, "partition resumed: cannot read its stored position", func() error {
		b := &pgx.Batch{}
		w.offsets.QueueLoadStored(b, w.cfg.Name, w.topic, w.partition, &st)
		if err := w.inOneTrip(work, b); err != nil {
			return err
		}
		bounds, err := w.client.Bounds(stop, w.topic, w.partition)
		current = bounds.TopicID
		return err
	})
	if err != nil {
		return nil, err
	}
	// The topic may have been re-created while the partition was paused,
	// or an operator acknowledged a re-creation (offsets.Store.TopicRecreated
	// clears the stored id): decided as at an assignment.
	if err := w.checkTopic(stop, work, st.Found, storedTopic(st), current); err != nil {
		return nil, err
	}
	stored, ok := st.Next, st.Found
	switch {
	case ok && stored > w.next:
		w.positionKnown = true
		w.log.Warn("the stored position moved forward while the partition was paused: processing resumes there, and the messages between are not processed",
			w.logAttrs(slog.Int64("from", w.next), slog.Int64("stored_position", stored))...)
		w.next = stored
		w.mark(stored)
	case ok && stored < w.next:
		w.positionKnown = true
		w.log.Warn("the stored position moved back while the partition was paused: processing again from there, the claims deciding what is a duplicate",
			w.logAttrs(slog.Int64("from", w.next), slog.Int64("stored_position", stored))...)
		w.next = stored
	case !ok && w.positionKnown:
		lost = &positionLostError{stored: restartAfterLoss(w.origin), believed: w.next, missing: true}
		w.log.Error("the stored position is gone since the partition was paused; processing again from the partition's first start", w.logAttrs(
			slog.Int64("start", lost.stored), slog.Int64("committed_up_to", lost.believed))...)
	}
	w.reportLag(work)
	return lost, nil
}

func (w *worker) reportPause(ctx context.Context, p kafkaoncetype.PartitionPaused) {
	for _, hook := range w.hooks.Paused {
		hook(ctx, p)
	}
}

// untilPaused returns a context that ends with stop, or when a pause comes
// to cover the partition: what runs on it (fetching, and the batch's
// retries) treats a pause as it treats a revocation, and leaves the
// messages from w.next on for later.
func (w *worker) untilPaused(stop context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(stop)
	go func() {
		for {
			_, paused, _, changed := w.pauses.state(w.topic, w.partition)
			if paused {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-changed:
			}
		}
	}()
	return ctx, cancel
}

// pausedFor reports whether a pause covers the partition, or whether the
// pauses have not been read yet (a member that cannot read them starts
// nothing, as it fetches nothing).
func (c *deps) pausedFor(topic string, partition int) bool {
	_, paused, loaded, _ := c.pauses.state(topic, partition)
	return paused || !loaded
}
