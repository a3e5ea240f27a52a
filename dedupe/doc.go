// Package dedupe is the operations API of the processed_messages table:
// the record of which message ids a consumer has already claimed, written
// in the same Postgres transaction as the message's effects.
//
// A claim is an INSERT ... ON CONFLICT DO NOTHING of (consumer, message_id),
// the consumer named by its number in the consumers table and the id
// compared as bytes. Inside the effect's transaction this is the whole
// trick: if the transaction commits, the id is claimed and the effects are
// applied; if it rolls back or the process dies, neither happened. A second
// delivery of the same id finds the row and is skipped. Two transactions
// claiming the same id at once serialise on the primary key: the second
// waits for the first and then either skips (the first committed) or claims
// (the first rolled back).
//
// Each claim stores a fingerprint of the message's key and value
// (FingerprintOf). The same id arriving with a different fingerprint is not
// a duplicate but a producer bug (an id reused for different content) and
// is reported as a conflict (consumer.FingerprintConflictError), never
// silently skipped.
//
// The consumer package makes the claims; most users never call this
// package. It is for operators' tools and for tests that want to look at
// the table: Store.Lookup reads claims by id, Store.Stats and
// Store.CountBefore count them, Store.Prune deletes old settled ones, and
// Store.Suspects and Store.CountSuspects read the messages suspected of
// being a producer's re-sends.
//
// Each call takes a Querier, which *pgxpool.Pool, *pgx.Conn and pgx.Tx
// all satisfy, rather than one of those types: the call runs on its own
// against a pool, or inside a transaction of the caller's. The package
// declares that interface itself so that its API names only its own types
// and pgx's.
package dedupe
