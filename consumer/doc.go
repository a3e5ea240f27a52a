// Package consumer runs Kafka consumers whose effects must happen once.
//
// Kafka delivers messages at least once: after a crash, a rebalance, a lost
// offset commit or a rewind, a message arrives again, and producers that
// retry write the same message twice. A Consumer turns that into an
// exactly-once effect in Postgres. For every batch of a partition it runs ONE
// transaction that
//
//  1. claims each message's id in processed_messages (an insert that finds
//     ids claimed before, by this or any other member);
//  2. calls the Handler, with that transaction, for each newly claimed
//     message, in offset order;
//  3. records the partition's processed position in consumer_offsets;
//  4. commits.
//
// Only after the commit is the offset committed to Kafka. A crash at any
// point leaves either nothing (the batch is delivered again and applied) or
// everything (the next delivery finds the claims and is skipped). The
// guarantee is about effects written with the handler's transaction; see
// docs/guarantee.md in the repository for exactly what is and is not
// promised.
//
// # Writing a handler
//
// A Handler gets the transaction and the message. It writes its effects with
// the transaction and returns nil, or returns an error to roll the message
// back and have it retried. It must not commit, keep the transaction or the
// message, or cause effects outside Postgres directly (see Handler).
//
// A BatchHandler gets the newly claimed messages of a whole batch in one
// call instead, for effects that one statement can apply to many messages;
// statements it queues with Batch.Queue travel with the COMMIT, so a batch
// costs two round trips to Postgres, or one when its messages are all new
// and the handler only queues. ForEachKey runs slow per-message work
// of a batch for many keys at a time, each key's messages in order.
//
// # Message ids
//
// Deduplication is by message id, derived with Config.MessageID: a header
// (the default, DefaultMessageIDHeader), a JSON field, the content hash or
// the log position (each a MessageIDRule), or your own function (a
// MessageIDFunc). The id should be chosen once per logical message at the
// producer. A consumer records its rule when it starts ("json:meta.id"; see
// MessageIDRule), so that kafkaonce audit derives ids as it does; for your
// own function, which no tool can run, the audit must be given --id. The same id arriving with different
// content is reported as a FingerprintConflictError, never skipped
// silently; a message whose id cannot be read fails with
// ErrInvalidMessageID rather than being retried forever. Both are set aside
// by Config.OnPermanentFailure: in the dead_letters table by default, or by
// stopping the partition at them.
//
// # Partitions and ordering
//
// Each partition assigned to this member has its own worker: partitions are
// processed in parallel, each in offset order, one transaction per batch of
// up to Config.MaxBatch messages. Scale out by running more processes with
// the same Config.GroupID; the partition count bounds the parallelism.
//
// # Kafka
//
// The consumer reads Kafka through franz-go by default (Config.KafkaClient):
// committed records only, so records of aborted transactions and
// transaction markers never reach a handler, and a transaction left open
// holds its partition back (HookPartitionHeld). A member joining or leaving
// the group moves only the partitions that change owner; a static member
// (Config.InstanceID) restarted within Config.SessionTimeout causes no
// rebalance at all. kafka-go (KafkaGo) remains for workers built on it, and
// refuses transactional topics (ErrTransactionalTopic). Config.TLS and
// Config.SASL secure the connections (package kafkaconn).
//
// # Hot rows
//
// Batches of different partitions that touch the same rows can deadlock,
// each taking the rows' locks in its own message order. A transaction that
// loses such a race (a deadlock, a serialization failure, a lock timeout)
// runs again shortly with fewer messages, without counting an attempt, and
// for a while the consumer's transactions take turns through an advisory
// lock instead of racing each other (see HookContention). Handlers help by
// locking rows in a stable order, or by using a BatchHandler that locks
// the batch's rows in id order and writes each row once.
//
// # Rewinds and replays
//
// The processed position stored in Postgres only moves forward, and it is
// where a partition's processing starts when it is assigned; the group's
// committed offset is only a copy of it, used when there is no stored
// position yet. So rewinding the consumer group (to replay a topic, say)
// applies nothing twice, even after old processed_messages rows were
// pruned, and a group offset ahead of the stored position (the database
// lost committed transactions) is processed again rather than skipped.
// To skip or replay messages on purpose, move the stored position
// (kafkaonce replay).
//
// # Observability
//
// Logs go to Config.Logger with the keys consumer, topic, partition, offset,
// message_id and attempt. Hooks (see Hook) see batches, messages, conflicts,
// stopped partitions and offset commits, for metrics and tracing.
package consumer
