package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// BenchmarkThroughput measures messages per second through one partition,
// per-message (MaxBatch 1: one transaction and one offset commit per
// message, the loop people write by hand) against batched (MaxBatch 1000),
// with a one-row UPDATE as the effect and with a handler that does nothing
// (the framework's own cost), in the same run:
//
//	go test ./consumer -run '^$' -bench Throughput -benchtime 20000x
//
// The clock runs from the first batch to the last message applied, so group
// join and producing are not counted.
func BenchmarkThroughput(b *testing.B) {
	for _, mode := range []struct {
		name     string
		batch    int
		effect   bool
		suspects bool
	}{
		{"per-message/update", 1, true, true}, {"batched/update", 1000, true, true},
		{"per-message/noop", 1, false, true}, {"batched/noop", 1000, false, true},
		// The suspect-duplicate check's cost, side by side with batched/noop.
		{"batched/noop-without-suspect-check", 1000, false, false},
	} {
		b.Run(mode.name, func(b *testing.B) {
			b.StopTimer()
			e := setup(b, 1)
			e.db.Exec(b, `CREATE TABLE `+e.db.Table("counters")+` (id int PRIMARY KEY, n bigint NOT NULL)`)
			e.db.Exec(b, `INSERT INTO `+e.db.Table("counters")+` VALUES (1, 0)`)
			update := `UPDATE ` + e.db.Table("counters") + ` SET n = n + 1 WHERE id = 1`
			var updates atomic.Int64
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
				if !mode.effect {
					return nil
				}
				updates.Add(1)
				_, err := tx.Exec(ctx, update)
				return err
			})

			w := e.kafka.Writer(e.topic)
			msgs := make([]kafka.Message, 0, 1000)
			for i := 0; i < b.N; i++ {
				id := "b-" + strconv.Itoa(i)
				msgs = append(msgs, msg(0, id, "payload-of-a-hundred-bytes-"+id))
				if len(msgs) == cap(msgs) || i == b.N-1 {
					if err := w.WriteMessages(context.Background(), msgs...); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			w.Close()

			clock := &benchClock{}
			cfg := e.config(h)
			cfg.MaxBatch = mode.batch
			cfg.Hooks = []consumer.Hook{clock}
			if !mode.suspects {
				cfg.SuspectDuplicateWindow = consumer.LeaveUnset
			}
			r := e.start(cfg)
			waitFor(b, 10*time.Minute, "all messages applied", func() bool { return clock.applied.Load() >= int64(b.N) })
			elapsed := time.Duration(clock.last.Load() - clock.first.Load())
			r.stop()
			if n := e.db.Int(b, `SELECT n FROM `+e.db.Table("counters")); n != updates.Load() || mode.effect && n != int64(b.N) {
				b.Fatalf("counter is %d after %d messages", n, b.N)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(elapsed.Nanoseconds())/float64(b.N), "ns/msg")
		})
	}
}

// benchClock records when the first batch started and the last message was
// applied.
type benchClock struct {
	first, last atomic.Int64
	applied     atomic.Int64
	done        atomic.Int64 // applied or dead-lettered
}

func (c *benchClock) OnBatchStart(context.Context, consumer.BatchInfo) {
	c.first.CompareAndSwap(0, time.Now().UnixNano())
}

func (c *benchClock) OnMessageApplied(context.Context, *consumer.Message) {
	c.applied.Add(1)
	c.done.Add(1)
	c.last.Store(time.Now().UnixNano())
}

func (c *benchClock) OnMessageDeadLettered(context.Context, *consumer.Message, consumer.DeadLettered) {
	c.done.Add(1)
	c.last.Store(time.Now().UnixNano())
}

// BenchmarkPoison measures one partition's throughput with 1% of messages
// poison (the handler returns consumer.Permanent, so each is dead-lettered)
// against none, in the same run, with a one-row UPDATE as the effect:
//
//	go test ./consumer -run '^$' -bench Poison -benchtime 20000x
func BenchmarkPoison(b *testing.B) {
	for _, mode := range []struct {
		name  string
		every int // one poison message per every messages; 0: none
	}{{"clean", 0}, {"1pct-poison", 100}} {
		b.Run(mode.name, func(b *testing.B) {
			b.StopTimer()
			e := setup(b, 1)
			e.db.Exec(b, `CREATE TABLE `+e.db.Table("counters")+` (id int PRIMARY KEY, n bigint NOT NULL)`)
			e.db.Exec(b, `INSERT INTO `+e.db.Table("counters")+` VALUES (1, 0)`)
			update := `UPDATE ` + e.db.Table("counters") + ` SET n = n + 1 WHERE id = 1`
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.Key[0] == 'p' {
					return consumer.Permanent(errors.New("poison"))
				}
				_, err := tx.Exec(ctx, update)
				return err
			})
			w := e.kafka.Writer(e.topic)
			var msgs []kafka.Message
			poison := 0
			for i := 0; i < b.N; i++ {
				m := msg(0, "b-"+strconv.Itoa(i), "payload")
				if mode.every > 0 && i%mode.every == mode.every/2 {
					m.Key = []byte("p" + strconv.Itoa(i))
					poison++
				}
				msgs = append(msgs, m)
				if len(msgs) == 1000 || i == b.N-1 {
					if err := w.WriteMessages(context.Background(), msgs...); err != nil {
						b.Fatal(err)
					}
					msgs = msgs[:0]
				}
			}
			w.Close()

			clock := &benchClock{}
			cfg := e.config(h)
			cfg.MaxBatch = 1000
			cfg.Hooks = []consumer.Hook{clock}
			r := e.start(cfg)
			waitFor(b, 10*time.Minute, "all messages through", func() bool { return clock.done.Load() >= int64(b.N) })
			elapsed := time.Duration(clock.last.Load() - clock.first.Load())
			r.stop()
			if n := e.db.Int(b, `SELECT n FROM `+e.db.Table("counters")); n != int64(b.N-poison) {
				b.Fatalf("counter is %d, want %d", n, b.N-poison)
			}
			if n := e.db.Int(b, `SELECT count(*) FROM `+e.db.Table("dead_letters")); n != int64(poison) {
				b.Fatalf("%d dead letters, want %d", n, poison)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
		})
	}
}
