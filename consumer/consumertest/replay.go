package consumertest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// ReplayOptions adjusts ReplayTwice.
type ReplayOptions struct {
	// KeepPositions keeps the stored positions for the second run, so the
	// replay is skipped by position, as a plain group rewind is. By
	// default they are removed, so that every message of the second run
	// reaches the claim check: the stricter test of your message ids.
	KeepPositions bool
	// Timeout bounds each run (default 60s).
	Timeout time.Duration
}

// ReplayTwice checks that a handler's effects happen once however often
// the consumer runs it, with your real handler (or batch handler),
// message-id function and tables. It produces msgs to a topic of an
// in-process Kafka broker and runs each message's handler three ways,
// comparing tables (names like "app.accounts") around each:
//
//  1. once per message, through the consumer's own code for calling
//     handlers (see Handle), in a transaction that is rolled back, as an
//     attempt that fails and is retried: any change to tables is a write
//     outside the handler's transaction;
//  2. by a consumer configured by cfg, until every message is applied,
//     skipped or dead-lettered; it fails if none was applied;
//  3. by the same consumer after its group is rewound to the beginning:
//     every message was claimed, so tables must not change.
//
// Build msgs with NewMessage. cfg needs Name, Handler or BatchHandler
// and, unless the defaults suit, MessageID and Schema; ReplayTwice works
// on a copy, sets what concerns its broker, and migrates the schema if
// needed. Each call runs a consumer of its own, so it passes however often
// it runs against one database. What it catches and what it cannot see,
// what it sets, and what it leaves behind are in the package
// documentation, under "What ReplayTwice checks".
func ReplayTwice(tb testing.TB, db consumer.DB, cfg *consumer.Config, msgs []*consumer.Message, tables []string, opts ...ReplayOptions) ReplayResult {
	tb.Helper()
	if cfg == nil {
		tb.Fatalf("consumertest: ReplayTwice needs a *consumer.Config (got nil)")
	}
	run := *cfg // the caller's Config stays as it was
	var o ReplayOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	ctx := context.Background()
	if run.Schema == "" {
		run.Schema = consumer.DefaultSchema
	}
	if _, err := consumer.Migrate(ctx, db, run.Schema); err != nil {
		tb.Fatalf("consumertest: migrate: %v", err)
	}
	idents := make([]string, len(tables))
	for i, t := range tables {
		idents[i] = pgx.Identifier(strings.Split(t, ".")).Sanitize()
	}

	const topic = "replay-twice"
	broker, perPartition := brokerWith(ctx, tb, topic, msgs)
	defer broker.Close()

	rollBackOnce(tb, db, &run, fetch(tb, broker.Brokers, topic, perPartition, o.Timeout), tables, idents)

	if run.Name != "" {
		run.Name = scopedName(run.Name)
		tb.Cleanup(func() { forgetConsumer(tb, db, run.Schema, run.Name) })
	}
	onBroker(tb, &run, broker.Brokers, topic, "replay-twice")

	first := runUntilSettled(tb, db, run, perPartition, o.Timeout, "first run")
	result := ReplayResult{Consumer: run.Name, Applied: int(first.applied.Load()), Skipped: int(first.skipped.Load()), DeadLettered: int(first.deadLettered.Load())}
	if result.Applied == 0 {
		tb.Fatalf("consumertest: the first run applied none of the %d messages (%d dead-lettered, %d skipped as duplicates), so the replay would compare nothing%s; "+
			"fix the handler (invalid_id: cfg.MessageID derives no id), or give msgs distinct ids",
			len(msgs), result.DeadLettered, result.Skipped, whySetAside(db, run.Schema, run.Name))
	}
	before := contents(tb, db, idents)

	admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: broker.Brokers})
	if err != nil {
		tb.Fatalf("consumertest: rewind the group: %v", err)
	}
	defer admin.Close()
	start := map[int]int64{}
	for p := range perPartition { // a partition without messages has nothing to rewind
		start[p] = 0
	}
	if err := admin.CommitOffsets(ctx, run.GroupID, topic, start); err != nil {
		tb.Fatalf("consumertest: rewind the group: %v", err)
	}
	if !o.KeepPositions {
		positions, _ := offsets.NewStore(run.Schema) // Migrate took the name
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			_, err := positions.Forget(ctx, tx, run.Name, topic)
			return err
		})
		if err != nil {
			tb.Fatalf("consumertest: remove the stored positions: %v", err)
		}
	}

	runUntilSettled(tb, db, run, perPartition, o.Timeout, "replay")
	after := contents(tb, db, idents)
	for i, t := range tables {
		if d := diff(before[i], after[i]); d != "" {
			tb.Errorf("consumertest: replaying the topic changed table %s: %s; a message was applied twice. Either the handler writes outside its transaction "+
				"(through the pool, another connection, a service that writes to the database: the write is not undone with the claim, and repeats; write with the tx the handler is given, or Batch.Queue), "+
				"or a message's id is not the same at each delivery (derived from a timestamp, a random value, or a field the producer sets anew on a retry; see Config.MessageID)", t, d)
		}
	}
	return result
}

