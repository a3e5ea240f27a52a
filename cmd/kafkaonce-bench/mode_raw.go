package main

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkafetch"
)

// runRaw fetches every partition with kafka-go as kafkaonce does (one
// reader per partition, batches of MaxBatch or 5 ms) and does nothing else:
// the Kafka-side ceiling.
func runRaw(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, c.Partitions)
	for p := 0; p < c.Partitions; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := kafkafetch.Open(kafkafetch.Config{Brokers: e.brokers, Dialer: e.kafkaDialer, Topic: b.topic, Partition: p,
				Start: kafka.FirstOffset, MaxBatch: c.MaxBatch, Linger: 5 * time.Millisecond, MaxBytes: 1 << 20})
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			var buf []kafka.Message
			for {
				buf, err = f.Next(ctx, buf)
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				rec.batch()
				now := time.Now()
				for i := range buf {
					if sent, ok := sentAt(buf[i].Headers); ok {
						rec.observe(sent, now)
					}
				}
				rec.add(len(buf), now)
			}
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
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
