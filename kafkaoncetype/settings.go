package kafkaoncetype

import "time"

// KafkaClient selects the library the consumer speaks Kafka with.
type KafkaClient int

const (
	// FranzGo is github.com/twmb/franz-go, the default. It reads committed
	// records only: records of aborted transactions and transaction
	// markers are never handed out, and a partition waits at a
	// transaction still open (see PartitionHeld). Its group rebalances
	// cooperatively (a member joining or leaving moves only the partitions
	// that change owner, the others go on), a member can be static (the
	// consumer's InstanceID), and a topic re-created under a running
	// consumer stops its partitions with ErrTopicRecreated.
	FranzGo KafkaClient = iota
	// KafkaGo is github.com/segmentio/kafka-go, for workers built on it. It
	// cannot read topics written by transactional producers: it hands out
	// records of aborted transactions, and markers, which stop the
	// partition with ErrTransactionalTopic. Every rebalance stops every
	// partition of every member (eager), it has no static membership, and
	// a topic re-created under a running consumer is noticed only while
	// the new log is shorter than the old position. docs/design.md
	// compares the two.
	KafkaGo
)

func (k KafkaClient) String() string {
	if k == KafkaGo {
		return "kafka-go"
	}
	return "franz-go"
}

// GroupType says which kind of Kafka group the consumer is a member of.
type GroupType int

const (
	// ConsumerGroup is Kafka's consumer group, the default: each partition
	// is assigned to one member, read in order, and the consumer's position
	// in it is stored in Postgres with the effects.
	ConsumerGroup GroupType = iota
	// ShareGroup is a share group (KIP-932, Kafka 4.2 and later): any
	// number of members share a partition, the broker hands each record to
	// one of them under an acquisition lock, and each record is accepted
	// on its own once its transaction has committed. There is no order,
	// not even per key, and no position: each record's effect happens at
	// most once, and every record is applied, found already claimed, or
	// set aside. docs/guarantee.md says what it gives up.
	ShareGroup
)

func (g GroupType) String() string {
	if g == ShareGroup {
		return "share"
	}
	return "consumer"
}

// GroupProtocol says which protocol a consumer group's members speak to
// the broker's group coordinator.
type GroupProtocol int

const (
	// ClassicProtocol is the protocol every Kafka broker speaks, the
	// default: the members join and sync, and one of them assigns the
	// partitions (kafkaonce's franz-go members cooperatively, moving only
	// the partitions that change owner).
	ClassicProtocol GroupProtocol = iota
	// ConsumerProtocol is the next-generation consumer group protocol
	// (KIP-848, Kafka 4.0 and later; 4.3 or later recommended): the
	// broker assigns the partitions, members heartbeat instead of joining
	// and syncing, a partition moves without any member stopping, and the
	// broker checks every offset commit against the member's epoch. The
	// group's session timeout and heartbeat interval are the group's own
	// configs (consumer.session.timeout.ms, consumer.heartbeat.interval.ms)
	// rather than the member's.
	ConsumerProtocol
)

func (p GroupProtocol) String() string {
	if p == ConsumerProtocol {
		return "consumer"
	}
	return "classic"
}

// StartOffset says where a partition starts when neither Kafka nor Postgres
// has a position for it.
type StartOffset int

const (
	// StartEarliest starts at the oldest message still in the log: nothing
	// already produced is missed. The default.
	StartEarliest StartOffset = iota
	// StartLatest starts at the next message produced. A partition added
	// to a topic after the consumer first started on it starts at its
	// beginning all the same: every message in it came after that start.
	StartLatest
)

// FailurePolicy says what happens to a message that cannot be applied: one
// whose handler failed permanently or ran out of attempts, whose id is
// invalid, or whose id was already used for different content.
type FailurePolicy int

const (
	// DeadLetter sets the message aside in the dead_letters table, in the
	// same transaction that moves the partition past it, and goes on. The
	// default: one poison message must not stop a partition.
	DeadLetter FailurePolicy = iota
	// StopPartition stops the partition at the message (see PartitionError)
	// for workers where skipping a message is worse than stopping.
	StopPartition
)

// SuspectPolicy says what to do with a suspect duplicate: a message whose
// content was seen in the same partition shortly before under another id.
type SuspectPolicy int

const (
	// ReportSuspects applies the message and reports it (a warning log, the
	// suspect-duplicate hook, the suspect_duplicates table). The default:
	// identical messages can be legitimate (two equal transfers).
	ReportSuspects SuspectPolicy = iota
	// SkipSuspects treats it as a duplicate: the handler does not run, its
	// id is claimed as suspect_duplicate, and it is reported as above.
	SkipSuspects
)

// SuspectWindowMessages bounds the suspect-duplicate memory: the last this
// many messages of each partition.
const SuspectWindowMessages = 20000

// LeaveUnset, given as a session timeout, leaves the server's or role's
// setting in force instead of setting one; given as the suspect-duplicate
// window, it turns detection off.
const LeaveUnset time.Duration = -1

// DefaultSchema is the Postgres schema kafkaonce's tables live in unless a
// consumer or a tool is given another.
const DefaultSchema = "kafkaonce"
