package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// A share transaction whose COMMIT the server refuses (a deferred unique
// constraint two records break together) accepts nothing it held: its
// records run one per transaction, the one whose COMMIT is refused is set
// aside and rejected, and every other is applied once.
func TestShareGroupCommitRefusedSetsAsideItsRecordOnly(t *testing.T) {
	e := setupShare(t, shareOptions{})
	refs := e.db.Table("refs")
	e.db.Exec(t, `CREATE TABLE `+refs+` (ref text, CONSTRAINT refs_unique UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED)`)
	ids := e.produceIDs("d", 6)
	apply := e.applyHandler()
	cfg := e.shareConfig(false, nil)
	cfg.MaxBatch = 10
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		ref := "ref-" + m.ID
		if m.ID == ids[3] {
			ref = "ref-" + ids[1] // broken only at COMMIT
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+refs+` (ref) VALUES ($1)`, ref); err != nil {
			return err
		}
		return apply.Handle(ctx, tx, m)
	})
	e.start(cfg)
	waitFor(t, 30*time.Second, "the record whose COMMIT was refused set aside", func() bool { _, ok := e.letters()[ids[3]]; return ok })
	e.waitEffects(len(ids)-1, 30*time.Second)
	stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)-1) })
	require.Contains(t, e.letters()[ids[3]].Error, "refs_unique")
	require.EqualValues(t, len(ids)-1, e.db.Int(t, `SELECT count(*) FROM `+refs), "one reference per record applied")
}

// A handler that hangs, ignoring its context, is cut off at
// HandlerTimeout and abandoned with its transaction: the record is not
// accepted, it is retried and set aside after MaxAttempts, while the
// records beside it are applied once, and the abandoned calls' effects
// never commit.
func TestShareGroupHungHandlerIsCutOff(t *testing.T) {
	e := setupShare(t, shareOptions{})
	ids := e.produceIDs("h", 4)
	hung := ids[2]
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var hangs atomic.Int64
	cfg := e.shareConfig(false, func(m *consumer.Message) error {
		if m.ID == hung {
			hangs.Add(1)
			<-release // ignores its context
			return errors.New("released after the test")
		}
		return nil
	})
	cfg.HandlerTimeout = 300 * time.Millisecond
	cfg.Retry.MaxAttempts = 2
	e.start(cfg)
	waitFor(t, 30*time.Second, "the hung record set aside", func() bool { _, ok := e.letters()[hung]; return ok })
	e.waitEffects(len(ids)-1, 30*time.Second)
	l := e.letters()[hung]
	require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
	require.Contains(t, l.Error, consumer.ErrHandlerTimeout.Error())
	require.EqualValues(t, 2, hangs.Load(), "one call per attempt")
	stillFor(t, shareLock, "no effect applied twice, none of the hung calls'", func() bool { return e.effects() == int64(len(ids)-1) })
}
