package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// These tests run the CLI as an operator would who was told nothing but
// the consumer's name: no --schema, no --id, no --group, no --topic. What
// it needs it must find in the database, from what the consumer recorded.

// cliBare runs the command without the --schema every other test gives.
func (w *world) cliBare(args ...string) (stdout, stderr string, code int) {
	return cliAt(w.db.URL, strings.Join(w.kafka.Brokers, ","), args...)
}

// cliAt runs the command against the database at dbURL and the brokers.
func cliAt(dbURL, brokers string, args ...string) (stdout, stderr string, code int) {
	env := map[string]string{"DATABASE_URL": dbURL, "KAFKA_BROKERS": brokers}
	var out, errb bytes.Buffer
	st := streams{in: strings.NewReader(""), out: &out, err: &errb, terminal: func() bool { return false }, getenv: func(k string) string { return env[k] }}
	code = run(args, st)
	return out.String(), errb.String(), code
}

// produceEvents writes n messages whose id is the JSON field event_id,
// with no message-id header, as the loyalty-points worker of issue 23 got.
func (w *world) produceEvents(n int, prefix string) {
	var msgs []kafka.Message
	for i := range n {
		id := prefix + strconv.Itoa(i)
		v, err := json.Marshal(map[string]any{"event_id": id, "points": i})
		require.NoError(w.t, err)
		msgs = append(msgs, kafka.Message{Partition: i % w.parts(), Key: []byte(id), Value: v})
	}
	w.kafka.Produce(w.t, w.topic, msgs...)
}

// consumeInOwnGroup runs, as consumeWith does, a consumer that takes its
// ids from the JSON field event_id and its group from a GroupID other than
// its name, which it returns.
func (w *world) consumeInOwnGroup(want int64) (group string) {
	w.t.Helper()
	group = w.name + "_group"
	w.consumeWith(func(c *consumer.Config) {
		c.MessageID = consumer.IDFromJSONField("event_id")
		c.GroupID = group
	}, want)
	return group
}

// consumerConfig is w's consumer: one effect row per message.
func (w *world) consumerConfig() *consumer.Config {
	return &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic}, Schema: w.db.Schema,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
			return err
		}),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Retry: consumer.RetryPolicy{InitialInterval: time.Millisecond}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// consumeWith runs a consumer set up by adjust until every partition's
