package kafkaclient_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// clients are the two clients every test of this file runs against.
var clients = []string{"franz-go", "kafka-go"}

// eachClient runs test once per client, as parallel subtests.
func eachClient(t *testing.T, test func(t *testing.T, client string)) {
	t.Parallel()
	for _, name := range clients {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, name)
		})
	}
}

func newClient(t *testing.T, name string, brokers []string) kafkaclient.Client {
	t.Helper()
	cfg := kafkaclient.Config{Brokers: brokers, MaxBatch: 100, FetchMaxBytes: 1 << 20}
	if os.Getenv("KAFKAONCE_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug - 4}))
	}
	var c kafkaclient.Client
	var err error
	if name == "kafka-go" {
		c, err = kafkago.New(cfg, nil)
	} else {
		c, err = franz.New(cfg)
	}
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// setup bundles a test's client and broker.
type setup struct {
	t      *testing.T
	k      *testenv.Kafka
	client kafkaclient.Client
}

func newSetup(t *testing.T, name string, k *testenv.Kafka) *setup {
	return &setup{t: t, k: k, client: newClient(t, name, k.Brokers)}
}

// partitionOf produces n messages with values "0".."n-1" to partition 0 of
// a new topic.
func (s *setup) partitionOf(n int) string {
	s.t.Helper()
	topic := s.k.Topic(s.t, 1)
	s.produce(topic, 0, n)
	return topic
}

func (s *setup) produce(topic string, from, to int) {
	s.t.Helper()
	var msgs []kafka.Message
	for i := from; i < to; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i))})
	}
	s.k.Produce(s.t, topic, msgs...)
}

func (s *setup) open(topic string, start int64, maxBatch int, linger, quiet time.Duration, processed func(context.Context) (int64, error)) *kafkaclient.Fetcher {
	s.t.Helper()
	f, err := s.client.Open(kafkaclient.FetchConfig{Topic: topic, Start: start, MaxBatch: maxBatch,
		Linger: linger, Quiet: quiet, Processed: processed})
	require.NoError(s.t, err)
	s.t.Cleanup(f.Close)
	return f
}

// readUntilError reads batches until Next fails, requiring consecutive
// offsets from start, and returns the offset expected next and the error.
func readUntilError(t *testing.T, f *kafkaclient.Fetcher, start int64) (int64, error) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	next := start
	for {
		batch, err := f.Next(ctx, nil)
		for _, m := range batch {
			require.Equal(t, next, m.Offset, "offsets handed out in order, none skipped")
			next++
		}
		if err != nil {
			return next, err
		}
	}
}

func TestBatches(t *testing.T) {
	// A batch goes as soon as the partition has nothing more to give, not
	// after the whole linger time. Without the quiet time this Next would
	// wait out the context (the linger is longer still) and take 20
	// seconds.
	t.Run("EndWhenThePartitionGoesQuiet", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			s := newSetup(t, client, testenv.NewKafka(t))
			f := s.open(s.partitionOf(5), 0, 100, time.Minute, 100*time.Millisecond, nil)
			ctx := testenv.Context(t, 20*time.Second)
			began := time.Now()
			batch, err := f.Next(ctx, nil)
			require.NoError(t, err)
			require.Len(t, batch, 5)
			require.Less(t, time.Since(began), 10*time.Second, "Next waited for the linger (or the context) instead of ending when no message came for 100ms")
		})
	})
	// Records that are ready fill batches to MaxBatch: the quiet time only
	// ends a batch when the records run out, and never loses one.
	t.Run("FillUpFromReadyRecords", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			s := newSetup(t, client, testenv.NewKafka(t))
			f := s.open(s.partitionOf(500), 0, 200, 2*time.Second, 200*time.Millisecond, nil)
			ctx := testenv.Context(t, time.Minute)
			var sizes []int
			for next := int64(0); next < 500; {
				batch, err := f.Next(ctx, nil)
				require.NoError(t, err)
				for _, m := range batch {
					require.Equal(t, next, m.Offset, "a record was skipped or repeated")
					require.Equal(t, strconv.FormatInt(next, 10), string(m.Value))
					next++
				}
				sizes = append(sizes, len(batch))
			}
			require.Equal(t, []int{200, 200, 100}, sizes, "ready records did not fill the batches")
		})
	})
}

