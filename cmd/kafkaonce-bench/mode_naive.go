package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The naive loop is what people write by hand: for every message, begin,
// insert the id into a dedupe table ON CONFLICT DO NOTHING, apply the
// effect when the id was new, commit, then commit the Kafka offset
// synchronously.

// runNaiveOne runs the loop on one worker: a single consumer-group member
// reading every partition.
func runNaiveOne(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	table, err := handTable(ctx, e.db, c.Prefilled)
	if err != nil {
		return err
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Dialer: e.kafkaDialer, GroupID: b.topic + "-naive1", Topic: b.topic,
		StartOffset: kafka.FirstOffset, MaxBytes: 1 << 20, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	name := nextConsumerName()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return ignoreEnd(ctx, err)
		}
		rec.start(time.Now())
		rc := kafkaclient.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value}
		for _, h := range m.Headers {
			rc.Headers = append(rc.Headers, consumer.Header(h))
		}
		if err := naiveApply(ctx, e, c, table, name, &rc); err != nil {
			return ignoreEnd(ctx, err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			return ignoreEnd(ctx, err)
		}
		now := time.Now()
		rec.batch()
		if sent, ok := sentAt(m.Headers); ok {
			rec.observe(sent, now)
		}
		rec.add(m.Partition, 1, now)
		if rec.done.Load() >= rec.want {
			return nil
		}
	}
}

// runNaivePerPartition runs the loop with one worker per partition, each
// committing its offsets synchronously after every message.
func runNaivePerPartition(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	table, err := handTable(ctx, e.db, c.Prefilled)
	if err != nil {
		return err
	}
	client := e.kafkaClient()
	group := b.topic + "-naivepp"
	name := nextConsumerName()
	return eachPartition(ctx, e, c, b, rec, 1, func(ctx context.Context, p int, batch []kafkaclient.Record) error {
		if err := naiveApply(ctx, e, c, table, name, &batch[0]); err != nil {
			return err
		}
		return commitOffsets(ctx, client, group, b.topic, map[int]int64{p: batch[0].Offset + 1})
	})
}

// naiveApply is one message's transaction.
func naiveApply(ctx context.Context, e *env, c cell, table, name string, m *kafkaclient.Record) error {
	return pgx.BeginFunc(ctx, e.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, name, messageID(c.IDs, m))
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		return applyOne(ctx, tx, c.Effect, m.Key, m.Value)
	})
}

// commitOffsets commits next offsets for a group that has no members (a
// "simple" commit, generation -1), as a hand-written loop over partition
// readers does.
func commitOffsets(ctx context.Context, client *kafka.Client, group, topic string, next map[int]int64) error {
	req := &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{}}
	for p, off := range next {
		req.Topics[topic] = append(req.Topics[topic], kafka.OffsetCommit{Partition: p, Offset: off})
	}
	res, err := client.OffsetCommit(ctx, req)
	if err != nil {
		return fmt.Errorf("offset commit: %w", err)
	}
	for _, ps := range res.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("offset commit %s/%d: %w", topic, p.Partition, p.Error)
			}
		}
	}
	return nil
}

// ignoreEnd drops the error a run ends with when its context ended it.
func ignoreEnd(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
