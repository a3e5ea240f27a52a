package outbox_test

// Interleavings of relays, receivers and writers. Each test says what
// it checks and the interleaving it drives.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func newRelay(t *testing.T, db *testenv.DB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	cfg.Schema = db.Schema
	cfg.Logger = quiet
	cfg.KafkaClient = kafkaClient()
	r, err := outbox.NewRelay(db.Pool, &cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// Covers per-key order on the Deliver path. A NULL key and an
// empty one are the same key to the relay, but Write put them in
// different buckets (nil in bucket 0, []byte{} in fnv("")%64 = 5), so two
// relays could take them at once: relay 1 delivering A (NULL key), relay
// 2 delivering B (empty key, written after A), and A then failing. Both
// are now in bucket 0: relay 2 finds the bucket locked, and once A waits,
// B is held behind it.
func TestANullAndAnEmptyKeyAreOneKeyAcrossTwoRelays(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	require.Equal(t, outbox.BucketOf(nil), outbox.BucketOf([]byte{}), "no key, nil or empty, is one bucket")

	aStarted, releaseA := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var deliveredOrder []string
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		if string(d.Value) == "A" {
			close(aStarted)
			<-releaseA
			return errors.New("receiver down for A")
		}
		mu.Lock()
		deliveredOrder = append(deliveredOrder, string(d.Value))
		mu.Unlock()
		return nil
	}
	write(t, db, outbox.Message{Destination: "api", Key: nil, Value: []byte("A")})
	write(t, db, outbox.Message{Destination: "api", Key: []byte{}, Value: []byte("B")})

	cfg := outbox.RelayConfig{Deliver: deliver, RetryInitialInterval: time.Hour, RetryMaxInterval: time.Hour}
	r1, r2 := newRelay(t, db, cfg), newRelay(t, db, cfg)
	ctx := context.Background()
	done1 := make(chan error, 1)
	go func() { _, err := r1.Round(ctx); done1 <- err }()
	<-aStarted
	// Relay 1 holds A's bucket and is delivering A, B with it. Relay 2's
	// round, meanwhile.
	n, err := r2.Round(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "relay 2 took nothing: the key's bucket is relay 1's")
	close(releaseA)
	require.NoError(t, <-done1)
	n, err = r2.Round(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "B waits behind A")

	waitingA := db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE message_key IS NULL AND attempts = 1 AND failed_at IS NULL`)
	require.EqualValues(t, 1, waitingA, "A failed once and waits for its retry")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, deliveredOrder, "B (empty key, the same key as A's NULL key) was delivered while A, written before it, failed")
}

// Covers P1 ("rows written for a waiting key after it began
// waiting never overtake it") and P2 (per-key order), where a row is written when the
// transaction writing it commits (Write: "They are delivered once tx
// commits").
//
// Interleaving: a user transaction T1 writes X for key k and stays open
// (X takes seq s). Another transaction writes W for key k and commits (seq
// s+1). A relay round sees only W, delivers it, W fails and begins waiting
// (retry in an hour). Then T1 commits X, after W began waiting. The next
// round compared seqs: X's seq is lower than W's, so W did not hold X back,
// and X reached the receiver while W waited. A waiting row now holds back
// every other row of its key, whatever its seq.
func TestARowCommittedAfterItsKeyBeganWaitingWaitsToo(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	o, err := outbox.New(db.Schema)
	require.NoError(t, err)

	var mu sync.Mutex
	var attempts []string
	var delivered []string
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		attempts = append(attempts, string(d.Value))
		if string(d.Value) == "W" && d.Attempt == 1 {
			return outbox.RetryAfter(errors.New("HTTP 429"), time.Hour)
		}
		delivered = append(delivered, string(d.Value))
		return nil
	}

	t1, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = t1.Rollback(ctx) }()
	_, err = o.Write(ctx, t1, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("X")})
	require.NoError(t, err)
	write(t, db, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("W")})

	r := newRelay(t, db, outbox.RelayConfig{Deliver: deliver, RetryInitialInterval: time.Hour, RetryMaxInterval: time.Hour})
	n, err := r.Round(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the round sees only W")
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE attempts = 1 AND next_attempt_at > now()`), "W waits")

	require.NoError(t, t1.Commit(ctx)) // X committed after W began waiting
	_, err = r.Round(ctx)
	require.NoError(t, err)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("attempts %v, delivered %v", attempts, delivered)
	require.Empty(t, delivered, "X, committed after key k's W began waiting, overtook W")
}

