package outbox_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// BenchmarkRelay measures the relay publishing to Kafka (the in-process
// broker unless KAFKA_BROKERS is set), in one run:
//
//   - drain: events/s emptying a backlog of b.N rows over 64 keys;
//
//   - steady: the delay from writing a row (in a committed transaction of 50
//     rows) to its publication, at a constant 5,000 rows/s, as p50/p99.
//
//     go test ./outbox -run '^$' -bench Relay -benchtime 50000x
func BenchmarkRelay(b *testing.B) {
	b.Run("drain", func(b *testing.B) {
		b.StopTimer()
		db := testenv.NewDB(b)
		k := testenv.NewKafka(b)
		topic := k.Topic(b, 4)
		o, _ := outbox.New(db.Schema)
		for i := 0; i < b.N; i += 1000 {
			var msgs []outbox.Message
			for j := i; j < min(i+1000, b.N); j++ {
				msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("k" + strconv.Itoa(j%64)), Value: make([]byte, 100)})
			}
			if _, err := o.Write(context.Background(), db.Pool, msgs...); err != nil {
				b.Fatal(err)
			}
		}
		var delivered sync.WaitGroup
		delivered.Add(b.N)
		began := time.Now()
		r, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, KafkaClient: kafkaClient(), Brokers: k.Brokers, Logger: quiet, LockBuckets: outbox.Buckets,
			BatchSize: 2000, OnDelivered: func(string, time.Time) { delivered.Done() }})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		delivered.Wait()
		elapsed := time.Since(began)
		cancel()
		<-done
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "events/s")
	})

	b.Run("steady-5000-per-s", func(b *testing.B) {
		b.StopTimer()
		db := testenv.NewDB(b)
		k := testenv.NewKafka(b)
		topic := k.Topic(b, 4)
		o, _ := outbox.New(db.Schema)
		var mu sync.Mutex
		var delays []time.Duration
		r, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, KafkaClient: kafkaClient(), Brokers: k.Brokers, Logger: quiet, LockBuckets: outbox.Buckets,
			OnDelivered: func(_ string, created time.Time) {
				d := time.Since(created)
				mu.Lock()
				delays = append(delays, d)
				mu.Unlock()
			}})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		const perTx, rate = 50, 5000
		tick := time.NewTicker(time.Second * perTx / rate)
		written := 0
		for ; written < b.N; written += perTx {
			<-tick.C
			err := pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
				var msgs []outbox.Message
				for j := range perTx {
					msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("k" + strconv.Itoa((written+j)%64)), Value: make([]byte, 100)})
				}
				_, err := o.Write(context.Background(), tx, msgs...)
				return err
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		tick.Stop()
		for {
			mu.Lock()
			n := len(delays)
			mu.Unlock()
			if n >= written {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		<-done
		slices.Sort(delays)
		p := func(q float64) float64 { return float64(delays[int(q*float64(len(delays)-1))].Microseconds()) / 1000 }
		b.ReportMetric(p(0.5), "p50-ms")
		b.ReportMetric(p(0.99), "p99-ms")
		b.ReportMetric(float64(len(delays)), "events")
	})
}