// onBroker points run at topic on an in-process broker. Every setting
// about reaching Kafka and where to start is the broker's, not the
// program's: a TLS Dialer or StartLatest from a production Config would
// read nothing there. A DeadLetterTopic cfg names is created on it.
func onBroker(tb testing.TB, run *consumer.Config, brokers []string, topic, group string) {
	tb.Helper()
	run.Brokers, run.Topics = brokers, []string{topic}
	run.GroupID = group
	run.Dialer, run.StartOffset = nil, consumer.StartEarliest
	if run.DeadLetterTopic != "" {
		if err := devenv.CreateTopic(context.Background(), brokers, run.DeadLetterTopic, 1); err != nil {
			tb.Fatalf("consumertest: create the dead-letter topic: %v", err)
		}
	}
	run.SessionTimeout, run.HeartbeatInterval = 6*time.Second, 200*time.Millisecond
	if run.Logger == nil {
		run.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// whySetAside says why the consumer's first dead letters were set aside:
// their class and error, for a failure text that stands on its own (the
// schema may be gone by the time anyone reads it).
func whySetAside(db consumer.DB, schemaName, name string) string {
	const shown = 3
	letters, err := deadletter.NewStore(schemaName)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ls []deadletter.Letter
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) (err error) {
		ls, err = letters.List(ctx, tx, deadletter.Filter{Consumer: name, Limit: shown + 1})
		return err
	})
	if err != nil || len(ls) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(": the dead letters say why:")
	for i, l := range ls {
		if i == shown {
			fmt.Fprintf(&b, "; and more (consumer %q in %s.dead_letters, while the schema lasts)", name, schemaName)
			break
		}
		why, _, _ := strings.Cut(l.Error, "\n")
		fmt.Fprintf(&b, " %s: %s;", l.Class, why)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// ReplayResult says what ReplayTwice's consumer did in its first run.
type ReplayResult struct {
	// Consumer is the Name the consumer ran under: cfg.Name, a tilde and
	// a suffix unique to the call. Look for its dead letters under it.
	Consumer string
	// Applied, Skipped and DeadLettered count the messages of the first
	// run by how they settled: applied, skipped as duplicates (copies of
	// one id among msgs), or set aside.
	Applied, Skipped, DeadLettered int
}

// scopedName is name with a suffix unique to this call.
func scopedName(name string) string { return scopedNameWith(name, "~replay-") }

// scopedNameWith is name, then tag, then a random suffix, cut to fit
// consumer.MaxNameLen.
func scopedNameWith(name, tag string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := tag + hex.EncodeToString(b[:])
	if len(name)+len(suffix) > consumer.MaxNameLen {
		name = strings.ToValidUTF8(name[:consumer.MaxNameLen-len(suffix)], "")
	}
	return name + suffix
}

// forgetConsumer deletes what the consumer named name left in the schema,
// unless the test failed: its rows in kafkaonce's tables that name a
// consumer (schema.ConsumerTables: never the application's, which may
// have a consumer column too), its claims, and its row in consumers.
func forgetConsumer(tb testing.TB, db consumer.DB, schemaName, name string) {
	if tb.Failed() {
		tb.Logf("consumertest: the claims, positions and dead letters of consumer %q are left in schema %s for you to look at", name, schemaName)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		for _, t := range schema.ConsumerTables {
			if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{schemaName, t}.Sanitize()+` WHERE consumer = $1`, name); err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
		}
		consumers := pgx.Identifier{schemaName, "consumers"}.Sanitize()
		if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{schemaName, "processed_messages"}.Sanitize()+
			` WHERE consumer_id = (SELECT id FROM `+consumers+` WHERE name = $1)`, name); err != nil {
			return fmt.Errorf("processed_messages: %w", err)
		}
		_, err := tx.Exec(ctx, `DELETE FROM `+consumers+` WHERE name = $1`, name)
		return err
	})
	if err != nil {
		tb.Errorf("consumertest: delete what consumer %q left in schema %s: %v", name, schemaName, err)
	}
}

