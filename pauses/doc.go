// Package pauses is the operations API of the pauses table: a consumer,
// one of its topics or one partition paused at runtime, for an incident
// (a downstream system down, a bad deploy to hold back, a partition to
// inspect).
//
// A paused partition stays assigned to the member that owns it, fetches
// nothing new and holds no transaction open; the batch in progress when
// the pause arrives finishes first. The pause is a row in Postgres, so it
// holds across rebalances and restarts, and a pause written by any process
// (kafkaonce pause, the page, another service) takes effect on whichever
// member owns the partition within a second or so: every running consumer
// reads its pauses each second. consumer.Consumer's Pause and Resume write
// the same rows and tell their own process at once.
//
// A partition is paused while any pause covers it: its own, its topic's or
// the whole consumer's. Resume lifts one pause, at the scope given; a wider
// pause still holds what it covers.
//
// Each call takes a Querier, which *pgxpool.Pool, *pgx.Conn and pgx.Tx
// all satisfy.
package pauses
