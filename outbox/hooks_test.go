package outbox_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// recorder keeps what a relay's hooks were told.
type recorder struct {
	mu        sync.Mutex
	delivered []outbox.Delivered
	failed    []outbox.DeliveryFailed
	backlogs  []outbox.Backlog
}

func (r *recorder) OnDelivered(_ context.Context, d outbox.Delivered) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delivered = append(r.delivered, d)
}

func (r *recorder) OnDeliveryFailed(_ context.Context, f outbox.DeliveryFailed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, f)
}

func (r *recorder) OnBacklog(_ context.Context, b outbox.Backlog) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.backlogs = append(r.backlogs, b)
}

func (r *recorder) snapshot() (d []outbox.Delivered, f []outbox.DeliveryFailed, last outbox.Backlog, reports int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.backlogs) > 0 {
		last = r.backlogs[len(r.backlogs)-1]
	}
	return append([]outbox.Delivered(nil), r.delivered...), append([]outbox.DeliveryFailed(nil), r.failed...), last, len(r.backlogs)
}

// Rows published to Kafka are reported delivered, with their latency from
// created_at, and the backlog falls to nothing once they are gone.
func TestHooksSeeDeliveriesToKafkaAndTheBacklogDrain(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("k" + strconv.Itoa(i)), Value: []byte("v")})
	}
	write(t, db, msgs...)
	// The rows wait a little before the relay starts: their latency
	// counts it.
	time.Sleep(100 * time.Millisecond)
	rec := &recorder{}
	runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers, Hooks: []outbox.Hook{rec}, BacklogInterval: 20 * time.Millisecond})
	var delivered []outbox.Delivered
	var last outbox.Backlog
	var reports int
	waitFor(t, func() bool {
		delivered, _, last, reports = rec.snapshot()
		return len(delivered) == 5 && reports > 1 && last.Pending == 0
	}, "5 deliveries and a backlog of 0")
	for _, d := range delivered {
		require.Equal(t, topic, d.Destination)
		require.Equal(t, 1, d.Attempts)
		require.GreaterOrEqual(t, d.Latency, 100*time.Millisecond)
		require.Less(t, d.Latency, time.Minute)
	}
	require.Equal(t, outbox.Backlog{}, last)
	_, failed, _, _ := rec.snapshot()
	require.Empty(t, failed)
}

// A delivery that keeps failing is reported at every attempt, with when
// it is retried, then parked; the backlog counts it parked.
func TestHooksSeeFailedAttemptsThenTheRowParked(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	write(t, db, outbox.Message{Destination: "partner", Key: []byte("a"), Value: []byte("v")})
	rec := &recorder{}
	runRelay(t, db, outbox.RelayConfig{
		Deliver:     func(context.Context, *outbox.Delivery) error { return errors.New("partner down") },
		MaxAttempts: 3, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond,
		Hooks: []outbox.Hook{rec}, BacklogInterval: 20 * time.Millisecond,
	})
	var failed []outbox.DeliveryFailed
	var last outbox.Backlog
	waitFor(t, func() bool {
		_, failed, last, _ = rec.snapshot()
		return len(failed) == 3 && last.Parked == 1 && last.Pending == 0
	}, "3 failed attempts and the row parked")
	for i, f := range failed {
		require.Equal(t, "partner", f.Destination)
		require.Equal(t, outbox.FailureOther, f.Class)
		require.EqualError(t, f.Err, "partner down")
		require.Equal(t, i+1, f.Attempts)
		require.Equal(t, i == 2, f.Parked, "attempt %d", i+1)
		require.Equal(t, i == 2, f.NextAttempt.IsZero(), "attempt %d", i+1)
	}
	require.Equal(t, outbox.Backlog{Parked: 1}, last)
}

