package kafkaoncetype

import "time"

// Health is what a consumer's probes report (consumer.Consumer.Health).
type Health struct {
	// Live is false when a loop of the consumer is wedged: a partition
	// with messages waiting has made no progress (no fetch returned, no
	// transaction tried, no handler called) for Config.StallAfter, or the
	// member has been out of its group that long. A restart is the cure;
	// Kubernetes' liveness probe does it.
	Live bool `json:"live"`
	// Ready is false while Run is not running, the member is not in its
	// consumer group, or Postgres does not answer.
	Ready bool `json:"ready"`
	// Problems say what makes the consumer not live or not ready, one
	// line each, naming the partition or the part.
	Problems []string `json:"problems"`
	// Running is set between Run's start and its return; InGroup once the
	// member has joined its group, until it leaves or loses it.
	Running bool `json:"running"`
	InGroup bool `json:"in_group"`
	// Partitions counts the partitions this member processes; Paused how
	// many of them a pause holds.
	Partitions int `json:"partitions"`
	Paused     int `json:"paused"`
	// Stopped lists the partitions of this member that stopped at what
	// they must not pass (a message that could not be set aside, records
	// deleted unprocessed, a topic re-created: a *PartitionError), as
	// "topic/partition: reason", sorted. They wait for an operator: a
	// restart stops them again, so they make the consumer neither
	// unlive nor unready.
	Stopped []string `json:"stopped"`
	// DatabaseError is the last Postgres check's failure, "" when it
	// answered.
	DatabaseError string `json:"database_error,omitempty"`
	// LastDialError is the last failed connection to a broker, while
	// connections to it fail (nil once one works again): what a member
	// that cannot join its group meets, in words ("TLS handshake failed:
	// is the broker's listener TLS?").
	LastDialError *DialError `json:"last_dial_error,omitempty"`
	// Group is, for a consumer group member, the member as its client
	// last heard from the group coordinator; nil in a share group.
	Group *GroupHealth `json:"group,omitempty"`
	// Share is, for a share group member, what it holds; nil in a
	// consumer group.
	Share *ShareHealth `json:"share,omitempty"`
	// CheckedAt is when the report was made.
	CheckedAt time.Time `json:"checked_at"`
}

// GroupHealth is a consumer group member as its client last heard from
// the group coordinator: what `kafkaonce status` lists for each member,
// from this side.
type GroupHealth struct {
	// Protocol is the group protocol the member speaks: "classic" or
	// "consumer" (Config.GroupProtocol).
	Protocol string `json:"protocol"`
	// MemberID is the member's id in the group; "" before it joined.
	MemberID string `json:"member_id"`
	// Generation is the number the broker checks each of the member's
	// offset commits against: the group's generation under the classic
	// protocol, the member's epoch under the consumer protocol. 0 before
	// the member joined.
	Generation int32 `json:"generation"`
}

// ShareHealth is what a share group member holds now: Kafka reports
// neither a member's records in flight nor their delivery counts.
type ShareHealth struct {
	// Held counts the records of the member's last poll not settled yet:
	// in flight on this member, under its acquisition locks.
	Held int `json:"held"`
	// OnLastDelivery counts those of them on their last delivery (the
	// group's share.delivery.count.limit): each has its provisional dead
	// letter, and is archived by the broker if this member does not
	// settle it.
	OnLastDelivery int `json:"on_last_delivery"`
}

// DialError is a broker's connections failing, as Health reports it.
type DialError struct {
	// Broker is the address dialed, host:port.
	Broker string `json:"broker"`
	// Cause says what the failure most likely means, and what to check.
	Cause string `json:"cause"`
	// Error is the last attempt's error, as the Kafka client gave it.
	Error string `json:"error"`
	// Since is the first failed attempt in a row, At the last one, and
	// Attempts how many failed in a row.
	Since    time.Time `json:"since"`
	At       time.Time `json:"at"`
	Attempts int       `json:"attempts"`
}
