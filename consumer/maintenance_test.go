package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/idempotency"
)

func TestBackgroundPruningKeepsRewindsSafe(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	ids := e.produceIDs("p", 40)
	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 20, 1: 20}, 30*time.Second)
	r.stop()
	// Age three quarters of the claims past the retention window.
	e.db.Exec(t, `UPDATE `+e.db.Table("processed_messages")+` SET processed_at = now() - interval '8 days' WHERE kafka_offset < 15`)

	// And an HTTP API's idempotency keys: one expired, one live.
	for _, k := range []struct{ key, expires string }{{"expired", "now() - interval '1 minute'"}, {"live", "now() + interval '1 day'"}} {
		e.db.Exec(t, `INSERT INTO `+e.db.Table("idempotency_keys")+` (scope, idem_key, method, route, fingerprint, status, headers, body, expires_at)
			VALUES ('', $1, 'POST', '/', '\x00', 201, '', '', `+k.expires+`)`, k.key)
	}

	expired := func() int64 {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("idempotency_keys")+` WHERE idem_key = 'expired'`)
	}
	cfg := e.config(e.applyHandler())
	cfg.Prune.Interval = time.Hour // the first pass runs at start
	r = e.start(cfg)
	waitFor(t, 30*time.Second, "the old claims pruned", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")) == 10
	})
	r.stop()
	require.EqualValues(t, 1, expired(), "keys are pruned only by a consumer given their Pruner")

	keys, err := idempotency.NewStore(e.db.Schema)
	require.NoError(t, err)
	cfg.Pruners = []consumer.Pruner{keys.Pruner()}
	r = e.start(cfg)
	waitFor(t, 30*time.Second, "the expired key pruned", func() bool { return expired() == 0 })
	r.stop()
	require.EqualValues(t, 1, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("idempotency_keys")+` WHERE idem_key = 'live'`), "a live key is kept")

	// Rewind and replay everything: the stored positions keep the pruned
	// messages from being applied again.
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0, 1: 0})
	more := e.produceIDs("q", 4)
	r = e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 22, 1: 22}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(append(ids, more...))
}

func TestOperatorRequestedRedriveIsPerformedByTheRunningConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("o", 3)
	var fixed atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "o-1" && !fixed.Load() {
			return consumer.Permanent(errors.New("not yet"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	letters, _ := deadletter.NewStore(e.db.Schema)
	id := e.letters()["o-1"].ID
	ctx := context.Background()

	// Requested while still broken: the failure is recorded, the request
	// withdrawn, the letter stays.
	n, err := letters.RequestRedrive(ctx, e.db.Pool, e.name, []int64{id})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	waitFor(t, 30*time.Second, "the failed redrive recorded", func() bool { return e.letters()["o-1"].RedriveError != "" })
	l := e.letters()["o-1"]
	require.Contains(t, l.RedriveError, "not yet")
	require.Nil(t, l.RedriveRequestedAt)
	require.Nil(t, l.RedrivenAt)

	fixed.Store(true)
	_, err = letters.RequestRedrive(ctx, e.db.Pool, e.name, []int64{id})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the redrive", func() bool { return e.letters()["o-1"].RedrivenAt != nil })
	r.stop()
	e.requireExactlyOnce([]string{"o-0", "o-1", "o-2"})
}

// A handler that hangs in a redrive the running consumer performs for an
// operator is cut off as in a batch: shutdown does not wait for it, and
// later redrives are not held up behind it.
func TestAHungHandlerInARequestedRedriveDoesNotHoldUpTheConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("o", 3)
	var redriving atomic.Int32
	hung := make(chan struct{}, 8)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // let the abandoned handlers end before the leak check
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID != "o-1" {
			return e.applyHandler().Handle(ctx, tx, m)
		}
		switch redriving.Load() {
		case 0:
			return consumer.Permanent(errors.New("not yet"))
		case 1:
			hung <- struct{}{}
			<-release // ignores its context
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.HandlerTimeout = time.Hour // only the shutdown can cut it off
	cfg.IdleInTransactionTimeout = consumer.LeaveUnset
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	letters, _ := deadletter.NewStore(e.db.Schema)
	id := e.letters()["o-1"].ID
	ctx := context.Background()

	redriving.Store(1)
	_, err := letters.RequestRedrive(ctx, e.db.Pool, e.name, []int64{id})
	require.NoError(t, err)
	<-hung
	began := time.Now()
	r.stop()
	require.Less(t, time.Since(began), 10*time.Second, "Run returns soon after cancel, a hung redrive or not")
	require.Nil(t, e.letters()["o-1"].RedrivenAt)

	// A consumer with a timeout cuts the hung redrive off, records the
	// failure, and redrives once the handler is fixed.
	cfg.HandlerTimeout = 200 * time.Millisecond
	r = e.start(cfg)
	_, err = letters.RequestRedrive(ctx, e.db.Pool, e.name, []int64{id})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the hung redrive recorded as failed", func() bool {
		return strings.Contains(e.letters()["o-1"].RedriveError, "HandlerTimeout")
	})
	redriving.Store(2)
	_, err = letters.RequestRedrive(ctx, e.db.Pool, e.name, []int64{id})
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the redrive", func() bool { return e.letters()["o-1"].RedrivenAt != nil })
	r.stop()
	e.requireExactlyOnce([]string{"o-0", "o-1", "o-2"})
}
