package main

import (
	"context"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// runRaw fetches every partition with kafka-go as kafkaonce does (one
// reader per partition, batches of MaxBatch or 5 ms) and does nothing else:
// the Kafka-side ceiling.
func runRaw(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	return eachPartition(ctx, e, c, b, rec, c.MaxBatch, func(context.Context, int, []kafkaclient.Record) error { return nil })
}
