package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// ownKafka starts an in-process broker of the test's own, for tests that
// intercept its requests.
func ownKafka(t *testing.T) *testenv.Kafka {
	t.Helper()
	k, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	return &testenv.Kafka{Kafka: k}
}

// stopOrDrain waits until partition 0 stops, or its stored position
// reaches end (the partition went past the gap), and returns the stop.
func (e *env) stopOrDrain(end int64) *consumer.MessagesDeletedError {
	e.t.Helper()
	waitFor(e.t, 60*time.Second, "the partition stopped, or drained", func() bool {
		return len(e.events.snapshot().stopped) > 0 || e.storedPositions()[0] >= end
	})
	stopped := e.events.snapshot().stopped
	require.Lenf(e.t, stopped, 1, "the partition stopped once (stored position %v, %d effects)", e.storedPositions(), e.effects())
	var d *consumer.MessagesDeletedError
	require.ErrorAs(e.t, stopped[0], &d)
	return d
}

// acceptLoss is what an operator does with a partition stopped by
// ErrMessagesDeleted, the members stopped: move the stored position and
// the group offset to the log start.
func (e *env) acceptLoss(p int, logStart int64) {
	e.t.Helper()
	store, err := offsets.NewStore(e.db.Schema)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(e.t, store.Reset(ctx, e.db.Pool, e.name, e.topic, p, logStart))
	e.kafka.CommitGroupOffsets(e.t, e.group, e.topic, map[int]int64{p: logStart})
}

// kafka-go moves a reader below the log start up to it without an error.
// Here it had fetched offsets 0 to 19 when the handler blocked on offset 0
// (MaxBatch 5: 0-4 in the batch, 5-9 in its queue, 10-19 in the fetch it
// was handing out); 40 more arrive and everything below 50 is deleted;
// released, it asks for 20 and finds the log starting at 50. The gap must
// stop the partition, naming offsets 20 to 49, not be passed silently
// (the stored position at 60, offsets 20 to 49 never processed).
func TestMessagesDeletedWhileTheHandlerIsBlocked(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("a", 20)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.Offset == 0 {
			once.Do(func() { close(entered); <-release })
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.MaxBatch = 5
	r := e.start(cfg)
	<-entered
	ids = append(ids, e.produceIDs("b", 40)...) // offsets 20 to 59
	deleted := &deletions{}
	e.deleteRecordsBefore(deleted, 0, 50)
	close(release)

	e.requireLossOf20To49(r, ids, deleted)
}

// requireLossOf20To49 requires the partition stopped at the deletion of
// offsets 20 to 49 with only what came before committed, then accepts the
// loss as an operator would: the partition drains, and the checker finds
// every message applied or inside the range reported.
func (e *env) requireLossOf20To49(r *running, ids []string, deleted *deletions) {
	t := e.t
	t.Helper()
	d := e.stopOrDrain(60)
	r.stop()
	require.Equal(t, consumer.MessagesDeletedError{Topic: e.topic, Partition: 0, From: 20, To: 49, LogStart: 50}, *d,
		"the stop names the offsets deleted before they were fetched")
	require.Contains(t, d.Error(), "offsets 20 to 49 are gone")
	require.Equal(t, map[int]int64{0: 20}, e.storedPositions(), "the messages before the gap were committed, nothing after it")
	e.requireExactlyOnce(ids[:20])

	e.acceptLossAndDrain(50, 60, ids, deleted)
}

// acceptLossAndDrain accepts the loss of partition 0's messages below
// logStart as an operator would, runs a consumer until the partition is
// committed up to end, and checks every message applied once or inside the
// range reported.
func (e *env) acceptLossAndDrain(logStart, end int64, ids []string, deleted *deletions) {
	e.t.Helper()
	e.acceptLoss(0, logStart)
	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: end}, 60*time.Second)
	r.stop()
	e.check(expectation{ids: ids, deleted: deleted})
}

