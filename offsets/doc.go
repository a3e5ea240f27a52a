// Package offsets owns the consumer_offsets table: for each (consumer, topic,
// partition) the offset of the next message to process, written in the same
// Postgres transaction as the effects of the messages before it.
//
// This processed position is the source of truth for "how far has this
// consumer got". The offset committed to Kafka is only a copy, written after
// the database commit and allowed to lag behind (or to be rewound by an
// operator). When a partition is assigned, the consumer starts at the larger
// of the two, so a rewound consumer group skips everything it already
// processed without calling the handler, even after the processed_messages
// rows of those messages were pruned.
//
// Advance only ever moves a position forward. Reset moves it anywhere and is
// meant for operators who deliberately want messages processed again.
package offsets
