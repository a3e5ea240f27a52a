// Package consumerstatus reads what kafkaonce status prints and the
// operator's page (package opspage) shows of a consumer: Postgres's side
// (claims, dead letters, positions, stops, holds, pauses) and Kafka's (log
// bounds, committed offsets), each partition's lag from both, and what
// Kafka did not give, with why.
package consumerstatus

import (
	"fmt"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

type Partition struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// LogStart and LogEnd are the log's bounds, -1 when Kafka did not give
	// them (see Report.KafkaUnread).
	LogStart int64 `json:"log_start"`
	LogEnd   int64 `json:"log_end"`
	// Committed is the group's committed offset, -1 when none or when
	// Kafka did not give it (and always for a share group, which commits
	// none).
	Committed int64 `json:"kafka_committed"`
	// Stored is the processed position in Postgres, -1 when none.
	Stored int64 `json:"stored_position"`
	// Lag is how many messages are not processed yet, -1 when unknown
	// (Kafka did not give the log's bounds). For a share group it is the
	// share lag, -1 where the broker gives none.
	Lag int64 `json:"lag"`
	// ShareStart is a share group's share-partition start offset (every
	// record below it is settled: accepted, rejected or archived), and
	// ShareLag its share lag as the broker reports it (records not yet
	// delivered and settled; -1 from a broker before KIP-1226). Absent for
	// a consumer group, and for a partition the share group has not read.
	ShareStart *int64 `json:"share_start,omitempty"`
	ShareLag   *int64 `json:"share_lag,omitempty"`
	// StoppedAt is set while the partition is stopped at a message it
	// must not skip (its run recorded it; the next assignment clears it),
	// and StopReason says why.
	StoppedAt  *time.Time `json:"stopped_at,omitempty"`
	StopReason string     `json:"stop_reason,omitempty"`
	// HeldAt is set while a producer's open transaction holds the
	// partition back: the offset of its first record, where processing
	// waits since HeldSince (the run records it once the wait passed the
	// consumer's OpenTransactionAfter).
	HeldAt    *int64     `json:"held_at,omitempty"`
	HeldSince *time.Time `json:"held_since,omitempty"`
	// LastCommit is when a transaction of the consumer last moved the
	// stored position (the position's updated_at); absent with no position.
	LastCommit *time.Time `json:"last_commit,omitempty"`
	// BatchLimit is the most messages the partition's transactions cover
	// now, when contention made its run adapt; absent otherwise (its
	// batches are then Config.MaxBatch).
	BatchLimit *int `json:"batch_limit,omitempty"`
	// ContentionRetries counts the transactions of the partition's current
	// (or last) run that lost a race for rows and ran again.
	ContentionRetries int64 `json:"contention_retries"`
	// LastContention is when the last of them lost.
	LastContention *time.Time `json:"last_contention,omitempty"`
	// SerializedUntil is until when the consumer's transactions take turns
	// at its gate, as this partition last saw it.
	SerializedUntil *time.Time `json:"serialized_until,omitempty"`
	// Paused is the pause that holds the partition, if one does.
	Paused *PauseView `json:"paused,omitempty"`
}

// Retries is what status says of the messages set aside to be
// retried later.
type Retries struct {
	Waiting int64 `json:"waiting"`
	// NextDue is when the first waiting one is retried.
	NextDue time.Time `json:"next_due,omitzero"`
	Applied int64     `json:"applied_on_retry"`
}

type Report struct {
	Consumer string `json:"consumer"`
	Group    string `json:"group"`
	// GroupType is the kind of group: "consumer", or "share" when the
	// consumer recorded a share group (recorded.Settings.GroupType).
	GroupType     string       `json:"group_type"`
	Schema        string       `json:"schema"`
	SchemaVersion int          `json:"schema_version"`
	Claims        dedupe.Stats `json:"claims"`
	// DeadLetters and Pending count the dead letters and the open ones;
	// messages set aside to be retried later are counted in Retries.
	DeadLetters int64            `json:"dead_letters"`
	Pending     int64            `json:"dead_letters_pending"`
	Retries     Retries          `json:"retry_later"`
	Suspects    int64            `json:"suspect_duplicates"`
	Keys        KeyCounts        `json:"idempotency_keys"`
	Recent      []dedupe.Suspect `json:"recent_suspect_duplicates,omitempty"`
	Partitions  []Partition      `json:"partitions"`
	// Share is what the broker says of a share group: its members and
	// settings. Absent for a consumer group.
	Share *ShareView `json:"share_group,omitempty"`
	// ConsumerGroup is what the broker says of a consumer group: its
	// protocol and members. Absent for a share group, and for a consumer
	// with no topics to show.
	ConsumerGroup *GroupView `json:"consumer_group,omitempty"`
	// Pauses are the consumer's pauses (kafkaonce pause).
	Pauses []PauseView `json:"pauses"`
	// Recorded are the settings the consumer recorded when it last
	// started; absent when it recorded none.
	Recorded *RecordedView `json:"recorded_settings,omitempty"`
	// KafkaUnread names, topic by topic, what Kafka did not give and why;
	// the partitions of such a topic show what Postgres holds. Absent when
	// Kafka gave everything.
	KafkaUnread []Unread `json:"kafka_not_read,omitempty"`
}

