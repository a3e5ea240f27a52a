// Package deadletter owns the dead_letters table: messages a consumer set
// aside because they could not be applied (a permanent error, retries
// exhausted, an invalid id, an id reused for different content, a handler
// that kept crashing the process).
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
// The consumer package writes letters and redrives them (Consumer.Redrive);
// this package reads and lists them for operators' tools.
package deadletter