// stored position reaches want, then stops it.
func (w *world) consumeWith(adjust func(*consumer.Config), want int64) {
	w.t.Helper()
	cfg := w.consumerConfig()
	adjust(cfg)
	c, err := consumer.New(w.db.Pool, cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for w.minPosition() < want {
		require.True(w.t, time.Now().Before(deadline), "timed out consuming")
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	require.NoError(w.t, <-done)
}

// Issue 23: a consumer whose ids are a JSON field, audited with no flag
// but its name, in a schema of its own among others. The audit finds the
// schema, the topic and the id rule, and calls nothing missing.
func TestAuditOfAJSONFieldConsumerNeedsOnlyItsName(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produceEvents(20, "e")
	w.consumeWith(func(c *consumer.Config) { c.MessageID = consumer.IDFromJSONField("event_id") }, 10)
	w.requireEffectsOnce(20)

	out, errOut, code := w.cliBare("audit", "--consumer", w.name)
	require.Equal(t, 0, code, errOut+out)
	require.Contains(t, out, "OK: a replay of this range applies nothing twice (20 messages checked)")
	require.NotRegexp(t, `(?m)^missing `, out, "no finding of a missing message")
	require.Contains(t, out, "ids: json:event_id, as the consumer records")
	require.Contains(t, out, "(schema "+w.db.Schema+")")

	out, errOut, code = w.cliBare("audit", "--consumer", w.name, "--topic", w.topic, "--json")
	require.Equal(t, 0, code, errOut+out)
	var r struct {
		Total    map[string]int64 `json:"total"`
		Findings []any            `json:"findings"`
		OK       bool             `json:"ok"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.True(t, r.OK)
	require.EqualValues(t, 20, r.Total["applied"])
	require.Zero(t, r.Total["missing"])
	require.Empty(t, r.Findings)
}

// A flag wins over the record. Whenever it names another rule than the
// recorded one, the report says so and what to pass, and each kind of
// problem it finds gets a hint that points at the rule before the
// producer or the tables.
func TestAuditWithAnotherIDRuleThanRecordedSaysWhichToUse(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produceEvents(6, "e")
	w.consumeWith(func(c *consumer.Config) { c.MessageID = consumer.IDFromJSONField("event_id") }, 6)
	recordedLine := func(asked string) string {
		return "NOTE: consumer " + w.name + " records its ids as json:event_id, and you asked for --id " + asked +
			": to audit as the consumer derives its ids, leave --id out (or pass --id json:event_id)"
	}

	t.Run("no ids by --id: missing", func(t *testing.T) {
		out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--id", "header:message-id")
		require.Equal(t, 1, code, errOut+out)
		require.Contains(t, out, "ids: header:message-id (--id)\n"+recordedLine("header:message-id")+"\n")
		require.Contains(t, out, "PROBLEMS: 0 would be applied again, 0 conflict, 6 missing")
		require.Contains(t, out, "HINT: 6 messages have no id by --id header:message-id, but consumer "+w.name+" records its ids as json:event_id: run the audit again without --id (or with --id json:event_id)")
	})

	t.Run("other ids by --id: would be applied again", func(t *testing.T) {
		out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--id", "hash")
		require.Equal(t, 1, code, errOut+out)
		require.Contains(t, out, "ids: hash (--id)\n"+recordedLine("hash")+"\n")
		require.Contains(t, out, "PROBLEMS: 6 would be applied again, 0 conflict, 0 missing")
		require.Contains(t, out, "HINT: 6 messages below the stored position have no claim by --id hash, but consumer "+w.name+" records its ids as json:event_id: run the audit again without --id (or with --id json:event_id)")

		out, errOut, code = w.cliBare("audit", "--consumer", w.name, "--id", "hash", "--json")
		require.Equal(t, 1, code, errOut+out)
		var r auditReport
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.Equal(t, "hash", r.MessageIDRule)
		require.Equal(t, "json:event_id", r.RecordedMessageIDRule)
		require.Len(t, r.Hints, 1)
		require.Equal(t, "would_reapply", r.Hints[0].Kind)
		require.Contains(t, r.Hints[0].Text, "records its ids as json:event_id")
	})

	t.Run("the recorded rule given as --id: no note", func(t *testing.T) {
		out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--id", "json:event_id")
		require.Equal(t, 0, code, errOut+out)
		require.NotContains(t, out, "NOTE:")
		require.NotContains(t, out, "HINT:")
	})

	t.Run("an id claimed for other content: conflicts", func(t *testing.T) {
		v, err := json.Marshal(map[string]any{"event_id": "e1", "points": 100})
		require.NoError(t, err)
		w.kafka.Produce(t, w.topic, kafka.Message{Key: []byte("e1"), Value: v})
		out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--id", "json:event_id")
		require.Equal(t, 1, code, errOut+out)
		require.Contains(t, out, "PROBLEMS: 0 would be applied again, 1 conflict, 0 missing")
		require.Contains(t, out, "HINT: 1 messages have an id claimed for other content (ids by --id json:event_id): ")
		require.NotContains(t, out, "NOTE:", "the recorded rule")
		require.Contains(t, out, "kafkaonce topic-recreated")
	})

	t.Run("a claim deleted as well: a hint for each kind", func(t *testing.T) {
		w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 'e2'`)
		out, errOut, code := w.cliBare("audit", "--consumer", w.name)
		require.Equal(t, 1, code, errOut+out)
		require.NotContains(t, out, "NOTE:")
		require.Contains(t, out, "PROBLEMS: 1 would be applied again, 1 conflict, 0 missing")
		require.Contains(t, out, "HINT: 1 messages below the stored position have no claim by json:event_id, the rule consumer "+w.name+" records")
		require.Contains(t, out, "their claims were deleted, by a prune with a shorter --older-than than --retention 7d (audit again with that as --retention)")
		require.Contains(t, out, "HINT: 1 messages have an id claimed for other content (ids by json:event_id, the rule consumer "+w.name+" records): ")
	})

	t.Run("an id rule of no form", func(t *testing.T) {
		_, errOut, code := w.cliBare("audit", "--consumer", w.name, "--id", "uuid")
		require.Equal(t, 2, code)
		require.Contains(t, errOut, `--id: message id rule "uuid" is not one of header:<name>, json:<field.path>, hash, position`)
	})
}

