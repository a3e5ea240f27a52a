package consumer

import "github.com/kafkaonce/kafkaonce/kafkaoncetype"

// Pruning makes the consumer delete its own old claims from
// processed_messages in the background, every Interval, claims older than
// Retention, Batch at a time (see kafkaoncetype.Pruning). Off unless
// Interval is set.
type Pruning = kafkaoncetype.Pruning

// A Pruner deletes the rows of another feature's table in the consumer's
// pruning pass, when given in Config.Pruners: idempotency.Store.Pruner()
// prunes the HTTP front door's expired keys (see kafkaoncetype.Pruner).
type Pruner = kafkaoncetype.Pruner
