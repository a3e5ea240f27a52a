package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// auditJSON runs audit --json with args and returns its report and exit
// code.
func (w *world) auditJSON(args ...string) (auditReport, int) {
	w.t.Helper()
	out, errOut, code := w.cliBare(append([]string{"audit", "--consumer", w.name, "--json"}, args...)...)
	var r auditReport
	require.NoError(w.t, json.Unmarshal([]byte(out), &r), errOut+out)
	return r, code
}

// leaveProvisionalLetter writes, by the engine's own statement, the
// provisional letter a share member writes before a record's last
// delivery: what stays of it when that delivery never finishes.
func (w *world) leaveProvisionalLetter(partition int, offset int64, id string) {
	w.t.Helper()
	st, err := letters.NewStore(w.db.Schema)
	require.NoError(w.t, err)
	now := time.Now()
	b := &pgx.Batch{}
	require.NoError(w.t, st.QueueInsertProvisional(b, w.name, w.topic, partition, []deadletter.Letter{{Offset: offset, MessageID: id,
		Key: []byte(id), Value: []byte("v" + id), Class: deadletter.ClassCrashed, Error: "share group delivery 5 of 5 did not finish",
		Attempts: 5, FirstFailedAt: now, LastFailedAt: now}}))
	require.NoError(w.t, w.db.Pool.SendBatch(context.Background(), b).Close())
}

// positionOf is where the record whose claim is id was applied (w's
// schema has one consumer).
func (w *world) positionOf(id string) (partition int, offset int64) {
	w.t.Helper()
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(), `SELECT partition, kafka_offset FROM `+w.db.Table("processed_messages")+
		` WHERE message_id = $1`, id).Scan(&partition, &offset))
	return partition, offset
}

