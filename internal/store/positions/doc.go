// Package positions writes consumer_offsets for the consumer: the stored
// position of each partition, moved forward in the transaction of the batch
// below it (see package offsets for what a position means, and for what
// operators do with them).
//
// The statements are queued on a pgx.Batch (the Queue methods), or given as
// SQL expressions to share a SELECT with others, so that the consumer sends
// them in the same round trip as its others: QueueLoad reads a position,
// QueueLock reads and locks it, QueueAdvance and AdvanceChecked move it
// forward, and QueueOpen and QueueClose bracket a batch so that nothing a
// handler does can commit it early. Failures the consumer tells apart carry
// the SQLSTATEs CheckFailed and TxEnded.
package positions
