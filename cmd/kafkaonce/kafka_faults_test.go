package main

// Operator commands whose Kafka side fails midway: each test names the
// promise it checks and the interleaving it drives.

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// Covers P5 ("a failed replay changes nothing, or says exactly
// what it changed") and docs/operations.md's "What a failed command changes".
//
// Interleaving: a forward replay of a two-partition topic. Kafka answers the
// group's OffsetCommit partition by partition: it commits partition 0 and
// refuses partition 1 (a per-partition error code, which the OffsetCommit
// protocol allows and kafkaadmin.CommitOffsets checks for). The test's
// broker does this by committing partition 0 for real, through its normal
// path, while it holds the replay's request, and then answering the
// replay's request with partition 0 OK and partition 1 refused.
//
// Replay said "nothing changed: the group's offsets and the stored positions
// are as they were" while the group's offset of partition 0 was 15 (the
// stored positions rolled back to 10). It now names the partitions Kafka
// committed.
func TestAReplayKafkaCommitsInPartSaysWhatItCommitted(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	fk, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = fk.Close() })
	k := &testenv.Kafka{Kafka: fk}
	w := &world{t: t, db: db, kafka: k, topic: k.Topic(t, 2), name: testenv.Name(t, "c")}
	w.produce(20, "f") // 10 per partition
	w.consume(nil, 10)
	w.produce(20, "g") // offsets 10..19 of each partition, not consumed
	require.EqualValues(t, 10, w.minPosition())
	var before map[int]int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		before = k.CommittedOffsets(t, w.name, w.topic, 2)
		if len(before) == 2 && before[0] == 10 && before[1] == 10 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the consumer's offsets never reached Kafka: %v", before)
		time.Sleep(50 * time.Millisecond)
	}

	var intercepted atomic.Bool
	fk.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fk.Fake.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group != w.name || len(req.Topics) != 1 || len(req.Topics[0].Partitions) != 2 || !intercepted.CompareAndSwap(false, true) {
			return nil, nil, false // the broker handles it as usual
		}
		var p0 int64 = -1
		for _, p := range req.Topics[0].Partitions {
			if p.Partition == 0 {
				p0 = p.Offset
			}
		}
		// The broker commits partition 0 (through its own handling, on
		// another connection) while it holds this request.
		fk.Fake.SleepControl(func() {
			c := &kafka.Client{Addr: kafka.TCP(fk.Brokers...), Timeout: 10 * time.Second}
			resp, err := c.OffsetCommit(context.Background(), &kafka.OffsetCommitRequest{GroupID: w.name, GenerationID: -1,
				Topics: map[string][]kafka.OffsetCommit{w.topic: {{Partition: 0, Offset: p0}}}})
			if err == nil {
				for _, p := range resp.Topics[w.topic] {
					err = p.Error
				}
			}
			if err != nil {
				t.Errorf("commit partition 0: %v", err)
			}
		})
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		resp.SetVersion(req.GetVersion())
		rt := kmsg.NewOffsetCommitResponseTopic()
		rt.Topic, rt.TopicID = req.Topics[0].Topic, req.Topics[0].TopicID
		for _, p := range req.Topics[0].Partitions {
			rp := kmsg.NewOffsetCommitResponseTopicPartition()
			rp.Partition = p.Partition
			if p.Partition == 1 {
				rp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			}
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})

	out, errOut, code := w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--to", "15", "--yes")
	require.True(t, intercepted.Load(), "the replay's commit was not intercepted: %s%s", out, errOut)
	require.Equal(t, 2, code, out+errOut)
	t.Logf("replay said: %s", errOut)
	after := k.CommittedOffsets(t, w.name, w.topic, 2)
	t.Logf("group offsets before %v, after %v; stored positions min %d", before, after, w.minPosition())
	if after[0] != before[0] {
		require.NotContains(t, errOut, "nothing changed",
			"Kafka committed partition 0's offset (%d -> %d), and replay says nothing changed", before[0], after[0])
	}
	require.Contains(t, errOut, "Kafka committed the group's offsets on "+w.topic+"/0 to 15 all the same")
}

// An audit whose fetches fail (a broker error, every time) reads nothing
// of the range: it says INCOMPLETE with the reason and exits 2, never OK.
func TestAnAuditWhoseFetchesFailIsNoVerdict(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	fk, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = fk.Close() })
	k := &testenv.Kafka{Kafka: fk}
	w := &world{t: t, db: db, kafka: k, topic: k.Topic(t, 1), name: testenv.Name(t, "c")}
	w.produce(10, "f")
	w.consume(nil, 10)

	var failed atomic.Int64
	fk.Fake.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fk.Fake.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.SetVersion(req.GetVersion())
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.KafkaStorageError.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		failed.Add(1)
		return resp, nil, true
	})

	out, errOut, code := w.cli("audit", "--consumer", w.name, "--topic", w.topic)
	require.Positive(t, failed.Load(), "the audit's fetches were answered with errors")
	require.NotContains(t, out, "OK:")
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, out, "INCOMPLETE: 10 offsets of the range were not read")
}
