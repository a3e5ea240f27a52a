// Package deadletter is the operations API of the dead_letters table:
// messages a consumer set aside because they could not be applied (a
// permanent error, retries exhausted, an invalid id, an id reused for
// different content, a handler that kept crashing the process).
//
// A letter holds the whole message — topic, partition, offset, key, value,
// headers — with the error's class and text, the attempts made and when. It
// is written in the same transaction that marks the message dead-lettered in
// processed_messages and moves the partition past it, so a poison message is
// never lost and never blocks its partition.
//
// A letter is one message, not one offset. The same message set aside twice
// (a batch run again after an unknown COMMIT outcome) gives one letter; a
// different message at the offset of a letter (a topic deleted and
// re-created, its stored positions reset) gets its own. Letters are told
// apart by position, content fingerprint (the one dedupe.FingerprintOf
// computes), message id and message timestamp, so two letters may share a
// topic, partition and offset; Letter.ID names each.
//
// The consumer package writes letters and redrives them (Consumer.Redrive).
// This package is for operators' tools: Store.List, Store.Get and
// Store.Count read letters, Store.Footprints tells which messages of a
// partition have one, and Store.RequestRedrive asks the running consumer to
// redrive letters (a tool has no handler to run them with).
//
// Each call takes a Querier, which *pgxpool.Pool, *pgx.Conn and pgx.Tx
// all satisfy, rather than one of those types: the call runs on its own
// against a pool, or inside a transaction of the caller's. The package
// declares that interface itself so that its API names only its own types
// and pgx's.
package deadletter
