// Package dedupe owns the processed_messages table: the record of which
// message ids a consumer has already claimed, written in the same Postgres
// transaction as the message's effects.
//
// A claim is an INSERT ... ON CONFLICT DO NOTHING of (consumer, message_id),
// the consumer named by its number in the consumers table (see
// Store.NumberConsumer) and the id compared as bytes.
// Inside the effect's transaction this is the whole trick: if the
// transaction commits, the id is claimed and the effects are applied; if it
// rolls back or the process dies, neither happened. A second delivery of the
// same id finds the row and is skipped. Two transactions claiming the same id
// at once serialise on the primary key: the second waits for the first and
// then either skips (the first committed) or claims (the first rolled back).
//
// Each claim stores a fingerprint of the message's key and value. The same
// id arriving with a different fingerprint is not a duplicate but a producer
// bug (an id reused for different content) and is reported as a conflict by
// Store.Lookup's callers, never silently skipped.
//
// Most users never call this package: the consumer package drives it. It is
// public for operators' tools and for tests that want to look at the table.
package dedupe