// fetch reads msgs back from the topic, as the consumer will fetch them:
// with the offsets and timestamps Kafka gave them.
func fetch(tb testing.TB, brokers []string, topic string, perPartition map[int]int, timeout time.Duration) []*consumer.Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	client, err := franz.New(kafkaclient.Config{Brokers: brokers, MaxBatch: 100, FetchMaxBytes: 1 << 20})
	if err != nil {
		tb.Fatalf("consumertest: read back the topic: %v", err)
	}
	defer client.Close()
	var out []*consumer.Message
	for _, p := range slices.Sorted(maps.Keys(perPartition)) {
		f, err := client.Open(kafkaclient.FetchConfig{Topic: topic, Partition: p, MaxBatch: 100, Linger: 50 * time.Millisecond})
		if err != nil {
			tb.Fatalf("consumertest: read back partition %d of the topic: %v", p, err)
		}
		for got := 0; got < perPartition[p]; {
			batch, err := f.Next(ctx, nil)
			if err != nil {
				f.Close()
				tb.Fatalf("consumertest: read back partition %d of the topic: %v", p, err)
			}
			for _, r := range batch {
				out = append(out, &consumer.Message{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
					Key: r.Key, Value: r.Value, Headers: r.Headers, Time: r.Time})
			}
			got += len(batch)
		}
		f.Close()
	}
	return out
}

// rollBackOnce runs the handler for each message in a transaction of its
// own that it rolls back, and reports the tables that changed anyway.
func rollBackOnce(tb testing.TB, db consumer.DB, cfg *consumer.Config, msgs []*consumer.Message, tables, idents []string) {
	tb.Helper()
	handle, handleBatch := handleFunc(cfg.Handler), (func(context.Context, *engine.Batch) error)(nil)
	if cfg.BatchHandler != nil {
		handleBatch = func(ctx context.Context, call *engine.Batch) error {
			return cfg.BatchHandler.HandleBatch(ctx, consumer.NewBatch(call.Tx, call.Messages, call.Queue))
		}
	}
	if (handle == nil) == (handleBatch == nil) {
		return // neither or both: consumer.New says what to set
	}
	id := idSource(cfg)
	timeout := cmp.Or(cfg.HandlerTimeout, consumer.DefaultHandlerTimeout)
	ctx := context.Background()

	start := contents(tb, db, idents)
	prev := digests(tb, db, idents)
	culprit := make([]*consumer.Message, len(tables))
	for _, m := range msgs {
		var ok bool
		if m.ID, ok = validID(id, m); !ok {
			continue // set aside as invalid_id without a handler call
		}
		tx, err := db.Begin(ctx)
		if err != nil {
			tb.Fatalf("consumertest: begin: %v", err)
		}
		herr, hung := engine.HandleAlone(ctx, timeout, tx, handle, handleBatch, m)
		if hung != nil {
			tb.Fatalf("consumertest: the handler of message %q (%s) hung in an attempt that was to be rolled back: %v", m.ID, m.Position(), hung)
		}
		if errors.Is(herr, consumer.ErrTxControlledByConsumer) {
			// Its writes may have been committed by the statement: they
			// would be reported below as written outside the transaction.
			tb.Fatalf("consumertest: the handler of message %q (%s) ended its transaction with a COMMIT or ROLLBACK statement (%v); the consumer sets such a message aside: leave ending tx to the consumer", m.ID, m.Position(), herr)
		}
		if err := tx.Rollback(ctx); err != nil && herr == nil {
			tb.Fatalf("consumertest: roll back the attempt at message %q (%s): %v", m.ID, m.Position(), err)
		}
		cur := digests(tb, db, idents)
		for i := range tables {
			if cur[i] != prev[i] && culprit[i] == nil {
				culprit[i] = m
			}
		}
		prev = cur
	}
	end := contents(tb, db, idents)
	for i, t := range tables {
		if culprit[i] == nil {
			continue
		}
		d := diff(start[i], end[i])
		if d == "" {
			d = "changed, then changed back by a later attempt"
		}
		tb.Errorf("consumertest: table %s changed although the handler's transaction was rolled back: %s, first in the attempt at message %q (%s). "+
			"The handler writes outside its transaction (through the pool, another connection, a service that writes to the database), and the consumer runs an attempt again after rolling it back "+
			"(the handler or a later message of its batch failed, the connection or the COMMIT did), so that write repeats: write with the tx the handler is given (or Batch.Queue)",
			t, d, culprit[i].ID, culprit[i].Position())
	}
}

