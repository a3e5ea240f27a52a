package kafkaclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// ShareMember is a member of a share group (KIP-932), as the engine will
// drive it. In a share group the members share partitions: the broker
// hands each record to one member under an acquisition lock, and the
// member settles each record itself (there are no offsets to commit). A
// record whose lock runs out is delivered again, to any member; after the
// group's delivery count limit (see kafkaadmin.ShareGroupSettings) the
// broker archives it instead.
//
// The promise needs one thing the client libraries do not give: a record
// must not be accepted before the transaction that claimed it has
// committed. franz-go accepts, on its next poll, every record of the
// previous poll that was not acknowledged, so polling early would accept
// records whose effects may yet roll back. A ShareMember therefore refuses
// to Poll (ErrUnsettled) until every record of the last poll has been
// settled (accepted, released or rejected) and a Flush has brought the
// client's answer for them. Should a record slip through anyway, the
// implementation releases it before it polls, so that the worst case is a
// delivery again, never an accept.
//
// A ShareMember is used by one goroutine at a time.
type ShareMember interface {
	// Poll waits until the broker hands this member records, and returns
	// them, or until ctx is done. It fails with ErrUnsettled while records
	// of the last poll are unsettled or their settlements not flushed.
	Poll(ctx context.Context) ([]ShareRecord, error)
	// Settle settles records of the last poll. Accept, Release and Reject
	// are final: a record is settled once. Renew extends a record's lock
	// (it stays unsettled) and may be repeated after each Flush. Settle
	// fails, changing nothing, for a record not of the last poll or
	// already settled.
	Settle(s Settlement, ids ...RecordID) error
	// Flush sends the settlements made since the last Flush and waits for
	// the broker's answer to each. It returns a *SettleError naming every
	// record the broker (or the client) did not take: an accept whose lock
	// had run out among them. Those records are settled all the same: the
	// broker delivers them again or has already.
	Flush(ctx context.Context) error
	// Close leaves the group. Records still unsettled are released, for
	// another member to take at once.
	Close(ctx context.Context) error
}

// ShareConfig says which share group a ShareMember joins.
type ShareConfig struct {
	Group  string
	Topics []string
	// MaxRecords bounds how many records one Poll acquires (0: 500). No
	// more are acquired until the next Poll, so that no lock runs while
	// its record waits in a buffer.
	MaxRecords int
}

// RecordID names a record in its log.
type RecordID struct {
	TopicPartition
	Offset int64
}

func (id RecordID) String() string { return fmt.Sprintf("%s/%d@%d", id.Topic, id.Partition, id.Offset) }

// ShareRecord is a record as a share group hands it out.
type ShareRecord struct {
	RecordID
	Key     []byte
	Value   []byte
	Headers []kafkaoncetype.Header
	// Time is the timestamp Kafka stored with the record.
	Time time.Time
	// DeliveryCount is 1 on the record's first delivery and counts every
	// delivery since, to this member or another.
	DeliveryCount int
	// LockedUntil is when the broker's acquisition lock runs out, as the
	// broker said when it handed the record out (its clock less the time
	// on the way): the member should settle, or renew, well before.
	LockedUntil time.Time
}

// Settlement is what a member tells the broker to do with a record.
type Settlement int8

const (
	// Accept: the record is done, for good.
	Accept Settlement = iota + 1
	// Release: deliver the record again (counting a delivery).
	Release
	// Reject: the record is archived, never delivered again.
	Reject
	// Renew: extend the record's acquisition lock; it stays unsettled.
	Renew
)

func (s Settlement) String() string {
	switch s {
	case Accept:
		return "accept"
	case Release:
		return "release"
	case Reject:
		return "reject"
	case Renew:
		return "renew"
	}
	return fmt.Sprintf("Settlement(%d)", s)
}

// Final reports whether s settles a record (everything but Renew).
func (s Settlement) Final() bool { return s >= Accept && s <= Reject }

// ErrUnsettled is Poll's refusal while records of the last poll are
// unsettled, or settled and not flushed.
var ErrUnsettled = errors.New("kafka: records of the last poll are unsettled")

// SettleError is Flush's answer for settlements the broker did not take.
type SettleError struct {
	Failed []SettleFailure
}

// SettleFailure is one settlement the broker did not take, and why.
type SettleFailure struct {
	Record     RecordID
	Settlement Settlement
	Err        error
}

func (e *SettleError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka: %d settlements not taken:", len(e.Failed))
	for i, f := range e.Failed {
		if i == 5 {
			fmt.Fprintf(&b, " and %d more", len(e.Failed)-i)
			break
		}
		fmt.Fprintf(&b, " %s of %s (%v);", f.Settlement, f.Record, f.Err)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// Unwrap returns the failures' causes, for errors.Is.
func (e *SettleError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// ErrNoAnswer is a SettleFailure's cause when the client gave no answer for
// the record's partition: the settlement may not have reached the broker.
var ErrNoAnswer = errors.New("kafka: no answer from the client for the settlement")
