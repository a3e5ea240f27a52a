package kafkaoncetype

import "time"

// Pruning makes the consumer delete its own old claims from
// processed_messages in the background: every Interval, claims older than
// Retention are deleted in batches of Batch, skipping rows in use, so
// processing is never blocked. Replays stay safe after pruning (the stored
// positions cover them); what pruning narrows is the window in which a
// producer's late re-send of an old message is recognised.
//
// The same pass deletes the schema's expired idempotency keys (package
// idempotency), whichever API stored them.
//
// Without an Interval the consumer does not prune: run the kafkaonce prune
// and kafkaonce keys prune commands instead, or set one.
type Pruning struct {
	// Interval is the time between two prunings, the first when Run
	// starts. Defaults to 0: no background pruning.
	Interval time.Duration
	// Retention is how long a claim is kept. Defaults to
	// dedupe.DefaultRetention (7 days); at least dedupe.MinRetention (1
	// day).
	Retention time.Duration
	// Batch is how many claims one transaction deletes. Defaults to
	// consumer.DefaultPruneBatch.
	Batch int
}
