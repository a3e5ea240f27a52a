package main

import (
	"context"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkafetch"
)

// eachPartition runs the loop of the hand-written modes: one goroutine per
// partition fetching batches as kafkaonce does (kafka-go, up to maxBatch
// messages or 5 ms) and passing each to apply, which returns when the batch
// is done; then it records the batch. It returns when the backlog is done,
// ctx ends, or a partition fails.
func eachPartition(ctx context.Context, e *env, c cell, b backlog, rec *recorder, maxBatch int,
	apply func(ctx context.Context, partition int, batch []kafka.Message) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, c.Partitions)
	for p := 0; p < c.Partitions; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- fetchAndApply(ctx, e, b, p, maxBatch, rec, apply)
		}()
	}
	var err error
	select {
	case <-rec.doneCh:
	case err = <-errs:
	case <-ctx.Done():
	}
	cancel()
	wg.Wait()
	return ignoreEnd(ctx, err)
}

func fetchAndApply(ctx context.Context, e *env, b backlog, partition, maxBatch int, rec *recorder,
	apply func(context.Context, int, []kafka.Message) error) error {
	f, err := kafkafetch.Open(kafkafetch.Config{Brokers: e.brokers, Dialer: e.kafkaDialer, Topic: b.topic, Partition: partition,
		Start: kafka.FirstOffset, MaxBatch: maxBatch, Linger: 5 * time.Millisecond, Quiet: kafkafetch.QuietFor(5 * time.Millisecond), MaxBytes: 1 << 20})
	if err != nil {
		return err
	}
	defer f.Close()
	var buf []kafka.Message
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