// The same jump when the reader opens again after a fetch failed: the
// worker reopens its fetcher after an error the broker answers with,
// kafka-go reconnects by itself after a dropped connection. Either way it
// seeks to offset 20, below the new log start, and kafka-go starts at 50.
func TestMessagesDeletedWhileFetchesFail(t *testing.T) {
	t.Parallel()
	for _, drop := range []bool{false, true} {
		name := "the broker answers fetches with an error"
		if drop {
			name = "the broker drops the connection of fetches"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := ownKafka(t)
			e := setupOn(t, 1, k)
			// Fetches from offset 20 fail while failing is set (the test's
			// own reads of the records to delete start at 0, and the
			// consumer's fetches start at 50 once the log does).
			var failing atomic.Bool
			var failed atomic.Int32
			k.Fake.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
				req := kreq.(*kmsg.FetchRequest)
				if failing.Load() && len(req.Topics) == 0 && req.SessionEpoch > 0 {
					// An incremental fetch that names no partition (franz-go's
					// fetch sessions): end the session, so that the next fetch
					// names the partition again.
					k.Fake.KeepControl()
					resp := req.ResponseKind().(*kmsg.FetchResponse)
					resp.ErrorCode = kerr.FetchSessionIDNotFound.Code
					return resp, nil, true
				}
				if !failing.Load() || len(req.Topics) == 0 || len(req.Topics[0].Partitions) == 0 || req.Topics[0].Partitions[0].FetchOffset != 20 {
					return nil, nil, false
				}
				k.Fake.KeepControl()
				failed.Add(1)
				if drop {
					return nil, errors.New("connection lost"), true
				}
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				for _, rt := range req.Topics {
					st := kmsg.NewFetchResponseTopic()
					st.Topic, st.TopicID = rt.Topic, rt.TopicID
					for _, rp := range rt.Partitions {
						sp := kmsg.NewFetchResponseTopicPartition()
						sp.Partition = rp.Partition
						sp.ErrorCode = 56 // KAFKA_STORAGE_ERROR
						st.Partitions = append(st.Partitions, sp)
					}
					resp.Topics = append(resp.Topics, st)
				}
				return resp, nil, true
			})
			ids := e.produceIDs("f", 20)
			r := e.start(e.config(e.applyHandler()))
			waitFor(t, 30*time.Second, "offsets 0 to 19 processed", func() bool { return e.storedPositions()[0] == 20 })
			failing.Store(true)
			waitFor(t, 30*time.Second, "a fetch failed", func() bool { return failed.Load() > 0 })
			ids = append(ids, e.produceIDs("g", 40)...) // offsets 20 to 59
			deleted := &deletions{}
			e.deleteRecordsBefore(deleted, 0, 50)
			// The next attempt seeks to 20, below the log start.
			failing.Store(false)

			e.requireLossOf20To49(r, ids, deleted)
		})
	}
}

// Offsets without a record are no loss: compaction leaves gaps in a
// partition whose log still starts at 0, and the consumer goes across
// them without stopping.
func TestCompactionGapsDoNotStopThePartition(t *testing.T) {
	t.Parallel()
	k := ownKafka(t)
	e := setupOn(t, 1, k)
	e.topic = "compacted"
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	require.NoError(t, err)
	defer cl.Close()
	policy := "compact"
	_, err = kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"cleanup.policy": &policy}, e.topic)
	require.NoError(t, err)
	// Four produce calls, four record batches, ids c-0 to c-13 at offsets
	// 0 to 13: u0 k0 k1 k2 | k0 k1 k2 | u2 k0 k1 k2 | k0 k1 k2 by key.
	// Compaction removes offsets 1 to 6 (keys superseded later); the log
	// still starts at 0.
	var ids []string
	for b := range 4 {
		var msgs []kafka.Message
		keys := []string{"k0", "k1", "k2"}
		if b%2 == 0 {
			keys = append([]string{"u" + strconv.Itoa(b)}, keys...)
		}
		for _, key := range keys {
			id := "c-" + strconv.Itoa(len(ids))
			ids = append(ids, id)
			msgs = append(msgs, kafka.Message{Key: []byte(key), Value: []byte(id),
				Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}})
		}
		e.kafka.Produce(t, e.topic, msgs...)
	}
	k.Fake.Compact()
	bounds := e.logBounds(0)
	require.Equal(t, [2]int64{0, 14}, bounds, "the log still starts at 0")

	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 14}, 60*time.Second)
	r.stop()
	require.Empty(t, e.events.snapshot().stopped)
	remaining := append([]string{ids[0]}, ids[7:]...)
	e.requireExactlyOnce(remaining)
	e.check(expectation{ids: remaining})
}

// logBounds returns partition p's log start and end.
func (e *env) logBounds(p int) [2]int64 {
	e.t.Helper()
	c, err := kafka.DialLeader(context.Background(), "tcp", e.kafka.Brokers[0], e.topic, p)
	require.NoError(e.t, err)
	defer c.Close()
	first, end, err := c.ReadOffsets()
	require.NoError(e.t, err)
	return [2]int64{first, end}
}