// A consumer with an id function of its own cannot be audited by a rule
// the tool makes up: the audit stops at once and asks for --id. Commands
// that need no ids (replay) still take the rest from the record.
func TestAuditOfACustomIDConsumerAsksForID(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produceEvents(5, "c")
	w.consumeWith(func(c *consumer.Config) {
		c.MessageID = consumer.MessageIDFunc(func(m *consumer.Message) (string, error) { return "k-" + string(m.Key), nil })
	}, 5)

	out, errOut, code := w.cliBare("audit", "--consumer", w.name)
	require.Equal(t, 2, code, errOut+out)
	require.Empty(t, out, "it stops before reading the log")
	require.Contains(t, errOut, "consumer "+w.name+" derives message ids with a function of its own")
	require.Contains(t, errOut, "pass --id with the rule that function follows, one of header:<name>, json:<field.path>, hash, position")

	out, errOut, code = w.cliBare("replay", "--consumer", w.name, "--dry-run", "--json")
	require.Equal(t, 0, code, errOut+out)
	var plan replayPlan
	require.NoError(t, json.Unmarshal([]byte(out), &plan))
	require.Equal(t, w.topic, plan.Topic)
	require.Equal(t, w.db.Schema, plan.Schema)
	require.Contains(t, plan.ClaimsNotCounted, "consumer "+w.name+" derives message ids with a function of its own")
	require.Empty(t, plan.ClaimsCountedBy)

	out, errOut, code = w.cliBare("replay", "--consumer", w.name, "--dry-run")
	require.Equal(t, 0, code, errOut+out)
	require.Contains(t, out, "claims not counted, so the new messages may include some already claimed, which the consumer will skip: consumer "+w.name+" derives message ids")

	_, errOut, code = w.cliBare("replay", "--consumer", w.name, "--dry-run", "--id", "uuid")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `--id: message id rule "uuid" is not one of`)
}

// status shows what the consumer records, and reads the group it
// records: a GroupID other than the name needs no --group.
func TestStatusShowsTheRecordedSettingsAndReadsTheRecordedGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produceEvents(10, "s")
	group := w.consumeInOwnGroup(5)

	out, errOut, code := w.cliBare("status", "--consumer", w.name, "--json")
	require.Equal(t, 0, code, errOut+out)
	var r statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.Equal(t, w.db.Schema, r.Schema)
	require.Equal(t, group, r.Group)
	require.NotNil(t, r.Recorded)
	require.Equal(t, "json:event_id", r.Recorded.MessageIDRule)
	require.Equal(t, group, r.Recorded.Group)
	require.Equal(t, []string{w.topic}, r.Recorded.Topics)
	require.Equal(t, w.kafka.Brokers, r.Recorded.Brokers)
	require.WithinDuration(t, time.Now(), r.Recorded.RecordedAt, time.Minute)
	host, _ := os.Hostname()
	require.Equal(t, fmt.Sprintf("%s (pid %d)", host, os.Getpid()), r.Recorded.RecordedBy, "the worker that recorded them")
	require.Len(t, r.Partitions, 2)
	for _, p := range r.Partitions {
		require.GreaterOrEqual(t, p.Committed, int64(0), "the committed offsets of the recorded group, not of a group named after the consumer")
	}

	out, errOut, code = w.cliBare("status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut+out)
	require.Contains(t, out, fmt.Sprintf("recorded settings (by %s (pid %d), which joined its group ", host, os.Getpid()))
	require.Contains(t, out, "ids json:event_id, group "+group+", topics "+w.topic+", brokers "+strings.Join(w.kafka.Brokers, ","))

	out, errOut, code = w.cliBare("replay", "--consumer", w.name, "--dry-run", "--json")
	require.Equal(t, 0, code, errOut+out)
	var plan replayPlan
	require.NoError(t, json.Unmarshal([]byte(out), &plan))
	require.Equal(t, group, plan.Group)

	// Without KAFKA_BROKERS, the recorded brokers are used.
	out, errOut, code = cliAt(w.db.URL, "", "status", "--consumer", w.name, "--json")
	require.Equal(t, 0, code, errOut+out)
	require.Empty(t, errOut)
	var again statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &again))
	require.Len(t, again.Partitions, 2)
	for _, p := range again.Partitions {
		require.EqualValues(t, 5, p.LogEnd, "the log read through the recorded brokers")
		require.GreaterOrEqual(t, p.Committed, int64(0))
	}
}

// A schema the tool cannot tell apart from others is never picked: it
// lists them and asks for --schema.
func TestAToolNotToldTheSchemaNeverGuessesAmongSeveral(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	other := testenv.NewDB(t)
	for _, db := range []*testenv.DB{w.db, other} {
		db.Exec(t, `SELECT `+db.Table("consumer_id")+`($1)`, w.name)
	}
	_, errOut, code := w.cliBare("status", "--consumer", w.name)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "schemas hold kafkaonce's tables (")
	require.Contains(t, errOut, w.db.Schema)
	require.Contains(t, errOut, other.Schema)
	require.Contains(t, errOut, "consumer "+w.name+" is known in ")
	require.Contains(t, errOut, "pass --schema to say which")

	_, errOut, code = w.cliBare("status", "--consumer", "nobody-"+w.name)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "consumer nobody-"+w.name+" is known in none of them: pass --schema")
}

