package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// shareMember runs a share group member of w's consumer until stop is
// called; calls counts its handler's calls.
func (w *world) shareMember(calls *atomic.Int64) (stop func()) {
	w.t.Helper()
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, GroupType: consumer.ShareGroup, KafkaClient: consumer.FranzGo,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.Add(1)
			_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
			return err
		})})
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return func() { cancel(); require.NoError(w.t, <-done) }
}

// waitFor waits until cond holds, or fails the test after 30 s.
func (w *world) waitFor(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.True(w.t, time.Now().Before(deadline), "waiting for %s", what)
		time.Sleep(50 * time.Millisecond)
	}
}

// A replay of a share group resets its start offset, once its members
// are gone: every record is delivered again, and the claims decide, so
// nothing is applied twice.
func TestReplayOfAShareGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	testenv.RequireShareGroups(t, w.kafka.Brokers)
	admin := testenv.Admin(t, w.kafka.Brokers)
	ctx := testenv.Context(t, time.Minute)
	require.NoError(t, admin.SetShareStart(ctx, w.name, "earliest"))
	w.produce(6, "s")
	effects := func() int64 { return w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")) }
	shareOffsets := func() map[int]kafkaadmin.SharePartition {
		starts, err := admin.ShareOffsets(ctx, w.name, w.topic)
		require.NoError(t, err)
		return starts
	}
	// Settled: no share lag left on either partition. (Kafka persists a
	// share-partition's start offset with the acknowledgement after the
	// one that moves it, so the start it reports can trail the records
	// settled; the lag counts them.)
	settled := func() bool {
		starts := shareOffsets()
		return len(starts) == 2 && starts[0].Lag == 0 && starts[1].Lag == 0
	}

	var calls atomic.Int64
	stop := w.shareMember(&calls)
	w.waitFor("6 effects", func() bool { return effects() == 6 })
	w.waitFor("every record settled", settled)
	before := shareOffsets()

	// Refused while the group has a member, which it names.
	out, errOut, code := w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--yes")
	require.Equal(t, 2, code, out)
	require.Contains(t, out, "share group "+w.name)
	require.Contains(t, out, "START OFFSET")
	require.Contains(t, errOut, "share group "+w.name+" has 1 member(s): member ")
	stop()

	// One record's last delivery died (its effect and claim never
	// committed): only its provisional letter is left, and a replay
	// applies it.
	p, off := w.positionOf("s2")
	w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 's2'`)
	w.db.Exec(t, `DELETE FROM `+w.db.Table("effects")+` WHERE message_id = 's2'`)
	w.leaveProvisionalLetter(p, off, "s2")

	out, errOut, code = w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--dry-run", "--json")
	require.Equal(t, 0, code, errOut)
	var plan replayPlan
	require.NoError(t, json.Unmarshal([]byte(out), &plan))
	require.Equal(t, "share", plan.GroupType)
	require.False(t, plan.Executed)
	var claimed, fresh int64
	for _, p := range plan.Partitions {
		claimed += p.SkippedByClaim
		fresh += p.New
	}
	require.EqualValues(t, 5, claimed)
	require.EqualValues(t, 1, fresh, "the record with only a provisional letter is applied")
	require.Equal(t, before, shareOffsets(), "a dry run changes nothing")

	out, errOut, code = w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--to", "earliest", "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "5 messages will be read again and skipped")
	require.Contains(t, out, "share group "+w.name+" rewound")
	for p, sp := range shareOffsets() {
		require.Zerof(t, sp.Start, "partition %d rewound to its start", p)
	}

	// Every record is delivered again (the start offsets pass them) and
	// found claimed: only the new ones reach the handler.
	w.produce(2, "t")
	calls.Store(0)
	stop = w.shareMember(&calls)
	w.waitFor("8 effects", func() bool { return effects() == 8 })
	w.waitFor("every record settled again", settled)
	stop()
	require.EqualValues(t, 3, calls.Load(), "the two new records, and the one whose last delivery died")
	w.requireEffectsOnce(8)
}
