// Package outbox delivers messages written in a database transaction, after
// the transaction commits: the transactional outbox.
//
// A kafkaonce handler must not publish to Kafka or call an API directly:
// the handler may run again (its transaction rolled back and retried), and
// the call cannot be rolled back. Instead it writes an outbox row with the
// transaction it was given; the row commits or rolls back with the effect.
// A Relay then delivers committed rows:
//
//   - to a Kafka topic, with the row's id as the message-id header, so a
//     kafkaonce consumer downstream deduplicates a message the relay had to
//     publish twice;
//   - or to a function, typically an HTTP API, with the row's id as the
//     idempotency key, so the provider does the same.
//
// Delivery is at-least-once: a relay that dies between delivering and
// deleting the row delivers it again. Order is kept per key: with several
// relays running, a key's rows are delivered by one relay at a time, in the
// order they were written, and a row waiting for a retry holds back the
// key's later rows. Rows that cannot be delivered (a permanent error, or
// attempts exhausted) are parked with the reason, never dropped: see
// Relay.Failed and Relay.Retry.
package outbox
