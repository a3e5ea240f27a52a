// Package letters writes dead_letters for the consumer: the letters of
// messages it sets aside, inserted in the batch's transaction (QueueInsert,
// queued on a pgx.Batch to share the round trip), and what became of them
// since: published to the dead-letter topic (MarkPublished), redriven
// (GetForUpdate, MarkRedriven) or not (MarkRedriveFailed). See package
// deadletter for what a letter holds, and for the reads operators use.
package letters
