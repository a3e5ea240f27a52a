package offsets

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Recreated is what TopicRecreated changed.
type Recreated struct {
	// Positions is how many partitions' positions were set to 0; Dropped
	// how many of partitions the new topic does not have were deleted.
	Positions, Dropped int64
	// RetiredClaims and RetiredLetters count the claims and dead letters
	// of the old topic's messages whose id was their position, renamed to
	// RetiredSuffix's form.
	RetiredClaims, RetiredLetters int64
	// Attempts is how many records of failed attempts of the old topic's
	// messages were deleted.
	Attempts int64
	// Suffix is what the retired ids were given.
	Suffix string
	// Kept counts the partitions left as they were: their position
	// counts in the new topic already (see TopicRecreatedAs).
	Kept int64
}

// TopicRecreated prepares a consumer's records for a topic that was
// deleted and created again, before the consumer starts on it: the new
// topic's offsets start at 0 again, and its messages are other messages
// than the old one's at the same offsets.
//
//   - The position of each of the new topic's partitions (0 to
//     partitions-1) is set to 0, and those of partitions it no longer has
//     are deleted. The old topic's id kept with each position is
//     cleared: the next member assigned the partition stores the new
//     topic's.
//   - Claims and dead letters whose message id is the message's own
//     position ("topic/partition/offset", as consumer.IDFromPosition
//     derives it) are renamed: the id gets RetiredSuffix(at) appended.
//     Otherwise the new topic's messages, whose positions repeat the old
//     ones, would meet the old claims: each would be taken for a copy of
//     an old message with other content and set aside as a conflict. The
//     records stay, under their new names, for audits and redrives of
//     the old messages. Ids of any other kind (a producer's header, a
//     JSON field, a hash) are left alone: they name the same operation in
//     either topic, and their claims go on deduping it.
//   - Records of failed attempts of the old topic's messages are deleted:
//     they are keyed by offset, and would count against the new message
//     at the same offset.
//
// It runs as one statement, so it changes all of that or nothing. Run it
// while no consumer of that name processes the topic. (A producer whose
// own header ids happen to be exactly "topic/partition/offset" of each
// message has them retired too: such ids are positions.)
//
// A partition the new topic has and the old one had not is processed from
// its first message as soon as a member is assigned it, and its position
// then carries the new topic's id; TopicRecreated moves it back to 0 and
// retires its claims, so its messages would be applied again. Use
// TopicRecreatedAs with the new topic's id (kafkaonce topic-recreated
// reads it from Kafka) to leave such partitions as they are.
func (s *Store) TopicRecreated(ctx context.Context, q Querier, consumer, topic string, partitions int) (Recreated, error) {
	return s.TopicRecreatedAs(ctx, q, consumer, topic, partitions, [16]byte{})
}

// TopicRecreatedAs is TopicRecreated for the re-created topic of id (Kafka's
// topic id; the zero id for none): partitions whose position already
// counts in that topic (processed since the re-creation) keep their
// position, claims, letters and attempt records. Every other position
// loses its topic id, and the next member assigned the partition stores
// the new topic's.
func (s *Store) TopicRecreatedAs(ctx context.Context, q Querier, consumer, topic string, partitions int, id [16]byte) (Recreated, error) {
	if partitions < 1 {
		return Recreated{}, fmt.Errorf("offsets: topic %s re-created with %d partitions: a topic has at least one", topic, partitions)
	}
	r := Recreated{Suffix: RetiredSuffix(time.Now())}
	newID := pgtype.UUID{Bytes: id, Valid: id != [16]byte{}}
	err := q.QueryRow(ctx, `WITH
kept AS (
	SELECT partition FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND topic_id = $5),
positions AS (
	INSERT INTO `+s.table+` AS o (consumer, topic, partition, next_offset)
	SELECT $1, $2, p, 0 FROM generate_series(0, $3 - 1) AS p
	WHERE p NOT IN (SELECT partition FROM kept)
	ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = 0, topic_id = NULL, updated_at = now()
	RETURNING 1),
dropped AS (
	DELETE FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition >= $3 RETURNING 1),
claims AS (
	UPDATE `+s.claims+` SET message_id = message_id || $4
	WHERE consumer_id = (SELECT id FROM `+s.consumers+` WHERE name = $1) AND topic = $2
	  AND message_id = topic || '/' || partition || '/' || kafka_offset
	  AND partition NOT IN (SELECT partition FROM kept)
	RETURNING 1),
letters AS (
	UPDATE `+s.letters+` SET message_id = message_id || $4
	WHERE consumer = $1 AND topic = $2 AND message_id = topic || '/' || partition || '/' || kafka_offset
	  AND partition NOT IN (SELECT partition FROM kept)
	RETURNING 1),
attempts AS (
	DELETE FROM `+s.attempts+` WHERE consumer = $1 AND topic = $2 AND partition NOT IN (SELECT partition FROM kept) RETURNING 1)
SELECT (SELECT count(*) FROM positions), (SELECT count(*) FROM dropped), (SELECT count(*) FROM claims),
	(SELECT count(*) FROM letters), (SELECT count(*) FROM attempts), (SELECT count(*) FROM kept)`,
		consumer, topic, partitions, r.Suffix, newID).Scan(&r.Positions, &r.Dropped, &r.RetiredClaims, &r.RetiredLetters, &r.Attempts, &r.Kept)
	if err != nil {
		return Recreated{}, fmt.Errorf("offsets: topic %s re-created: %w", topic, err)
	}
	return r, nil
}

// RetiredSuffix is what TopicRecreated appends to the ids of the old
// topic's messages: the time of the retirement, so that a topic re-created
// twice retires each generation under a name of its own, and the ids stay
// readable ("orders/0/17 (retired 2026-12-02T18:20:00.000Z)").
func RetiredSuffix(at time.Time) string {
	return " (retired " + at.UTC().Format("2006-01-02T15:04:05.000Z") + ")"
}

// tables are the tables of the schema that TopicRecreated changes besides
// consumer_offsets.
func tables(schemaName string) (claims, consumers, letters, attempts string) {
	return schema.Table(schemaName, "processed_messages"), schema.Table(schemaName, "consumers"),
		schema.Table(schemaName, "dead_letters"), schema.Table(schemaName, "message_attempts")
}