// In a database of its own: no schema at first (an error that says what
// to do), then the one migrate makes, then two, which commands naming no
// consumer cannot choose between.
func TestSchemaIsFoundInADatabaseOfItsOwn(t *testing.T) {
	t.Parallel()
	w := &world{t: t, db: testenv.NewEmptyDB(t)}
	name := testenv.Name(t, "d")
	ctx := context.Background()
	_, err := w.db.Pool.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = w.db.Pool.Exec(context.Background(), `DROP DATABASE `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
	})
	u, err := url.Parse(w.db.URL)
	require.NoError(t, err)
	u.Path = "/" + name
	dbURL := u.String()

	_, errOut, code := cliAt(dbURL, "", "dead-letters", "list", "--consumer", "ledger")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "no schema of this database holds kafkaonce's tables: pass --schema with the consumer's Config.Schema, or run kafkaonce migrate")

	out, errOut, code := cliAt(dbURL, "", "migrate")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "schema kafkaonce: version 0 -> ")
	out, errOut, code = cliAt(dbURL, "", "dead-letters", "list")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "no dead letters")

	_, errOut, code = cliAt(dbURL, "", "--schema", "ledger_v2", "migrate")
	require.Equal(t, 0, code, errOut)
	for _, args := range [][]string{{"dead-letters", "list"}, {"migrate"}, {"prune", "--dry-run"}, {"outbox", "parked"}} {
		_, errOut, code = cliAt(dbURL, "", args...)
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut, "2 schemas hold kafkaonce's tables (kafkaonce, ledger_v2): pass --schema", args)
	}

	// A key, or a consumer, in one of them names it.
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO ledger_v2.idempotency_keys (scope, idem_key, method, route, fingerprint, expires_at, status, headers, body)
VALUES ('acct-1', 'k-1', 'POST', '/v1/payments', '\x00', now() + interval '1 day', 201, '{}', '')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `SELECT ledger_v2.consumer_id('payments')`)
	require.NoError(t, err)
	out, errOut, code = cliAt(dbURL, "", "keys", "get", "k-1", "--scope", "acct-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "key k-1 in scope acct-1")
	_, errOut, code = cliAt(dbURL, "", "keys", "get", "k-2", "--scope", "acct-1")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, `key "k-2" in scope "acct-1" is known in none of them: pass --schema`)
	out, errOut, code = cliAt(dbURL, "", "keys", "prune", "--dry-run", "--consumer", "payments")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 expired idempotency keys would be deleted")
}

// A consumer that has recorded nothing (it last ran before kafkaonce
// recorded settings): the audit falls back on the default header and says
// so, and its hint for missing ids names --id, not the producer.
func TestAuditOfAConsumerWithoutARecordSaysItAssumedTheDefault(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produceEvents(4, "e")
	w.consumeWith(func(c *consumer.Config) { c.MessageID = consumer.IDFromJSONField("event_id") }, 4)
	w.db.Exec(t, `UPDATE `+w.db.Table("consumers")+` SET message_id_rule = NULL, group_id = NULL, topics = NULL, brokers = NULL,
kafka_tls = NULL, kafka_sasl = NULL, settings_recorded_at = NULL WHERE name = $1`, w.name)

	_, errOut, code := w.cliBare("audit", "--consumer", w.name)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--topic is required: consumer "+w.name+" has recorded no settings")

	out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 1, code, errOut+out)
	require.Contains(t, out, "ids: header:message-id, the default: consumer "+w.name+" has recorded no settings")
	require.Contains(t, out, `no valid id by header:message-id (no "message-id" header)`)
	require.Contains(t, out, "HINT: 4 messages have no id by header:message-id, the default")
	require.Contains(t, out, "pass that rule as --id (header:<name>, json:<field.path>, hash, position)")

	out, errOut, code = w.cliBare("audit", "--consumer", w.name, "--topic", w.topic, "--id", "json:event_id")
	require.Equal(t, 0, code, errOut+out)

	out, errOut, code = w.cliBare("status", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 0, code, errOut+out)
	require.Contains(t, out, "recorded settings: none")
}

