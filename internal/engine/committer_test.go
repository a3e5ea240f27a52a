package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// committerSetup is a committer on a scripted group. The test plays the
// workers: batch stores a run's offset in the "database" and then marks
// it, as a worker does after its transaction committed, and flush sends
// what is pending, as the committer's loop does when woken.
type committerSetup struct {
	*groupLog
	group *scriptGroup
	c     *committer
}

func newCommitterSetup(t *testing.T) *committerSetup {
	t.Helper()
	log := newGroupLog()
	g := &scriptGroup{log: log}
	return &committerSetup{groupLog: log, group: g, c: newCommitter(g, slog.New(slog.DiscardHandler), nil)}
}

// run starts a run of partition p, the partition's current one from now.
func (s *committerSetup) run(p int) *partitionRun {
	r := &partitionRun{tp: part(p), done: make(chan struct{})}
	s.c.own(r)
	return r
}

func (s *committerSetup) batch(r *partitionRun, next int64, meta string) {
	s.store(r.tp, next)
	s.c.mark(r, next, meta)
}

func (s *committerSetup) flush() { s.c.flush(context.Background()) }

func TestCommitter(t *testing.T) {
	t.Parallel()

	t.Run("commits the latest mark of each partition, once, and never past what the database has", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.batch(r0, 5, "")
		s.batch(r0, 7, "")
		s.batch(r1, 3, "")
		s.flush()
		s.flush() // nothing new: no commit
		s.batch(r1, 4, "")
		s.flush()
		require.Equal(t, []string{
			"stored t/0@5", "stored t/0@7", "stored t/1@3",
			"commit t/0@7 t/1@3",
			"stored t/1@4",
			"commit t/1@4",
		}, s.list())
	})

	t.Run("a lower mark does not take the offset back, and new metadata at the same offset is committed", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r := s.run(0)
		s.batch(r, 7, "a")
		s.c.mark(r, 5, "a") // a run's marks only go up; an older one arriving late changes nothing
		s.flush()
		s.c.mark(r, 7, "b")
		s.flush()
		require.Equal(t, []string{"stored t/0@7", "commit t/0@7[a]", "commit t/0@7[b]"}, s.list())
	})

	t.Run("the marks of a run that is no longer the partition's are not committed", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		old := s.run(0)
		current := s.run(0) // assigned again: the old run was abandoned
		s.batch(old, 9, "")
		s.flush()
		s.batch(current, 4, "")
		s.flush()
		require.Equal(t, []string{"stored t/0@9", "stored t/0@4", "commit t/0@4"}, s.list())
	})

	t.Run("a mark at offset 0, a first start where the log begins, is committed with its metadata", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r := s.run(0)
		// assign stores the first start, 0, then marks it, so that the
		// group's offset carries the mark before any message is
		// processed: a lost row is then recognised.
		s.batch(r, 0, "first=0")
		s.flush()
		require.Equal(t, []string{"stored t/0@0", "commit t/0@0[first=0]"}, s.list())
	})

	t.Run("a commit at offset 0 that failed is retried", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r := s.run(0)
		s.group.answer(refuse(errors.New("coordinator not available")))
		s.batch(r, 0, "first=0")
		s.flush()
		s.flush()
		require.Equal(t, []string{"stored t/0@0", "commit t/0@0[first=0]: refused", "commit t/0@0[first=0]"}, s.list())
	})

	t.Run("a commit refused as fenced is dropped, not retried in the ended generation", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.group.answer(refuse(fmt.Errorf("coordinator: %w", kafkaclient.ErrFenced)))
		s.batch(r0, 5, "")
		s.flush()
		s.flush()
		s.batch(r1, 2, "")
		s.flush()
		require.Equal(t, []string{"stored t/0@5", "commit t/0@5: refused", "stored t/1@2", "commit t/1@2"}, s.list())
	})

	t.Run("a commit that failed otherwise is retried, with a newer mark when one came", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.group.answer(refuse(errors.New("coordinator not available")), refuse(errors.New("coordinator not available")))
		s.batch(r0, 5, "")
		s.batch(r1, 2, "")
		s.flush()
		s.flush()
		s.batch(r0, 6, "")
		s.flush()
		require.Equal(t, []string{
			"stored t/0@5", "stored t/1@2",
			"commit t/0@5 t/1@2: refused", "commit t/0@5 t/1@2: refused",
			"stored t/0@6",
			"commit t/0@6 t/1@2",
		}, s.list())
	})

	t.Run("partitions of a topic the broker no longer knows are not retried", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.group.answer(refuse(kafkaclient.AddGone(nil, part(0), errors.New("unknown topic id"))))
		s.batch(r0, 5, "")
		s.batch(r1, 2, "")
		s.flush()
		s.flush()
		require.Equal(t, []string{"stored t/0@5", "stored t/1@2", "commit t/0@5 t/1@2: refused", "commit t/1@2"}, s.list())
	})

	t.Run("a release with commit commits the runs' pending marks once, and nothing of theirs after", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.group.answer(refuse(errors.New("coordinator not available")))
		s.batch(r0, 5, "")
		s.batch(r1, 2, "")
		s.c.release(context.Background(), []*partitionRun{r0, r1}, true) // refused: not retried
		s.batch(r0, 6, "")                                               // a worker that marks after its release
		s.flush()
		require.Equal(t, []string{"stored t/0@5", "stored t/1@2", "commit t/0@5 t/1@2: refused", "stored t/0@6"}, s.list())
	})

	t.Run("a release without commit drops the runs' marks and leaves the others'", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r0, r1 := s.run(0), s.run(1)
		s.batch(r0, 5, "")
		s.batch(r1, 2, "")
		s.c.release(context.Background(), []*partitionRun{r0}, false)
		s.flush()
		require.Equal(t, []string{"stored t/0@5", "stored t/1@2", "commit t/1@2"}, s.list())
	})

	t.Run("a release waits for the commit in flight, so that none of its partitions' lands after it", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		r := s.run(0)
		s.group.answer(func(context.Context) error {
			s.add("commit in flight")
			s.lingerUntil("released")
			return nil
		})
		s.batch(r, 5, "")
		flushed := make(chan struct{})
		go func() { defer close(flushed); s.flush() }()
		s.requireEvent(t, "commit in flight")
		s.c.release(context.Background(), []*partitionRun{r}, true)
		s.add("released")
		<-flushed
		require.Equal(t, []string{"stored t/0@5", "commit in flight", "commit t/0@5", "released"}, s.list())
	})

	t.Run("its loop commits marks as they come, until its context ends", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { defer close(ran); s.c.run(ctx) }()
		r := s.run(0)
		s.batch(r, 5, "")
		s.requireEvent(t, "commit t/0@5")
		s.batch(r, 6, "")
		s.requireEvent(t, "commit t/0@6")
		cancel()
		<-ran
	})

	t.Run("the Committed hooks hear of every commit, in order of partition, and its answer", func(t *testing.T) {
		t.Parallel()
		s := newCommitterSetup(t)
		s.c.hooks = append(s.c.hooks, func(_ context.Context, offs []kafkaoncetype.TopicPartitionOffset, err error) {
			s.add("hook %v %v", offs, err)
		})
		r0, r1 := s.run(0), s.run(1)
		s.group.answer(refuse(errors.New("coordinator not available")))
		s.batch(r1, 2, "")
		s.batch(r0, 5, "")
		s.flush()
		s.flush()
		require.Equal(t, []string{
			"stored t/1@2", "stored t/0@5",
			"commit t/0@5 t/1@2: refused", "hook [{t 0 5} {t 1 2}] coordinator not available",
			"commit t/0@5 t/1@2", "hook [{t 0 5} {t 1 2}] <nil>",
		}, s.list())
	})
}
