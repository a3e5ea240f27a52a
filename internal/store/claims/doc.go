// Package claims writes processed_messages for the consumer: the claims of
// a batch's message ids, made in the batch's transaction (see package
// dedupe for what a claim means, and for the reads operators use).
//
// The statements are queued on a pgx.Batch (the Queue methods), so that
// the consumer sends them in the same round trip as its others:
// QueueClaim and QueueClaimNew claim a batch, QueueExpectClaimed checks
// claims of messages skipped as re-sent, QueueSetStatus and QueueUnclaim
// settle claims of messages that failed or were not processed after all,
// and QueueSuspects records suspected producer re-sends. Claim and Reclaim
// run a claim on its own; NumberConsumer numbers a consumer's name, which
// rows name their consumer by.
package claims