// Where the brokers, TLS and SASL come from: a flag, then KAFKA_BROKERS,
// then the record, whose TLS and SASL apply only with its brokers.
func TestKafkaSettingsPrecedence(t *testing.T) {
	t.Parallel()
	rec := &recorded.Settings{Consumer: "ledger", MessageIDRule: "hash", GroupID: "ledger", Topics: []string{"t"},
		Brokers: []string{"kafka-1:9093"}, KafkaTLS: true, KafkaSASL: "SCRAM-SHA-512"}
	for _, tc := range []struct {
		name    string
		env     string
		flags   []string
		rec     *recorded.Settings
		brokers []string
		tls     bool
		sasl    string
		errs    []string
		note    string
	}{
		{name: "flag wins", env: "env:9092", flags: []string{"--brokers", "flag:9092"}, rec: rec, brokers: []string{"flag:9092"},
			note: "using the brokers of --brokers (flag:9092); consumer ledger records kafka-1:9093"},
		{name: "environment next", env: "env:9092", rec: rec, brokers: []string{"env:9092"}, note: "using the brokers of KAFKA_BROKERS"},
		{name: "environment naming a recorded broker", env: "kafka-1:9093", rec: rec, brokers: []string{"kafka-1:9093"}},
		{name: "record with its TLS and SASL", flags: []string{"--kafka-user", "u"}, rec: rec, brokers: []string{"kafka-1:9093"}, tls: true, sasl: "scram-sha-512"},
		{name: "record, flags override TLS and SASL", flags: []string{"--kafka-tls=false", "--kafka-sasl", "plain"}, rec: rec, brokers: []string{"kafka-1:9093"}, sasl: "plain"},
		{name: "record's SASL without a user", rec: rec, errs: []string{"consumer ledger reaches Kafka (kafka-1:9093) with SASL SCRAM-SHA-512, as it records: pass --kafka-user and set KAFKA_PASSWORD"}},
		{name: "nothing", errs: []string{"no Kafka brokers: set KAFKA_BROKERS or pass --brokers host:port; consumer ledger has recorded none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errb bytes.Buffer
			st := streams{in: strings.NewReader(""), out: io.Discard, err: &errb, terminal: func() bool { return false },
				getenv: func(k string) string {
					if k == "KAFKA_BROKERS" {
						return tc.env
					}
					return ""
				}}
			root, s := newRootSettings(st)
			require.NoError(t, root.PersistentFlags().Parse(tc.flags))
			k, err := s.kafkaSettings(tc.rec, "consumer ledger")
			for _, e := range tc.errs {
				require.ErrorContains(t, err, e)
			}
			if len(tc.errs) > 0 {
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.brokers, k.brokers)
			require.Equal(t, tc.tls, k.tls)
			require.Equal(t, tc.sasl, k.sasl)
			if tc.note == "" {
				require.Empty(t, errb.String())
			} else {
				require.Contains(t, errb.String(), tc.note)
			}
		})
	}
}

// serve, told neither --brokers nor KAFKA_BROKERS, reads Kafka through
// the brokers its consumers record.
func TestServeReadsKafkaThroughTheRecordedBrokers(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	srv := w.servePage(map[string]string{"DATABASE_URL": w.db.URL}, serveOptions{})
	res, body := get(t, srv, "/")
	require.Equal(t, 200, res.StatusCode, body)
	require.Contains(t, body, w.name)
	require.Contains(t, body, "lag 1", "the log's end, read from Kafka")
}

// serve, told no --group, reads a consumer's committed offsets in the group
// it records: a GroupID other than the name needs no flag.
func TestServeReadsTheRecordedGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produceEvents(4, "g")
	group := w.consumeInOwnGroup(4)
	require.EqualValues(t, 4, w.kafka.CommittedOffsets(t, group, w.topic, 1)[0], "the consumer committed its offsets in its group")
	w.produceEvents(2, "h")

	srv := w.servePage(map[string]string{"DATABASE_URL": w.db.URL}, serveOptions{})
	res, body := get(t, srv, "/")
	require.Equal(t, 200, res.StatusCode, body)
	require.Contains(t, body, "group "+group+", lag 2")
	require.Contains(t, body, `<td class="n">6</td>`+"\n"+`<td class="n">4</td><td class="n">4</td>`,
		"log end 6, then the recorded group's committed offset and the stored position")
}

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
func TestAFailedRecordLeavesTheOldGroupForTheTools(t *testing.T) {
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
func TestSchemaDiscoveryIgnoresAConsumerInAnOlderSchema(t *testing.T) {
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