// Issue 47: audit knows a share group from what the consumer recorded,
// and checks every record below the group's start offset on each
// partition (the broker settled them all) against the claims and
// letters; records past it are in flight or not delivered yet, and none
// is missing.
func TestAuditOfAShareGroup(t *testing.T) {
	t.Parallel()
	w := shareWorld(t, 2)
	admin := testenv.Admin(t, w.kafka.Brokers)
	ctx := testenv.Context(t, 2*time.Minute)
	// Two records set aside, one without an id and one its handler
	// refuses, and then ten applied.
	w.kafka.Produce(t, w.topic, kafka.Message{Partition: 0, Key: []byte("noid"), Value: []byte("vnoid")},
		kafka.Message{Partition: 1, Key: []byte("refused"), Value: []byte("vrefused"),
			Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("refused")}}})
	w.produce(10, "s")
	var starts map[int]kafkaadmin.SharePartition
	settled := func(past int64) func() bool {
		return func() bool {
			var err error
			starts, err = admin.ShareOffsets(ctx, w.name, w.topic)
			require.NoError(t, err)
			return len(starts) == 2 && starts[0].Lag == 0 && starts[1].Lag == 0 && starts[0].Start >= past && starts[1].Start >= past
		}
	}
	stop := w.runUntil(func(c *consumer.Config) {
		c.GroupType, c.KafkaClient = consumer.ShareGroup, consumer.FranzGo
		effects := w.consumerConfig().Handler.(consumer.HandlerFunc)
		c.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == "refused" {
				return consumer.Permanent(errors.New("refused"))
			}
			return effects(ctx, tx, m)
		})
	}, "every record settled", func() bool { return w.effects() == 10 && settled(0)() })
	// Kafka persists the start offset it reports with the
	// acknowledgement after the one that moves it (kfake moves it at
	// once): a record more on each partition, and the twelve are below
	// it. The two are below it or past it, by broker.
	w.produce(2, "tail")
	w.waitFor("the start offsets past the first twelve records", func() bool { return w.effects() == 12 && settled(6)() })
	stop()
	below := starts[0].Start + starts[1].Start
	tailPast := 14 - below

	t.Run("a clean share group audits clean, by its start offsets", func(t *testing.T) {
		r, code := w.auditJSON()
		require.Equal(t, 0, code)
		require.Equal(t, recorded.ShareGroup, r.GroupType)
		require.Equal(t, "record", r.GroupTypeFrom)
		require.Equal(t, w.name, r.Group)
		require.Len(t, r.Partitions, 2)
		for _, p := range r.Partitions {
			require.NotNil(t, p.ShareStart)
			require.Equal(t, starts[p.Partition].Start, *p.ShareStart)
			require.EqualValues(t, -1, p.Stored, "a share group stores no positions")
		}
		require.EqualValues(t, 14, r.Total.Read)
		require.EqualValues(t, 12, r.Total.Applied)
		require.Equal(t, tailPast, r.Total.PastStart)
		require.True(t, r.OK)

		out, errOut, code := w.cliBare("audit", "--consumer", w.name)
		require.Equal(t, 0, code, errOut+out)
		require.Contains(t, out, "group: share group "+w.name+", boundary its share start offset on each partition, as the consumer records")
		require.Contains(t, out, "SHARE START")
		require.Contains(t, out, fmt.Sprintf("OK: every record below the share start offsets was applied, claimed as a duplicate or set aside (%d checked)", below))
	})

	t.Run("a record set aside counts, with or without an id", func(t *testing.T) {
		r, code := w.auditJSON()
		require.Equal(t, 0, code)
		require.EqualValues(t, 2, r.Total.DeadLettered)
		require.Zero(t, r.Total.Missing)
	})

	t.Run("records past the start offset are not missing", func(t *testing.T) {
		w.produce(4, "later")
		r, code := w.auditJSON()
		require.Equal(t, 0, code)
		require.EqualValues(t, 18, r.Total.Read)
		require.Equal(t, 4+tailPast, r.Total.PastStart)
		require.EqualValues(t, 4, r.Total.Unprocessed)
		require.Zero(t, r.Total.problems())
		require.True(t, r.OK)
		out, _, code := w.cliBare("audit", "--consumer", w.name)
		require.Equal(t, 0, code)
		require.Contains(t, out, fmt.Sprintf("past the share start offsets: %d records, in flight or not delivered yet (4 with no claim or letter), none of them missing", 4+tailPast))
		require.Contains(t, out, fmt.Sprintf("(%d checked)", below))
	})

	t.Run("a record archived with its provisional letter died on its last delivery", func(t *testing.T) {
		// Below the start: the letter the engine left in place sets it
		// aside.
		p, off := w.positionOf("s5")
		w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 's5'`)
		w.leaveProvisionalLetter(p, off, "s5")
		// Below the start with its claim: applied on an earlier delivery,
		// the letter a leftover redrive finds claimed.
		p, off = w.positionOf("s6")
		w.leaveProvisionalLetter(p, off, "s6")
		// Past the start: on its last delivery now, not set aside yet.
		w.leaveProvisionalLetter(0, w.logEnd(0)-1, "later2")

		r, code := w.auditJSON()
		require.Equal(t, 0, code)
		require.EqualValues(t, 1, r.Total.DiedOnLastDelivery)
		require.EqualValues(t, 11, r.Total.Applied)
		require.EqualValues(t, 2, r.Total.DeadLettered)
		require.EqualValues(t, 4, r.Total.Unprocessed)
		require.True(t, r.OK)
		out, _, code := w.cliBare("audit", "--consumer", w.name)
		require.Equal(t, 0, code)
		require.Contains(t, out, "died on their last delivery: 1 records the broker archived")
	})

	t.Run("a claim deleted below the start offset would be applied again", func(t *testing.T) {
		w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 's3'`)
		r, code := w.auditJSON()
		require.Equal(t, 1, code)
		require.EqualValues(t, 1, r.Total.WouldReapply)
		require.Equal(t, "s3", r.Findings[0].MessageID)
		require.Contains(t, r.Findings[0].Detail, "below the share start offset")
		require.False(t, r.OK)
		out, _, code := w.cliBare("audit", "--consumer", w.name)
		require.Equal(t, 1, code)
		require.Contains(t, out, "PROBLEMS: 1 would be applied again, 0 conflict, 0 missing")
		require.Contains(t, out, "HINT: 1 records below the share start offset have no claim")
		require.Contains(t, out, "share.auto.offset.reset latest")
	})

	t.Run("without a record it is a consumer group unless told", func(t *testing.T) {
		w.db.Exec(t, `UPDATE `+w.db.Table("consumers")+` SET message_id_rule = NULL, group_id = NULL, topics = NULL, brokers = NULL,
kafka_tls = NULL, kafka_sasl = NULL, settings_recorded_at = NULL, settings_group_type = NULL WHERE name = $1`, w.name)
		out, errOut, code := w.cliBare("audit", "--consumer", w.name, "--topic", w.topic)
		require.Contains(t, out, "group: consumer group, boundary the stored position on each partition, the default: consumer "+w.name+
			" has recorded no settings", errOut)
		require.Contains(t, out, "pass --group-type share")
		require.Equal(t, 0, code, "no stored position: every record is unprocessed or claimed")

		r, code := w.auditJSON("--topic", w.topic, "--group-type", "share")
		require.Equal(t, 1, code)
		require.Equal(t, recorded.ShareGroup, r.GroupType)
		require.Equal(t, "--group-type", r.GroupTypeFrom)
		require.Equal(t, w.name, r.Group, "the consumer's name")
		require.EqualValues(t, 1, r.Total.WouldReapply)
		require.Equal(t, 4+tailPast, r.Total.PastStart)

		_, errOut, code = w.cliBare("audit", "--consumer", w.name, "--topic", w.topic, "--group", w.name)
		require.Equal(t, 2, code)
		require.Contains(t, errOut, "--group names a share group")
	})
}