// handleFunc is h as the engine calls it (nil when there is none).
func handleFunc(h consumer.Handler) func(context.Context, pgx.Tx, *consumer.Message) error {
	if h == nil {
		return nil
	}
	return h.Handle
}

// validID derives m's id as the consumer does; ok is false when the
// consumer would set m aside for its id.
// idSource is the rule cfg derives ids by, with the default New applies:
// an unset MessageID, or a nil MessageIDFunc, reads the default header.
func idSource(cfg *consumer.Config) consumer.MessageIDSource {
	id := cfg.MessageID
	if f, ok := id.(consumer.MessageIDFunc); id == nil || ok && f == nil {
		id = consumer.IDFromHeader(consumer.DefaultMessageIDHeader)
	}
	return id
}

func validID(src consumer.MessageIDSource, m *consumer.Message) (id string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	id, err := src.MessageID(m)
	return id, err == nil && consumer.ValidateMessageID(id) == nil
}

// brokerWith starts an in-process broker with topic, partitioned as msgs
// need, and msgs produced to it; it returns the broker, for the caller to
// close, and how many messages each partition holds.
func brokerWith(ctx context.Context, tb testing.TB, topic string, msgs []*consumer.Message) (*devenv.Kafka, map[int]int) {
	tb.Helper()
	broker, err := devenv.StartFakeKafka()
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	perPartition := map[int]int{}
	partitions := 1
	for _, m := range msgs {
		partitions = max(partitions, m.Partition+1)
		perPartition[m.Partition]++
	}
	if err := devenv.CreateTopic(ctx, broker.Brokers, topic, partitions); err != nil {
		broker.Close()
		tb.Fatalf("consumertest: %v", err)
	}
	produce(tb, broker.Brokers, topic, msgs)
	return broker, perPartition
}

func produce(tb testing.TB, brokers []string, topic string, msgs []*consumer.Message) {
	tb.Helper()
	client, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		tb.Fatalf("consumertest: produce: %v", err)
	}
	defer client.Close()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		r := &kgo.Record{Topic: topic, Partition: int32(m.Partition), Key: m.Key, Value: m.Value, Timestamp: m.Time}
		for _, h := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: h.Value})
		}
		recs[i] = r
	}
	if err := client.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		tb.Fatalf("consumertest: produce: %v", err)
	}
}

// digests returns, per table, its row count and a digest of its rows.
func digests(tb testing.TB, db consumer.DB, idents []string) []string {
	tb.Helper()
	out := make([]string, len(idents))
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		for i, id := range idents {
			if err := tx.QueryRow(context.Background(), `SELECT count(*)::text || ' ' || coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), '') FROM `+id+` t`).Scan(&out[i]); err != nil {
				return fmt.Errorf("read %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	return out
}

// contents returns, per table, its rows as text, sorted.
func contents(tb testing.TB, db consumer.DB, idents []string) [][]string {
	tb.Helper()
	out := make([][]string, len(idents))
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		for i, id := range idents {
			rows, _ := tx.Query(context.Background(), `SELECT t::text FROM `+id+` t ORDER BY 1`)
			var err error
			if out[i], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
				return fmt.Errorf("read %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	return out
}

// diff describes how a table's rows went from before to after ("" when
// they did not change): how many were added and removed, with a few of
// each.
func diff(before, after []string) string {
	var added, removed []string
	i, j := 0, 0
	for i < len(before) || j < len(after) {
		switch {
		case j == len(after) || i < len(before) && before[i] < after[j]:
			removed = append(removed, before[i])
			i++
		case i == len(before) || after[j] < before[i]:
			added = append(added, after[j])
			j++
		default:
			i++
			j++
		}
	}
	var parts []string
	for _, c := range []struct {
		what string
		rows []string
	}{{"added", added}, {"removed", removed}} {
		if len(c.rows) == 0 {
			continue
		}
		shown := c.rows[:min(len(c.rows), 3)]
		more := ""
		if len(c.rows) > len(shown) {
			more = ", …"
		}
		parts = append(parts, fmt.Sprintf("%d %s %s (%s%s)", len(c.rows), plural(len(c.rows), "row", "rows"), c.what, strings.Join(shown, ", "), more))
	}
	return strings.Join(parts, " and ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
