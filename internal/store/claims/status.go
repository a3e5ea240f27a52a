package claims

import (
	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

// QueueSetStatus adds to b the change of status of claims this transaction
// made, for messages that failed after they were claimed. attempts[i] goes
// with ids[i].
func (s *Store) QueueSetStatus(b *pgx.Batch, consumer string, ids []string, attempts []int32, status dedupe.Status) {
	b.Queue(s.statusSQL, consumer, ids, string(status), attempts)
}

// QueueUnclaim adds to b the removal of claims this transaction made for
// messages it will not process after all (the tail of a batch cut short).
func (s *Store) QueueUnclaim(b *pgx.Batch, consumer string, ids []string) {
	b.Queue(s.unclaimSQL, consumer, ids)
}
