package consumer_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// recordedRow is a consumer's row of the consumers table, as a tool reads it.
type recordedRow struct {
	rule, group       string
	topics, brokers   []string
	tls               bool
	sasl              *string
	recordedAtWasNull bool
}

func (e *env) recordedRow() recordedRow {
	e.t.Helper()
	var r recordedRow
	var rule, group *string
	var at *time.Time
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `SELECT message_id_rule, group_id, topics, brokers, coalesce(kafka_tls, false), kafka_sasl, settings_recorded_at
FROM `+e.db.Table("consumers")+` WHERE name = $1`, e.name).Scan(&rule, &group, &r.topics, &r.brokers, &r.tls, &r.sasl, &at))
	if rule != nil {
		r.rule = *rule
	}
	if group != nil {
		r.group = *group
	}
	r.recordedAtWasNull = at == nil
	return r
}

// produceJSON writes n messages whose id is the JSON field event_id, and
// no message-id header.
func (e *env) produceJSON(prefix string, n int) []string {
	ids := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range n {
		ids[i] = prefix + "-" + strconv.Itoa(i)
		v, _ := json.Marshal(map[string]any{"event_id": ids[i], "points": i})
		msgs[i] = kafka.Message{Partition: i % e.parts, Key: []byte(ids[i]), Value: v}
	}
	e.kafka.Produce(e.t, e.topic, msgs...)
	return ids
}

// A consumer records, when it starts, what kafkaonce's tools would
// otherwise be told: its id rule, group, topics and brokers. A later start
// replaces the record, and a function of its own is recorded as custom.
func TestRunRecordsTheConsumersSettings(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	ids := e.produceJSON("j", 6)
	cfg := e.config(e.applyHandler())
	cfg.MessageID = consumer.IDFromJSONField("event_id")
	r := e.start(cfg)
	e.waitEffects(len(ids), 30*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)

	got := e.recordedRow()
	require.Equal(t, recordedRow{rule: "json:event_id", group: e.group, topics: []string{e.topic}, brokers: e.kafka.Brokers}, got)

	custom := e.config(e.applyHandler())
	custom.MessageID = consumer.MessageIDFunc(func(m *consumer.Message) (string, error) { return string(m.Key), nil })
	r = e.start(custom)
	waitFor(t, 30*time.Second, "the custom rule recorded", func() bool { return e.recordedRow().rule == "custom" })
	r.stop()
	got = e.recordedRow()
	require.Equal(t, "custom", got.rule)
	require.Equal(t, e.group, got.group)
}

// The record only serves the tools: when it cannot be written (here a
// row lock held by another transaction), the consumer says so in its log
// and consumes all the same.
func TestAFailedRecordDoesNotStopTheConsumer(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	hold := e.holdConsumerRow(t)

	var logs syncBuffer
	cfg := e.config(e.applyHandler())
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ids := e.produceIDs("h", 5)
	r := e.start(cfg)
	e.waitEffects(len(ids), 30*time.Second)
	// Recorded once the member joined, in the background, waiting a
	// second at most for the lock.
	waitFor(t, 10*time.Second, "the failed record logged", func() bool { return strings.Contains(logs.String(), "could not record the consumer's settings") })
	r.stop()
	e.requireExactlyOnce(ids)
	require.Contains(t, logs.String(), "lock timeout")
	require.True(t, e.recordedRow().recordedAtWasNull, "nothing recorded while the row was locked")

	require.NoError(t, hold.Rollback(ctx))
	r = e.start(cfg)
	waitFor(t, 30*time.Second, "the settings recorded", func() bool { return !e.recordedRow().recordedAtWasNull })
	r.stop()
	require.Equal(t, "header:message-id", e.recordedRow().rule)
}

// holdConsumerRow locks the consumer's row of the consumers table, as an
// operator's open transaction would, until the returned transaction ends
// (rolled back when the test ends at the latest).
func (e *env) holdConsumerRow(t *testing.T) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	e.db.Exec(t, `SELECT `+e.db.Table("consumer_id")+`($1)`, e.name)
	hold, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) })
	_, err = hold.Exec(ctx, `SELECT 1 FROM `+e.db.Table("consumers")+` WHERE name = $1 FOR UPDATE`, e.name)
	require.NoError(t, err)
	return hold
}

// Migration 015 promises "a record is the last start's: workers of one name
// started with different settings (a rolling change) leave the last one's".
// The background retry added for a failed record breaks it: a worker whose
// record failed at start writes its settings whenever the retry succeeds,
// over the record of a worker that started after it.
//
// Interleaving: worker A starts in group gA while an operator's
// transaction holds the consumers row; its record fails after the 1s lock
// wait; its first retry, 2s later, waits and fails too; the next is due 4s
// after that. The operator's transaction ends. Worker B (the rolling
// change's new version, group gB) starts and records gB. A's next retry
// then writes gA over it. Both keep running; the row names
// gA, the older start's group, with a settings_recorded_at later than B's
// start, so replay and status plan for gA (and replay, seeing gB's member
// as no member of "its" group, would not refuse to rewind while B runs).
func TestALateRetryOverwritesTheRecordOfALaterStart(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	hold := e.holdConsumerRow(t)

	gA, gB := e.group+"_a", e.group+"_b"
	var logsA syncBuffer
	a := e.config(e.applyHandler())
	a.GroupID = gA
	a.Logger = slog.New(slog.NewTextHandler(&logsA, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e.start(a)
	waitFor(t, 15*time.Second, "worker A's record failing", func() bool {
		return strings.Contains(logsA.String(), "could not record the consumer's settings")
	})
	// Its first retry (2s later) waits on the row too, and fails; the next
	// comes 4s after that. The operator's transaction ends in between.
	waiting := func() bool {
		return e.db.LockWaits(t, "consumers") > 0
	}
	waitFor(t, 15*time.Second, "worker A's retry waiting on the row", waiting)
	waitFor(t, 15*time.Second, "worker A's retry giving up", func() bool { return !waiting() })
	require.NoError(t, hold.Rollback(ctx)) // the operator's transaction ends

	b := e.config(e.applyHandler())
	b.GroupID = gB
	e.start(b)
	waitFor(t, 15*time.Second, "worker B's record", func() bool { return e.recordedRow().group == gB })
	bRecordedAt := time.Now()

	// A's next retry comes 4s after the last; give it 8s.
	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		if g := e.recordedRow().group; g != gB {
			t.Fatalf("the record names group %q %v after worker B (group %q) started and recorded: "+
				"worker A, started earlier, overwrote the later start's record with its own settings; the tools now plan for the wrong group",
				g, time.Since(bRecordedAt).Round(100*time.Millisecond), gB)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The settings are recorded once a member has joined its group: a worker
// that never does (brokers it cannot reach, a listener of another
// protocol, refused credentials) leaves the record of the one that did,
// which the tools go on reading.
func TestAWorkerThatNeverJoinsLeavesTheRecord(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("g", 3)
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids), 30*time.Second)
	r.stop()
	good := e.recordedRow()
	require.Equal(t, e.group, good.group)

	bad := e.config(e.applyHandler())
	bad.Brokers, bad.GroupID = []string{"127.0.0.1:1"}, e.group+"-misconfigured"
	c, err := consumer.New(e.db.Pool, bad)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 10*time.Second, "the misconfigured worker running", func() bool { return c.Health(ctx).Running })
	stillFor(t, 2*time.Second, "the record of the worker that joined kept", func() bool {
		got := e.recordedRow()
		return got.group == good.group && strings.Join(got.brokers, ",") == strings.Join(good.brokers, ",")
	})
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
	require.Equal(t, good, e.recordedRow())
}