// Each failure has a class fit for a label: the receiver's answer, a
// timeout, a panic.
func TestHooksClassifyFailures(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	write(t, db,
		outbox.Message{Destination: "rejects", Key: []byte("1")},
		outbox.Message{Destination: "busy", Key: []byte("2")},
		outbox.Message{Destination: "hangs", Key: []byte("3")},
		outbox.Message{Destination: "panics", Key: []byte("4")})
	rec := &recorder{}
	runRelay(t, db, outbox.RelayConfig{
		Deliver: func(ctx context.Context, d *outbox.Delivery) error {
			switch d.Destination {
			case "rejects":
				return outbox.Permanent(errors.New("HTTP 400"))
			case "busy":
				return outbox.RetryAfter(errors.New("HTTP 429"), time.Hour)
			case "hangs":
				<-ctx.Done()
				return ctx.Err()
			}
			panic("bug")
		},
		DeliveryTimeout: 50 * time.Millisecond, RetryInitialInterval: time.Hour, RetryMaxInterval: time.Hour,
		Hooks: []outbox.Hook{rec},
	})
	byDest := map[string]outbox.DeliveryFailed{}
	waitFor(t, func() bool {
		_, failed, _, _ := rec.snapshot()
		for _, f := range failed {
			byDest[f.Destination] = f
		}
		return len(byDest) == 4
	}, "a failure of each destination")
	require.Equal(t, outbox.FailurePermanent, byDest["rejects"].Class)
	require.True(t, byDest["rejects"].Parked)
	require.Equal(t, outbox.FailureRetryAfter, byDest["busy"].Class)
	require.WithinDuration(t, time.Now().Add(time.Hour), byDest["busy"].NextAttempt, time.Minute)
	require.Equal(t, outbox.FailureTimeout, byDest["hangs"].Class)
	require.Equal(t, outbox.FailurePanic, byDest["panics"].Class)
	require.False(t, byDest["panics"].Parked)
}

// The counts read the table: rows to deliver, those waiting for a retry
// among them, parked ones, and the oldest row's age; a relay counts only
// its own destinations.
func TestBacklogCountsWhatIsLeft(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	o, err := outbox.New(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	b, err := o.Backlog(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, outbox.Backlog{}, b)

	ids := write(t, db,
		outbox.Message{Destination: "a", Key: []byte("1")},
		outbox.Message{Destination: "a", Key: []byte("2")},
		outbox.Message{Destination: "a", Key: []byte("3")},
		outbox.Message{Destination: "b", Key: []byte("4")})
	table := db.Table("outbox")
	db.Exec(t, `UPDATE `+table+` SET created_at = now() - interval '1 hour' WHERE id = '`+ids[1]+`'`)
	db.Exec(t, `UPDATE `+table+` SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE id = '`+ids[2]+`'`)
	db.Exec(t, `UPDATE `+table+` SET attempts = 1, failed_at = now() WHERE id = '`+ids[3]+`'`)
	b, err = o.Backlog(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, int64(3), b.Pending)
	require.Equal(t, int64(1), b.Waiting)
	require.Equal(t, int64(1), b.Parked)
	require.InDelta(t, time.Hour.Seconds(), b.OldestPendingAge.Seconds(), 60)

	// A relay of destination b alone: only its parked row.
	rec := &recorder{}
	runRelay(t, db, outbox.RelayConfig{Deliver: func(context.Context, *outbox.Delivery) error { return nil }, Destinations: []string{"b"},
		Hooks: []outbox.Hook{rec}, BacklogInterval: time.Hour})
	var last outbox.Backlog
	waitFor(t, func() bool {
		_, _, last, n := rec.snapshot()
		return n == 1 && last.Parked == 1
	}, "the backlog reported when Run starts")
	_, _, last, _ = rec.snapshot()
	require.Equal(t, outbox.Backlog{Parked: 1}, last)
}

func TestNewRelayRejectsAHookOfNoRelayInterface(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	_, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, Hooks: []outbox.Hook{&recorder{}, struct{}{}}})
	require.ErrorContains(t, err, "Hooks[1] (struct {}) implements no relay hook interface")
	_, err = outbox.NewRelay(db.Pool, &outbox.RelayConfig{Brokers: []string{"x:1"}, BacklogInterval: -time.Second})
	require.ErrorContains(t, err, "BacklogInterval must be positive")
}
