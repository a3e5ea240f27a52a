package consumer

import "github.com/kafkaonce/kafkaonce/kafkaoncetype"

// Pruning makes the consumer delete its own old claims from
// processed_messages in the background, every Interval, claims older than
// Retention, Batch at a time (see kafkaoncetype.Pruning). Off unless
// Interval is set.
type Pruning = kafkaoncetype.Pruning
