package main

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// runKafkaonce runs a kafkaonce consumer with the cell's effect as a
// per-message Handler: the way most handlers are written.
func runKafkaonce(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return applyOne(ctx, tx, c.Effect, m.Key, m.Value)
	})
	return runConsumer(ctx, e, c, b, rec, "kafkaonce", func(cfg *consumer.Config) { cfg.Handler = h })
}

// runKafkaonceBatch runs a kafkaonce consumer with the cell's effect as a
// BatchHandler that queues the same set-based UPDATE the optimum runs: the
// fair comparison with the hand-written batched loop.
func runKafkaonceBatch(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	h := consumer.BatchHandlerFunc(func(ctx context.Context, bt *consumer.Batch) error {
		switch c.Effect {
		case effectUpdate:
			// A slice per call: partitions call concurrently, and the queued
			// statement reads it when the batch is sent.
			accs := make([]int32, len(bt.Messages))
			for i, m := range bt.Messages {
				accs[i] = accountOf(m.Key)
			}
			bt.Queue(updateSetSQL, accs)
		case effectTransfer:
			// The optimum's two statements: the batch's accounts locked in
			// id order, then the net change of each. A set per call, as for
			// the UPDATE.
			var t transferSet
			for _, m := range bt.Messages {
				t.add(m.Value)
			}
			bt.Queue(transferLockSQL, t.accounts())
			bt.Queue(transferBatchSQL, t.src, t.dst)
		case effectWait:
			time.Sleep(time.Duration(len(bt.Messages)) * 2 * time.Millisecond)
		}
		return nil
	})
	return runConsumer(ctx, e, c, b, rec, "kafkaonce-batch", func(cfg *consumer.Config) { cfg.BatchHandler = h })
}

// runKafkaonceKeys is runKafkaonceBatch with the slow part of the effect
// (the 2 ms wait) run for up to 32 keys at a time by consumer.ForEachKey:
// per-key concurrency inside a partition.
func runKafkaonceKeys(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	h := consumer.BatchHandlerFunc(func(ctx context.Context, bt *consumer.Batch) error {
		return consumer.ForEachKey(ctx, bt.Messages, 32, func(context.Context, int, *consumer.Message) error {
			time.Sleep(2 * time.Millisecond)
			return nil
		})
	})
	return runConsumer(ctx, e, c, b, rec, "kafkaonce-keys", func(cfg *consumer.Config) { cfg.BatchHandler = h })
}

func runConsumer(ctx context.Context, e *env, c cell, b backlog, rec *recorder, mode string, handler func(*consumer.Config)) error {
	return runMembers(ctx, e, c, b, rec, mode, 1, &kafkaonceHooks{rec: rec}, handler)
}

// runMembers runs members consumers of one Name and one group, each
// configured by handler, progress feeding rec from their hooks; more
// than one member only in a share group.
func runMembers(ctx context.Context, e *env, c cell, b backlog, rec *recorder, mode string, members int, progress consumer.Hook, handler func(*consumer.Config)) error {
	schema, err := kafkaonceSchema(ctx, e.db, c.Prefilled)
	if err != nil {
		return err
	}
	cfg := &consumer.Config{
		Name:     nextConsumerName(),
		Brokers:  e.brokers,
		Topics:   []string{b.topic},
		GroupID:  b.topic + "-" + mode + wrapping(ctx).group,
		Schema:   schema,
		MaxBatch: c.MaxBatch,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Hooks:    append([]consumer.Hook{progress}, wrapping(ctx).hooks...),
	}
	if wrapping(ctx).client == kafkaGo {
		// kafka-go dials through the wire counters, which count its
		// offset commits.
		cfg.KafkaClient, cfg.Dialer = consumer.KafkaGo, e.kafkaDialer
	} else {
		// franz-go dials by itself: its offset commits are counted as the
		// consumer reports them, one per request.
		cfg.Hooks = append(cfg.Hooks, &commitCounter{n: &e.wire.offsetCommits})
	}
	if e.verbose {
		cfg.Logger = e.log
	}
	handler(cfg)
	if c.IDs == idPosition {
		cfg.MessageID = consumer.IDFromPosition()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, members)
	for i := range members {
		member := *cfg
		co, err := consumer.New(e.db, &member)
		if err != nil {
			cancel()
			for range i {
				<-done
			}
			return err
		}
		go func() { done <- co.Run(ctx) }()
	}
	var first error
	select {
	case <-rec.doneCh:
	case first = <-done:
		members--
	case <-ctx.Done():
	}
	cancel()
	for range members {
		if err := <-done; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// commitCounter counts the consumer's offset commits.
type commitCounter struct{ n *atomic.Int64 }

func (c *commitCounter) OnOffsetsCommitted(context.Context, []consumer.TopicPartitionOffset, error) {
	c.n.Add(1)
}

// kafkaonceHooks feed the recorder from kafkaonce's hooks, which run after
// each transaction commits.
type kafkaonceHooks struct{ rec *recorder }

func (k *kafkaonceHooks) OnBatchStart(context.Context, consumer.BatchInfo) {
	k.rec.start(time.Now())
}

// OnBatchEnd records a committed batch; the partition's progress (for
// the longest stall) only counts when something committed.
func (k *kafkaonceHooks) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err != nil {
		return
	}
	k.rec.batch()
	k.rec.add(b.Partition, r.Applied+r.Skipped, time.Now())
}

func (k *kafkaonceHooks) OnMessageApplied(_ context.Context, m *consumer.Message) {
	if sent, ok := sentAt(m.Headers); ok {
		k.rec.observe(sent, time.Now())
	}
}