// Unread is what status could not read from Kafka for a topic.
type Unread struct {
	Topic string `json:"topic"`
	// NotRead lists what is missing: "partitions", "log_bounds",
	// "committed_offsets" (of the report's group).
	NotRead []string `json:"not_read"`
	Error   string   `json:"error"`
}

// Kafka's side of a topic, in the order status reads it: a failure leaves
// the rest unread. A share group has share-partition offsets rather than
// committed offsets.
var (
	kafkaReads = []string{"partitions", "log_bounds", "committed_offsets"}
	shareReads = []string{"partitions", "log_bounds", "share_offsets"}
)

func readsOf(share bool) []string {
	if share {
		return shareReads
	}
	return kafkaReads
}

// KafkaProblems says, a line per topic, what Kafka did not give and why.
func (r Report) KafkaProblems() []string {
	names := map[string]string{"partitions": "its partitions", "log_bounds": "log bounds", "committed_offsets": "the committed offsets of group " + r.Group,
		"share_offsets": "the share-partition offsets of share group " + r.Group}
	var lines []string
	for _, u := range r.KafkaUnread {
		var what []string
		for _, n := range u.NotRead {
			what = append(what, names[n])
		}
		list := strings.Join(what, ", ")
		if i := strings.LastIndex(list, ", "); i >= 0 {
			list = list[:i] + " and " + list[i+2:]
		}
		lines = append(lines, fmt.Sprintf("KAFKA NOT READ for topic %s: %s (%s)", u.Topic, list, u.Error))
	}
	if r.Share != nil && r.Share.Error != "" {
		lines = append(lines, fmt.Sprintf("KAFKA NOT READ for share group %s: its members or settings (%s)", r.Group, r.Share.Error))
	}
	if r.ConsumerGroup != nil && r.ConsumerGroup.Error != "" {
		lines = append(lines, fmt.Sprintf("KAFKA NOT READ for group %s: its members (%s)", r.Group, r.ConsumerGroup.Error))
	}
	return lines
}

// RecordedView shows a consumer's recorded settings.
type RecordedView struct {
	// MessageIDRule is the rule's text, or "custom" for a function of the
	// consumer's own.
	MessageIDRule string `json:"message_id_rule"`
	Group         string `json:"group"`
	// GroupType is "consumer" or "share".
	GroupType  string    `json:"group_type"`
	Topics     []string  `json:"topics"`
	Brokers    []string  `json:"brokers"`
	KafkaTLS   bool      `json:"kafka_tls"`
	KafkaSASL  string    `json:"kafka_sasl,omitempty"`
	RecordedAt time.Time `json:"recorded_at"`
	// RecordedBy names the worker that recorded them.
	RecordedBy string `json:"recorded_by,omitempty"`
}

func viewOf(rec *recorded.Settings) *RecordedView {
	if rec == nil {
		return nil
	}
	return &RecordedView{MessageIDRule: rec.MessageIDRule, Group: rec.GroupID, GroupType: rec.GroupType, Topics: rec.Topics, Brokers: rec.Brokers,
		KafkaTLS: rec.KafkaTLS, KafkaSASL: rec.KafkaSASL, RecordedAt: rec.RecordedAt, RecordedBy: rec.RecordedBy}
}

// Incomplete reports whether Kafka did not give part of the report.
func (r Report) Incomplete() bool {
	return len(r.KafkaUnread) > 0 || (r.Share != nil && r.Share.Error != "") || (r.ConsumerGroup != nil && r.ConsumerGroup.Error != "")
}

// KeyCounts counts the schema's idempotency keys (package idempotency).
type KeyCounts struct {
	Total   int64 `json:"total"`
	Expired int64 `json:"expired"`
	Running int64 `json:"running"`
	Stalled int64 `json:"stalled"`
	GivenUp int64 `json:"given_up"`
}
