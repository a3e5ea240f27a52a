// Package offsets is the operations API of the consumer_offsets table: for
// each (consumer, topic, partition) the offset of the next message to
// process, written in the same Postgres transaction as the effects of the
// messages before it.
//
// This processed position is the source of truth for "how far has this
// consumer got". The offset committed to Kafka is only a copy, written after
// the database commit and allowed to lag behind (or to be rewound by an
// operator). When a partition is assigned, the consumer starts at the larger
// of the two, so a rewound consumer group skips everything it already
// processed without calling the handler, even after the processed_messages
// rows of those messages were pruned.
//
// The consumer package moves positions, and only ever forward. This package
// reads them (Store.Load, Store.List, Store.Consumers) and, for operators
// who deliberately want messages processed again, sets them anywhere
// (Store.Reset) or deletes a topic's (Store.Forget); and, for a topic
// deleted and re-created, starts the new one afresh (Store.TopicRecreated).
// It also reads the mark a consumer commits with each group offset
// (ParseCommitMark, Store.StoreID), which says where a partition that has
// no stored position starts.
//
// Each call takes a Querier, which *pgxpool.Pool, *pgx.Conn and pgx.Tx
// all satisfy, rather than one of those types: the call runs on its own
// against a pool, or inside a transaction of the caller's. The package
// declares that interface itself so that its API names only its own types
// and pgx's.
package offsets