// Covers P1 (a failing key holds back only its own rows) and P4
// ("never marked parked without the reason": the reason recorded must be
// the row's own).
//
// Interleaving: one Kafka round takes a row of key "bad" for a topic that
// does not exist and a row of key "good" for a healthy topic. They go in one
// WriteMessages call (different keys, different topics are allowed in one
// call); kafka-go looks up every topic's partitions before sending anything
// and fails the whole call with the missing topic's error, which the relay
// applied to every row of the call: "good" was parked with the other
// topic's "Unknown Topic Or Partition". A call that fails as a whole is now
// sent again one topic at a time.
func TestAMissingTopicFailsOnlyItsOwnRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := ownKafka(t)
	topic := k.Topic(t, 1)
	write(t, db,
		outbox.Message{Destination: "no-such-topic-" + strings.ToLower(t.Name()), Key: []byte("bad"), Value: []byte("bad-0")},
		outbox.Message{Destination: topic, Key: []byte("good"), Value: []byte("good-0")})
	r := newRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers, MaxAttempts: 1, DeliveryTimeout: 5 * time.Second})
	_, err := r.Round(context.Background())
	require.NoError(t, err)

	var lastErr string
	var attempts int
	var failed bool
	err = db.Pool.QueryRow(context.Background(), `SELECT coalesce(last_error, ''), attempts, failed_at IS NOT NULL FROM `+db.Table("outbox")+
		` WHERE message_key = 'good'`).Scan(&lastErr, &attempts, &failed)
	if !errors.Is(err, pgx.ErrNoRows) {
		require.NoError(t, err)
		t.Fatalf("key good's row, for a healthy topic, was not published: attempts %d, parked %v, last_error %q", attempts, failed, lastErr)
	}
	got := readAll(t, k.Brokers, topic, 1)
	require.Equal(t, "good-0", string(got[0].Value))
}

// A Deliver that returns success only after DeliveryTimeout
// and its grace, after the round recorded a failure and committed, changes
// nothing: the row is not deleted by the late success, OnDelivered does not
// fire for it, and it is retried (then delivered).
func TestALateSuccessAfterAbandonmentTouchesNothing(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	release, returned := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	calls := 0
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			<-release // ignores its context
			close(returned)
			return nil
		}
		return nil
	}
	var onDelivered []string
	write(t, db, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("v")})
	r := newRelay(t, db, outbox.RelayConfig{Deliver: deliver, DeliveryTimeout: 50 * time.Millisecond,
		RetryInitialInterval: time.Hour, RetryMaxInterval: time.Hour,
		OnDelivered: func(id string, _ time.Time) { onDelivered = append(onDelivered, id) }})
	_, err := r.Round(ctx)
	require.NoError(t, err)
	require.Empty(t, onDelivered)
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE attempts = 1 AND failed_at IS NULL AND last_error LIKE '%abandoned%'`))
	close(release)
	<-returned
	require.EqualValues(t, 1, pending(t, db), "the late success deleted nothing")
	db.Exec(t, `UPDATE `+db.Table("outbox")+` SET next_attempt_at = now()`)
	_, err = r.Round(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 0, pending(t, db))
	require.Len(t, onDelivered, 1)
}

// A key whose head row is parked while a later row of it waits:
// the parked head does not hold the key, the waiting row holds the rows
// after it, and once it is due the rest flow in order.
func TestParkedHeadThenWaitingRow(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	var mu sync.Mutex
	var delivered []string
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case string(d.Value) == "p":
			return outbox.Permanent(errors.New("rejected"))
		case string(d.Value) == "w" && d.Attempt == 1:
			return errors.New("try later")
		}
		delivered = append(delivered, string(d.Value))
		return nil
	}
	write(t, db, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("p")},
		outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("w")},
		outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("after")})
	r := newRelay(t, db, outbox.RelayConfig{Deliver: deliver, RetryInitialInterval: time.Hour, RetryMaxInterval: time.Hour})
	_, err := r.Round(ctx)
	require.NoError(t, err)
	// p parked; w, then not attempted in the same round (held).
	_, err = r.Round(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE failed_at IS NOT NULL AND last_error <> ''`))
	write(t, db, outbox.Message{Destination: "api", Key: []byte("k"), Value: []byte("later")})
	_, err = r.Round(ctx)
	require.NoError(t, err)
	mu.Lock()
	require.Empty(t, delivered, "w waits; after and later are held behind it")
	mu.Unlock()
	db.Exec(t, `UPDATE `+db.Table("outbox")+` SET next_attempt_at = now() WHERE failed_at IS NULL AND attempts > 0`)
	_, err = r.Round(ctx)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"w", "after", "later"}, delivered)
}
