package main

import (
	"context"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
)

// eachPartition runs the loop of the hand-written modes: one goroutine per
// partition fetching batches as kafkaonce does (through the Kafka client
// the run's context names, franz-go by default; up to maxBatch messages or
// 5 ms) and passing each to apply, which returns when the batch is done;
// then it records the batch. It returns when the backlog is done, ctx
// ends, or a partition fails.
func eachPartition(ctx context.Context, e *env, c cell, b backlog, rec *recorder, maxBatch int,
	apply func(ctx context.Context, partition int, batch []kafkaclient.Record) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client, err := e.fetchClient(wrapping(ctx).client)
	if err != nil {
		return err
	}
	defer client.Close()
	var wg sync.WaitGroup
	errs := make(chan error, c.Partitions)
	for p := 0; p < c.Partitions; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fetchAndApply(ctx, client, b, p, maxBatch, rec, apply)
		}()
	}
	select {
	case <-rec.doneCh:
	case err = <-errs:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	return ignoreEnd(ctx, err)
}

func fetchAndApply(ctx context.Context, client kafkaclient.Client, b backlog, partition, maxBatch int, rec *recorder,
	apply func(context.Context, int, []kafkaclient.Record) error) error {
	f, err := client.Open(kafkaclient.FetchConfig{Topic: b.topic, Partition: partition,
		Start: 0, MaxBatch: maxBatch, Linger: 5 * time.Millisecond, Quiet: kafkaclient.QuietFor(5 * time.Millisecond)})
	if err != nil {
		return err
	}
	defer f.Close()
	var buf []kafkaclient.Record
	for {
		if buf, err = f.Next(ctx, buf); err != nil {
			return err
		}
		// As kafkaonce's OnBatchStart does: the first batch's own time
		// counts (with a 2 ms effect it is seconds).
		rec.start(time.Now())
		if err := apply(ctx, partition, buf); err != nil {
			return err
		}
		rec.batch()
		now := time.Now()
		for i := range buf {
			if sent, ok := sentAt(buf[i].Headers); ok {
				rec.observe(sent, now)
			}
		}
		rec.add(partition, len(buf), now)
	}
}

// The Kafka clients a run can read with.
const (
	franzGo = "franz-go"
	kafkaGo = "kafka-go"
)

// fetchClient is a Kafka client of the hand-written loops: franz-go
// (name "" or franzGo), one client fetching every partition, as the
// consumer's; or kafka-go, a reader per partition, whose connections the
// wire counters see.
func (e *env) fetchClient(name string) (kafkaclient.Client, error) {
	cfg := kafkaclient.Config{Brokers: e.brokers, FetchMaxBytes: 1 << 20}
	if name == kafkaGo {
		return kafkago.New(cfg, e.kafkaDialer)
	}
	return franz.New(cfg)
}