// A member paused between its two reads at assignment (read at the same
// time) reads the log end before the pause and the stored position after
// it, when another member has processed further and the log has grown.
// Here the position read waits on a table lock while the log's bounds come
// back (end 40); meanwhile 80 more messages arrive and the position moves
// to 100. The partition must start at 100, not stop with "the stored
// position is 100 but the log ends at 40" (ErrPositionAheadOfLog), which
// would be false.
func TestPausedMemberDoesNotReportAPositionAheadOfTheLog(t *testing.T) {
	t.Parallel()
	k := ownKafka(t)
	e := setupOn(t, 1, k)
	e.produceIDs("p", 40)
	boundsRead := make(chan struct{})
	var once sync.Once
	k.Fake.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ListOffsetsRequest)
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if rt.Topic == e.topic && rp.Timestamp == -1 { // the log end
					// The broker answers right after this returns, before
					// it reads the next request.
					once.Do(func() { close(boundsRead) })
				}
			}
		}
		return nil, nil, false
	})

	ctx := context.Background()
	lock, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, `LOCK TABLE `+e.db.Table("consumer_offsets")+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)

	r := e.start(e.config(e.applyHandler()))
	<-boundsRead
	waitFor(t, 30*time.Second, "the position read waiting on the lock", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, e.db.Table("consumer_offsets")) > 0
	})
	// The pause: another member processes up to 100 while the log grows.
	later := e.produceIDs("q", 80) // offsets 40 to 119
	_, err = lock.Exec(ctx, `INSERT INTO `+e.db.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ($1, $2, 0, 100)`, e.name, e.topic)
	require.NoError(t, err)
	require.NoError(t, lock.Commit(ctx))

	waitFor(t, 60*time.Second, "the partition processed to the end, or stopped", func() bool {
		return e.storedPositions()[0] == 120 || len(e.events.snapshot().stopped) > 0
	})
	r.stop()
	stopped := e.events.snapshot().stopped
	require.Emptyf(t, stopped, "no partition stopped: %v", stopped)
	require.Equal(t, map[int]int64{0: 120}, e.storedPositions())
	e.requireExactlyOnce(later[60:])
	assigned := e.events.snapshot().assigned
	require.Len(t, assigned, 1)
	require.Equal(t, consumer.PartitionAssignment{Topic: e.topic, Partition: 0, KafkaOffset: -1, StoredPosition: 100, LogStart: 0, LogEnd: 120, Start: 100},
		assigned[0], "the assignment was decided from reads made in order")
}

// A partition's first start is stored before its first batch commits: a
// member that takes the partition over (here, the next run of the
// consumer) resumes there, instead of resolving StartEarliest again against
// a log that retention has moved. Before, it started at the new log start,
// and the messages deleted meanwhile, which the first member had begun
// on, were skipped without a word.
func TestMessagesDeletedBeforeTheFirstCommitAreReported(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("a", 10)
	entered := make(chan struct{})
	var once sync.Once
	blocked := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	r := e.start(e.config(blocked))
	<-entered
	deleted := &deletions{}
	e.deleteRecordsBefore(deleted, 0, 6)
	r.stop()
	require.Equal(t, map[int]int64{0: 0}, e.storedPositions(), "the first start is stored, nothing processed")

	r = e.start(e.config(e.applyHandler()))
	d := e.stopOrDrain(10)
	r.stop()
	require.Equal(t, consumer.MessagesDeletedError{Topic: e.topic, Partition: 0, From: 0, To: 5, LogStart: 6}, *d,
		"the next run reports the messages deleted since the first start")

	e.acceptLossAndDrain(6, 10, ids, deleted)
}

// With StartLatest, the first start is the log's end then: messages
// produced after it are processed even when the partition changes hands
// before anything was committed, not skipped by resolving the end again.
func TestStartLatestResumesAtTheFirstStart(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("old", 3)
	cfg := e.config(e.applyHandler())
	cfg.StartOffset = consumer.StartLatest
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the partition to be assigned", func() bool { return len(e.events.snapshot().assigned) > 0 })
	r.stop()
	require.Equal(t, map[int]int64{0: 3}, e.storedPositions(), "the first start, the log's end, is stored")

	ids := e.produceIDs("new", 4)
	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 7}, 60*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
}