func TestDeletedRecords(t *testing.T) {
	// The records fetched before a deletion go out, then the fetcher
	// stops at the gap (kafka-go skips from offset 20 to the log start in
	// its read loop; franz-go is told the offset is out of range).
	t.Run("WhileReading", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			s := newSetup(t, client, testenv.NewKafka(t))
			topic := s.partitionOf(20)
			f := s.open(topic, 0, 5, time.Second, 100*time.Millisecond, nil)
			// The first batch is taken; the client holds the rest of its
			// first fetch (offsets 5 to 19).
			batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
			require.NoError(t, err)
			require.Len(t, batch, 5)
			s.produce(topic, 20, 60)
			s.k.DeleteRecordsBefore(t, topic, 0, 50)

			next, err := readUntilError(t, f, 5)
			var d *kafkaclient.DeletedError
			require.ErrorAs(t, err, &d)
			require.Equal(t, int64(20), next, "every record fetched before the deletion went out")
			require.Equal(t, kafkaclient.DeletedError{Topic: topic, Partition: 0, From: 20, LogStart: 50}, *d)
			_, again := f.Next(context.Background(), nil)
			require.Equal(t, err, again, "the fetcher stays at the gap")
		})
	})
	t.Run("BeforeTheFetcherOpened", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			s := newSetup(t, client, testenv.NewKafka(t))
			topic := s.partitionOf(60)
			s.k.DeleteRecordsBefore(t, topic, 0, 50)
			f := s.open(topic, 20, 100, time.Second, 100*time.Millisecond, nil)
			next, err := readUntilError(t, f, 20)
			var d *kafkaclient.DeletedError
			require.ErrorAs(t, err, &d)
			require.Equal(t, int64(20), next, "nothing handed out")
			require.Equal(t, int64(20), d.From)
			require.Equal(t, int64(50), d.LogStart)
		})
	})
	// A reader that was paused while another processed the partition past
	// the deletion (the stored position says so) has lost nothing: it goes
	// on from the log start.
	t.Run("AfterTheyWereProcessed", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			s := newSetup(t, client, testenv.NewKafka(t))
			topic := s.partitionOf(60)
			s.k.DeleteRecordsBefore(t, topic, 0, 50)
			for _, c := range []struct {
				processed int64
				wantErr   bool
			}{{50, false}, {60, false}, {49, true}} {
				t.Run(fmt.Sprint("processed=", c.processed), func(t *testing.T) {
					f := s.open(topic, 20, 100, time.Second, 100*time.Millisecond, func(context.Context) (int64, error) { return c.processed, nil })
					batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
					if c.wantErr {
						var d *kafkaclient.DeletedError
						require.ErrorAs(t, err, &d)
						require.Equal(t, int64(49), d.From, "the loss starts at the processed position")
						return
					}
					require.NoError(t, err)
					require.Len(t, batch, 10)
					require.Equal(t, int64(50), batch[0].Offset)
				})
			}
		})
	})
}

// compactedTopic makes a compacted partition whose offsets 1 to 6 hold no
// record any more while the log still starts at 0: offsets 0, 7, 8, ... 13
// remain.
func compactedTopic(t *testing.T) (*testenv.Kafka, string) {
	t.Helper()
	dk, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = dk.Close() })
	k := &testenv.Kafka{Kafka: dk}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.DefaultProduceTopic("compacted"))
	require.NoError(t, err)
	defer cl.Close()
	ctx := testenv.Context(t, 30*time.Second)
	policy := "compact"
	_, err = kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &policy}, "compacted")
	require.NoError(t, err)
	// Four produce calls, four record batches: u0 k0 k1 k2 | k0 k1 k2 |
	// u2 k0 k1 k2 | k0 k1 k2. Compaction drops the superseded keys of the
	// first two batches and leaves the last ones.
	for b := range 4 {
		var rs []*kgo.Record
		if b%2 == 0 {
			rs = append(rs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", b), Value: []byte("unique")})
		}
		for j := range 3 {
			rs = append(rs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", j), Value: fmt.Appendf(nil, "%d/%d", b, j)})
		}
		require.NoError(t, cl.ProduceSync(ctx, rs...).FirstErr())
	}
	k.Fake.Compact()
	return k, "compacted"
}

func TestOffsetsWithoutARecord(t *testing.T) {
	// Offsets without a record (compaction) are no loss: the batch goes on
	// across them. franz-go's fetch says where the log starts, which
	// explains the gap; kafka-go's does not, and one lookup does.
	t.Run("CompactionGap", func(t *testing.T) {
		eachClient(t, func(t *testing.T, client string) {
			k, topic := compactedTopic(t)
			s := newSetup(t, client, k)
			var lookups int
			f := s.open(topic, 0, 100, time.Second, 100*time.Millisecond, func(context.Context) (int64, error) { lookups++; return 0, nil })
			batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
			require.NoError(t, err)
			var offsets []int64
			for _, m := range batch {
				offsets = append(offsets, m.Offset)
			}
			require.Equal(t, []int64{0, 7, 8, 9, 10, 11, 12, 13}, offsets)
			want := map[string]int{"franz-go": 0, "kafka-go": 1}[client]
			require.Equal(t, want, lookups, "lookups to explain the batch's gap")
		})
	})
	// When the gap cannot be looked into, the records before it go out and
	// the lookup's error comes next; nothing after the gap goes out. (Only
	// kafka-go's gaps need a lookup.)
	t.Run("GapThatCannotBeLookedInto", func(t *testing.T) {
		t.Parallel()
		k, topic := compactedTopic(t)
		s := newSetup(t, "kafka-go", k)
		f := s.open(topic, 0, 100, time.Second, 100*time.Millisecond, nil)
		down := errors.New("broker unreachable")
		kafkaclient.SetBounds(f, func(context.Context) (kafkaclient.Bounds, error) { return kafkaclient.Bounds{}, down })
		next, err := readUntilError(t, f, 0)
		require.ErrorIs(t, err, down)
		require.Equal(t, int64(1), next, "offset 0 went out, nothing after the gap")
	})
}
