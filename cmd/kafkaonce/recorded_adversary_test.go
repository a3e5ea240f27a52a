package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// The record is written once per start, with a lock wait of a second, and
// a failure is only logged: docs/operations.md says the tools then "use
// their defaults and say so". They do not: the row still holds the
// previous start's record, and the tools take it as current.
//
// Interleaving: the consumer runs with GroupID g1 and records g1. It is
// redeployed with GroupID g2 while an operator's transaction holds the
// consumers row (the case record.go names: "an operator's open
// transaction"); the record waits 1s, fails, logs a warning, and the
// consumer consumes in g2. The operator's transaction ends. Now
// `kafkaonce replay --consumer X` (no --group) plans for g1, a group with
// no members, so its refusal to run while members are active does not
// fire, although g2's member is consuming; status shows g1's lag. Nothing
// says the record is stale.
func TestAdversaryAFailedRecordLeavesTheOldGroupForTheTools(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	g1, g2 := w.name+"_g1", w.name+"_g2"
	w.produceEvents(4, "a")
	w.consumeWith(func(c *consumer.Config) { c.GroupID = g1 }, 4)

	// An operator's transaction holds the consumer's row while it restarts.
	ctx := context.Background()
	lock, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	var one int
	require.NoError(t, lock.QueryRow(ctx, `SELECT 1 FROM `+w.db.Table("consumers")+` WHERE name = $1 FOR UPDATE`, w.name).Scan(&one))

	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, GroupID: g2, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
			return err
		}),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	w.produceEvents(4, "b")
	deadline := time.Now().Add(30 * time.Second)
	for w.minPosition() < 8 {
		require.True(t, time.Now().Before(deadline), "the consumer in g2 did not consume")
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, lock.Rollback(ctx)) // the operator's transaction ends

	// g2's member is consuming right now. A fix may write the record late
	// (a retry once the row is free): give it a few seconds.
	var plan replayPlan
	for end := time.Now().Add(10 * time.Second); ; {
		out, errOut, code := w.cliBare("replay", "--consumer", w.name, "--dry-run", "--json")
		if code != 0 {
			t.Logf("replay refused (that is fine: it did not take the stale record silently): %s", errOut)
			return
		}
		plan = replayPlan{}
		require.NoError(t, json.Unmarshal([]byte(out), &plan))
		if plan.Group != g1 || time.Now().After(end) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("replay plans for group %s with %d active members", plan.Group, plan.Members)
	require.NotEqual(t, g1, plan.Group, "replay took, without a word, the group of an earlier start from the record, while the consumer runs in %s", g2)
	require.Positive(t, plan.Members, "replay sees no active member, so it would not refuse to rewind while the consumer runs")
}

// settleSchema skips a schema without a consumers table (older than
// migration 007) as one that does not know the consumer, although the
// consumer's positions, claims and dead letters are there. Another schema
// that merely knows the name (a test schema where a test ran a consumer of
// that name, left over by a test binary that was killed) is then "the one
// schema that knows the consumer", picked without a word.
//
// Interleaving: schema A (version 6, not migrated yet) holds consumer X's
// stored positions; schema B (latest) numbers X. `kafkaonce status
// --consumer X` with no --schema reports B's empty state as X's, where
// docs/operations.md promises an error for a consumer known in several
// schemas.
func TestAdversarySchemaDiscoveryIgnoresAConsumerInAnOlderSchema(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	old := testenv.NewEmptyDB(t) // a schema of its own, with nothing in it
	old.Exec(t, `CREATE TABLE `+old.Table("schema_migrations")+` (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`)
	old.Exec(t, `INSERT INTO `+old.Table("schema_migrations")+` (version, name) VALUES (1, 'core'), (2, 'failures'), (3, 'operations'), (4, 'outbox'), (5, 'one_round_trip'), (6, 'expected_duplicates')`)
	old.Exec(t, `CREATE TABLE `+old.Table("consumer_offsets")+` (consumer text NOT NULL, topic text NOT NULL, partition integer NOT NULL, next_offset bigint NOT NULL,
updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, topic, partition))`)
	old.Exec(t, `INSERT INTO `+old.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 1000)`, w.name, w.topic)
	// The latest schema merely knows the name.
	w.db.Exec(t, `SELECT `+w.db.Table("consumer_id")+`($1)`, w.name)

	out, errOut, code := w.cliBare("status", "--consumer", w.name, "--topic", w.topic, "--json")
	if code == 0 {
		var r statusReport
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		t.Fatalf("status picked schema %s by itself, although consumer %s's positions are in schema %s", r.Schema, w.name, old.Schema)
	}
	require.Contains(t, errOut, old.Schema, "the error names the schema that holds the consumer's positions")
}
