package consumer

import (
	"context"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// RedriveFilter selects the dead letters of this consumer to redrive. Only
// open letters are considered: not redriven yet, and not settled by an
// operator. Zero fields select everything.
type RedriveFilter struct {
	// IDs selects these letters.
	IDs []int64
	// Topic, and Partition when HasPartition, select by source.
	Topic        string
	Partition    int
	HasPartition bool
	// Class selects by error class.
	Class deadletter.Class
	// Requested selects letters an operator asked to redrive (kafkaonce
	// dead-letters redrive). A running consumer redrives those by itself.
	Requested bool
	// Limit bounds how many letters one call redrives (default 100).
	Limit int
}

// RedriveResult says what a redrive did.
type RedriveResult = kafkaoncetype.RedriveResult

// RedriveError is the failure of one letter's redrive.
type RedriveError = kafkaoncetype.RedriveError

// Redrive runs dead letters of this consumer through its handler again,
// typically after the bug or the outage that set them aside was fixed. Each
// letter gets a transaction of its own that locks the letter, claims its
// message id again (dead-lettered → applied), runs the handler and marks the
// letter redriven: redriving a letter twice, even at the same time from two
// processes, applies it once.
//
// A redrive runs outside the partition's order: the partition went on past
// the message when it was set aside. Redrive needs no Kafka connection and
// may run while the consumer runs, in this process or another.
func (c *Consumer) Redrive(ctx context.Context, f RedriveFilter) (RedriveResult, error) {
	return c.engine.Redrive(ctx, deadletter.Filter{
		IDs: f.IDs, Topic: f.Topic, Partition: f.Partition, HasPartition: f.HasPartition,
		Class: f.Class, RedriveRequested: f.Requested, Limit: f.Limit,
	})
}
