// Package outbox delivers messages written in a database transaction, after
// the transaction commits: the transactional outbox.
//
// A kafkaonce handler must not publish to Kafka or call an API directly:
// the handler may run again (its transaction rolled back and retried), and
// the call cannot be rolled back. Instead it writes an outbox row with the
// transaction it was given (Outbox.Write), or, from a BatchHandler that
// only queues its statements, queues it with them (Outbox.Queue, keeping
// the batch's one round trip); the row commits or rolls back with the
// effect. Both refuse, before sending anything, a message the table
// cannot store, naming the field.
// A Relay then delivers committed rows:
//
//   - to a Kafka topic, with the row's id as the message-id header, so a
//     kafkaonce consumer downstream deduplicates a message the relay had to
//     publish twice;
//   - or to a function, typically an HTTP API, with the row's id as the
//     idempotency key, so the provider does the same.
//
// Delivery is at-least-once: a relay that dies between delivering and
// deleting the row delivers it again. Order is kept per key (the message
// key, on both paths; no key, nil or empty, is one key): with several
// relays running, a key's rows are delivered by one relay at a time, in
// the order they were written, and a row that failed holds back every
// other row of its key, those written after it included, until it is
// delivered or parked. Rows written by transactions that commit
// concurrently have no order between them but the one the relay sees. A
// failing row holds back nothing else: the other keys keep flowing, and a
// relay with nothing ready sleeps. To
// Kafka the relay publishes with franz-go's idempotent producer, or with
// kafka-go (RelayConfig.KafkaClient), in calls made one after the other,
// and neither client writes a key's message after one of the key's that
// failed (messages without a key go to any partition, and have no order
// in Kafka).
//
// Rows that cannot be delivered (a permanent error, attempts exhausted, or
// a message too large for Kafka ever to take: larger than 1,000,000 bytes
// with its headers, or than the topic's max.message.bytes or
// segment.bytes, parked at its first attempt) are parked
// with the reason, never dropped: see Outbox.Parked and Outbox.Retry.
//
// Each delivery has a deadline, RelayConfig.DeliveryTimeout, since a round
// holds its transaction and its buckets until its deliveries return: a
// receiver that hangs is cut off, and the row retried.
//
// # Observing the relay
//
// RelayConfig.Hooks take values implementing HookDelivered (each row
// delivered, with its latency from created_at), HookDeliveryFailed (each
// failed attempt, with a FailureClass fit for a metric label, and whether
// it parked the row) and HookBacklog (what is left: pending, waiting for a
// retry, parked, the oldest row's age, counted in Postgres every
// BacklogInterval, each count bounded by BacklogLimit so a huge backlog
// stays cheap to count). promhooks.NewRelay and otelhooks.NewRelay turn
// them into metrics (docs/metrics.md); Outbox.Backlog gives the same
// counts on demand, as kafkaonce serve's page shows them.
package outbox
