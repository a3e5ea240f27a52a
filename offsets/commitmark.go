package offsets

import (
	"context"

	"github.com/kafkaonce/kafkaonce/internal/commitmark"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// CommitMark is what a consumer writes into the metadata of each offset it
// commits to Kafka: the store it committed against and where the
// partition's processing first started there.
//
// The group's committed offset is only a copy of the stored position, but
// for a partition with no stored position it is all there is, and the mark
// says what it is a copy of. A group offset marked with this store's id
// (Store.StoreID) and the consumer's name was committed against a position
// this database held and has lost (a restore from an older backup, a
// deleted row): the consumer starts the partition again from First, since
// the transactions that processed the messages below the offset are gone.
// Any other group offset (no mark, another store's, another consumer's)
// the consumer adopts as it is. A tool that predicts where a partition
// will start, as kafkaonce positions forget does, needs the same reading.
type CommitMark struct {
	// Store is the id of the store (Store.StoreID) the offset was
	// committed against.
	Store string
	// Consumer is the name of the consumer that committed it.
	Consumer string
	// First is the offset the partition's processing first started at in
	// that store, or -1 when the committer did not know it (a consumer
	// that found a position stored by a kafkaonce older than the mark).
	First int64
}

// ParseCommitMark reads a mark from the metadata of a committed offset;
// ok is false for metadata that is not a mark (another client's, an
// empty string, a later version of the format).
func ParseCommitMark(metadata string) (m CommitMark, ok bool) {
	cm, ok := commitmark.Parse(metadata)
	if !ok {
		return CommitMark{}, false
	}
	return CommitMark{Store: cm.Store, Consumer: cm.Consumer, First: cm.First}, true
}

// StoreID returns the id that the schema's consumers put in their commit
// marks (CommitMark.Store): a random id made once in the schema, by the
// migration that added it. A restore of the database from a backup brings
// the same id back, while a schema migrated anew gets another.
func (s *Store) StoreID(ctx context.Context, q Querier) (string, error) {
	return schema.StoreID(ctx, q, s.schemaName)
}
