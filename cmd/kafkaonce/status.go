package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
)

type partitionStatus struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	// LogStart and LogEnd are the log's bounds, -1 when Kafka did not give
	// them (see statusReport.KafkaUnread).
	LogStart int64 `json:"log_start"`
	LogEnd   int64 `json:"log_end"`
	// Committed is the group's committed offset, -1 when none or when
	// Kafka did not give it.
	Committed int64 `json:"kafka_committed"`
	// Stored is the processed position in Postgres, -1 when none.
	Stored int64 `json:"stored_position"`
	// Lag is how many messages are not processed yet, -1 when unknown
	// (Kafka did not give the log's bounds).
	Lag int64 `json:"lag"`
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
	Paused *pauseView `json:"paused,omitempty"`
}

// retriesCount is what status says of the messages set aside to be
// retried later.
type retriesCount struct {
	Waiting int64 `json:"waiting"`
	// NextDue is when the first waiting one is retried.
	NextDue time.Time `json:"next_due,omitzero"`
	Applied int64     `json:"applied_on_retry"`
}

type statusReport struct {
	Consumer      string       `json:"consumer"`
	Group         string       `json:"group"`
	Schema        string       `json:"schema"`
	SchemaVersion int          `json:"schema_version"`
	Claims        dedupe.Stats `json:"claims"`
	// DeadLetters and Pending count the dead letters and the open ones;
	// messages set aside to be retried later are counted in Retries.
	DeadLetters int64             `json:"dead_letters"`
	Pending     int64             `json:"dead_letters_pending"`
	Retries     retriesCount      `json:"retry_later"`
	Suspects    int64             `json:"suspect_duplicates"`
	Keys        keyCounts         `json:"idempotency_keys"`
	Recent      []dedupe.Suspect  `json:"recent_suspect_duplicates,omitempty"`
	Partitions  []partitionStatus `json:"partitions"`
	// Pauses are the consumer's pauses (kafkaonce pause).
	Pauses []pauseView `json:"pauses"`
	// Recorded are the settings the consumer recorded when it last
	// started; absent when it recorded none.
	Recorded *recordedView `json:"recorded_settings,omitempty"`
	// KafkaUnread names, topic by topic, what Kafka did not give and why;
	// the partitions of such a topic show what Postgres holds. Absent when
	// Kafka gave everything.
	KafkaUnread []kafkaUnread `json:"kafka_not_read,omitempty"`
}

// kafkaUnread is what status could not read from Kafka for a topic.
type kafkaUnread struct {
	Topic string `json:"topic"`
	// NotRead lists what is missing: "partitions", "log_bounds",
	// "committed_offsets" (of the report's group).
	NotRead []string `json:"not_read"`
	Error   string   `json:"error"`
}

// Kafka's side of a topic, in the order status reads it: a failure leaves
// the rest unread.
var kafkaReads = []string{"partitions", "log_bounds", "committed_offsets"}

// kafkaProblems says, a line per topic, what Kafka did not give and why.
func (r statusReport) kafkaProblems() []string {
	names := map[string]string{"partitions": "its partitions", "log_bounds": "log bounds", "committed_offsets": "the committed offsets of group " + r.Group}
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
	return lines
}

// recordedView shows a consumer's recorded settings.
type recordedView struct {
	// MessageIDRule is the rule's text, or "custom" for a function of the
	// consumer's own.
	MessageIDRule string    `json:"message_id_rule"`
	Group         string    `json:"group"`
	Topics        []string  `json:"topics"`
	Brokers       []string  `json:"brokers"`
	KafkaTLS      bool      `json:"kafka_tls"`
	KafkaSASL     string    `json:"kafka_sasl,omitempty"`
	RecordedAt    time.Time `json:"recorded_at"`
	// RecordedBy names the worker that recorded them.
	RecordedBy string `json:"recorded_by,omitempty"`
}

func viewOf(rec *recorded.Settings) *recordedView {
	if rec == nil {
		return nil
	}
	return &recordedView{MessageIDRule: rec.MessageIDRule, Group: rec.GroupID, Topics: rec.Topics, Brokers: rec.Brokers,
		KafkaTLS: rec.KafkaTLS, KafkaSASL: rec.KafkaSASL, RecordedAt: rec.RecordedAt, RecordedBy: rec.RecordedBy}
}

func statusCmd(s *settings) *cobra.Command {
	var consumerName, group string
	var topics []string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each partition's log end, committed offset, stored position and lag, and the consumer's claims and dead letters",
		Long: `status shows, for a consumer and each partition of its topics: the log's
start and end, the group's committed offset in Kafka, the processed position
stored in Postgres, and the lag (messages not processed yet); then the
consumer's claims, dead letters and recorded suspect duplicates, and the
settings it recorded when it last started (id rule, group, topics, brokers).

Topics are those the consumer has stored positions for or records, plus any
--topic. The group is --group, else the recorded one, else the consumer's
name.

What Kafka does not give (a topic it does not have, a cluster that does not
answer) is named with why, and the partitions show what Postgres holds; the
exit code is then 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if consumerName == "" {
				return errors.New("--consumer is required: the consumer's Config.Name")
			}
			ctx := cmd.Context()
			c, err := s.connect(ctx, consumerName)
			if err != nil {
				return err
			}
			defer c.close()
			r, err := status(ctx, c.pool, c.admin, s.schema, consumerName, groupOf(group, c.record, consumerName), c.record, topics)
			if err != nil {
				return err
			}
			for i := range r.KafkaUnread {
				r.KafkaUnread[i].Error = s.redact(r.KafkaUnread[i].Error)
			}
			if err := s.emit(r, func(w io.Writer) { printStatus(w, r) }); err != nil {
				return err
			}
			if len(r.KafkaUnread) > 0 {
				return errFindings
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&consumerName, "consumer", "", "the consumer's name (Config.Name)")
	cmd.Flags().StringVar(&group, "group", "", "the consumer group (default: the recorded one, else the consumer's name)")
	cmd.Flags().StringSliceVar(&topics, "topic", nil, "a topic to show (repeatable; default: the topics with stored positions, and the recorded ones)")
	return cmd
}

func status(ctx context.Context, pool *pgxpool.Pool, admin *kafkaadmin.Admin, schemaName, consumerName, group string, rec *recorded.Settings, extra []string) (statusReport, error) {
	r := statusReport{Consumer: consumerName, Group: group, Schema: schemaName, Recorded: viewOf(rec)}
	var err error
	if r.SchemaVersion, err = schema.Version(ctx, pool, schemaName); err != nil {
		return r, err
	}
	if r.SchemaVersion < schema.LatestVersion() {
		return r, fmt.Errorf("schema %s is at version %d, this tool needs %d: run kafkaonce migrate", schemaName, r.SchemaVersion, schema.LatestVersion())
	}
	claims, _ := dedupe.NewStore(schemaName)
	positions, _ := offsets.NewStore(schemaName)
	letters, _ := deadletter.NewStore(schemaName)
	if r.Claims, err = claims.Stats(ctx, pool, consumerName); err != nil {
		return r, err
	}
	lc, err := letters.Count(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	r.DeadLetters, r.Pending = lc.Letters, lc.Open
	r.Retries = retriesCount{Waiting: lc.Waiting, NextDue: lc.NextRetry, Applied: lc.AppliedOnRetry}
	if r.Suspects, err = claims.CountSuspects(ctx, pool, consumerName); err != nil {
		return r, err
	}
	if r.Recent, err = claims.Suspects(ctx, pool, consumerName, 5); err != nil {
		return r, err
	}
	keys, _ := idempotency.NewStore(schemaName)
	counts, err := keys.Count(ctx, pool)
	if err != nil {
		return r, err
	}
	r.Keys = keyCounts(counts)
	stored, err := positions.List(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	tries, _ := attempts.NewStore(schemaName)
	paces, err := tries.Paces(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	stops, err := tries.Stops(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	holds, err := tries.Holds(ctx, pool, consumerName)
	if err != nil {
		return r, err
	}
	// Read with the rest of Postgres, before Kafka, which may use up the
	// time a page's request has.
	paused, err := readPauses(ctx, pool, schemaName, consumerName)
	if err != nil {
		return r, err
	}
	holdOf := map[string]map[int]attempts.HeldPartition{}
	for _, h := range holds {
		if holdOf[h.Topic] == nil {
			holdOf[h.Topic] = map[int]attempts.HeldPartition{}
		}
		holdOf[h.Topic][h.Partition] = h
	}
	stopOf := map[string]map[int]attempts.Stop{}
	for _, st := range stops {
		if stopOf[st.Topic] == nil {
			stopOf[st.Topic] = map[int]attempts.Stop{}
		}
		stopOf[st.Topic][st.Partition] = st
	}
	paceOf := map[string]map[int]attempts.PartitionPace{}
	for _, p := range paces {
		if paceOf[p.Topic] == nil {
			paceOf[p.Topic] = map[int]attempts.PartitionPace{}
		}
		paceOf[p.Topic][p.Partition] = p
	}
	storedAt := map[string]map[int]offsets.Position{}
	topicSet := map[string]bool{}
	for _, p := range stored {
		if storedAt[p.Topic] == nil {
			storedAt[p.Topic] = map[int]offsets.Position{}
		}
		storedAt[p.Topic][p.Partition] = p
		topicSet[p.Topic] = true
	}
	for _, t := range extra {
		topicSet[t] = true
	}
	if rec != nil {
		for _, t := range rec.Topics {
			topicSet[t] = true
		}
	}
	var topics []string
	for t := range topicSet {
		topics = append(topics, t)
	}
	sort.Strings(topics)
	// down names the topic Kafka failed for other than by not having it:
	// each request to a cluster that does not answer waits for its
	// timeout, so the topics after it are not asked.
	down := ""
	for _, topic := range topics {
		var k topicKafka
		if down == "" {
			k = readTopicKafka(ctx, admin, group, topic)
		} else {
			k.unread = &kafkaUnread{Topic: topic, NotRead: slices.Clone(kafkaReads), Error: "not asked after Kafka failed for topic " + down}
		}
		if k.unread != nil {
			r.KafkaUnread = append(r.KafkaUnread, *k.unread)
			var gone *kafkaadmin.NoTopicError
			if down == "" && !errors.As(k.err, &gone) {
				down = topic
			}
		}
		parts := k.parts
		if parts == nil {
			// The partitions Postgres knows of.
			known := map[int]bool{}
			for p := range storedAt[topic] {
				known[p] = true
			}
			for p := range paceOf[topic] {
				known[p] = true
			}
			for p := range stopOf[topic] {
				known[p] = true
			}
			for p := range holdOf[topic] {
				known[p] = true
			}
			for p := range known {
				parts = append(parts, p)
			}
			sort.Ints(parts)
		}
		for _, p := range parts {
			ps := partitionStatus{Topic: topic, Partition: p, LogStart: -1, LogEnd: -1, Committed: -1, Stored: -1, Lag: -1}
			if b, ok := k.bounds[p]; ok {
				ps.LogStart, ps.LogEnd = b.Start, b.End
			}
			if c, ok := k.committed[p]; ok {
				ps.Committed = c
			}
			if v, ok := storedAt[topic][p]; ok {
				ps.Stored = v.Next
				at := v.UpdatedAt
				ps.LastCommit = &at
			}
			if pc, ok := paceOf[topic][p]; ok {
				showPace(&ps, pc)
			}
			if st, ok := stopOf[topic][p]; ok {
				at := st.At
				ps.StoppedAt, ps.StopReason = &at, st.Reason
			}
			if h, ok := holdOf[topic][p]; ok {
				at, since := h.At, h.Since
				ps.HeldAt, ps.HeldSince = &at, &since
			}
			if k.bounds != nil {
				done := max(ps.Committed, ps.Stored, ps.LogStart)
				ps.Lag = max(ps.LogEnd-done, 0)
			}
			r.Partitions = append(r.Partitions, ps)
		}
	}
	addPauses(&r, paused)
	return r, nil
}

// topicKafka is Kafka's side of a topic, as far as it was read: a nil map
// was not read, and unread says what was not, and err why.
type topicKafka struct {
	parts     []int
	bounds    map[int]kafkaadmin.Bounds
	committed map[int]int64
	unread    *kafkaUnread
	err       error
}

// readTopicKafka reads a topic's partitions, their log bounds and group's
// committed offsets, stopping at the first failure.
func readTopicKafka(ctx context.Context, admin *kafkaadmin.Admin, group, topic string) topicKafka {
	var k topicKafka
	fail := func(read int, err error) topicKafka {
		k.err = err
		why := err.Error()
		// "context deadline exceeded" is what a client retrying a dial
		// that cannot work says: the dial's own failure says why.
		if f := admin.Client().Dials().Failing(); f != nil && (f.Cause != kafkaclient.DialFailed || errors.Is(err, context.DeadlineExceeded)) {
			why += ": cannot connect to the brokers: " + f.String()
		} else if errors.Is(err, context.DeadlineExceeded) {
			why += ": the brokers did not answer in time"
		}
		k.unread = &kafkaUnread{Topic: topic, NotRead: slices.Clone(kafkaReads[read:]), Error: why}
		return k
	}
	parts, err := admin.Partitions(ctx, topic)
	if err != nil {
		return fail(0, err)
	}
	k.parts = parts
	if k.bounds, err = admin.LogBounds(ctx, topic, parts); err != nil {
		return fail(1, err)
	}
	if k.committed, err = admin.Committed(ctx, group, topic, parts); err != nil {
		return fail(2, err)
	}
	return k
}

func showPace(ps *partitionStatus, pc attempts.PartitionPace) {
	ps.ContentionRetries = pc.ContentionRetries
	if pc.Adapted {
		limit := pc.BatchLimit
		ps.BatchLimit = &limit
	}
	if !pc.LastContention.IsZero() {
		last := pc.LastContention
		ps.LastContention = &last
	}
	if !pc.SerializedUntil.IsZero() {
		until := pc.SerializedUntil
		ps.SerializedUntil = &until
	}
}

// keyCounts counts the schema's idempotency keys (package idempotency).
type keyCounts struct {
	Total   int64 `json:"total"`
	Expired int64 `json:"expired"`
	Running int64 `json:"running"`
	Stalled int64 `json:"stalled"`
	GivenUp int64 `json:"given_up"`
}

// nextDue says when the first waiting retry is due, if any waits.
func nextDue(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return ", next due at " + at.UTC().Format(time.RFC3339)
}

func printStatus(w io.Writer, r statusReport) {
	fmt.Fprintf(w, "consumer %s (group %s), schema %s at version %d\n", r.Consumer, r.Group, r.Schema, r.SchemaVersion)
	fmt.Fprintf(w, "claims: %d (applied %d, dead-lettered %d, suspect duplicates skipped %d)", r.Claims.Total, r.Claims.Applied, r.Claims.DeadLettered, r.Claims.SuspectDuplicates)
	if r.Claims.Oldest != nil {
		fmt.Fprintf(w, ", oldest %s", r.Claims.Oldest.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "dead letters: %d (%d open: neither redriven nor settled)\n", r.DeadLetters, r.Pending)
	fmt.Fprintf(w, "set aside to retry later: %d waiting%s, %d applied on a retry\n", r.Retries.Waiting, nextDue(r.Retries.NextDue), r.Retries.Applied)
	fmt.Fprintf(w, "suspect duplicates recorded: %d\n", r.Suspects)
	fmt.Fprintf(w, "idempotency keys (HTTP, whole schema): %d (%d expired, %d phased runs in progress, %d of them stalled, %d given up)\n",
		r.Keys.Total, r.Keys.Expired, r.Keys.Running, r.Keys.Stalled, r.Keys.GivenUp)
	printRecorded(w, r)
	printPauses(w, r)
	for _, sp := range r.Recent {
		fmt.Fprintf(w, "  %s/%d/%d %q looks like %q at offset %d\n", sp.Topic, sp.Partition, sp.Offset, sp.MessageID, sp.FirstMessageID, sp.FirstOffset)
	}
	if len(r.Partitions) == 0 {
		if len(r.KafkaUnread) == 0 {
			fmt.Fprintln(w, "no partitions: the consumer has no stored positions and records no topics yet; pass --topic to show a topic")
		}
		printKafkaProblems(w, r)
		return
	}
	var rows [][]string
	var lag int64
	unknownLag := 0
	var contended bool
	now := time.Now()
	for _, p := range r.Partitions {
		if p.Lag < 0 {
			unknownLag++
		} else {
			lag += p.Lag
		}
		batch := "max"
		if p.BatchLimit != nil {
			batch = strconv.Itoa(*p.BatchLimit)
		}
		contention := strconv.FormatInt(p.ContentionRetries, 10)
		if p.LastContention != nil {
			contention += " (last " + p.LastContention.UTC().Format(time.RFC3339) + ")"
		}
		if p.SerializedUntil != nil && p.SerializedUntil.After(now) {
			contention += ", taking turns until " + p.SerializedUntil.UTC().Format(time.RFC3339)
		}
		contended = contended || p.ContentionRetries > 0
		rows = append(rows, []string{p.Topic, strconv.Itoa(p.Partition), optional(p.LogStart), optional(p.LogEnd),
			optional(p.Committed), optional(p.Stored), optional(p.Lag), batch, contention})
	}
	fmt.Fprintln(w)
	table(w, "TOPIC\tPARTITION\tLOG START\tLOG END\tCOMMITTED\tSTORED\tLAG\tBATCH\tCONTENTION RETRIES", rows)
	switch {
	case unknownLag == len(r.Partitions):
		fmt.Fprintln(w, "total lag: unknown (Kafka gave no log end)")
	case unknownLag > 0:
		fmt.Fprintf(w, "total lag: %d, and unknown for %d partitions (Kafka gave no log end)\n", lag, unknownLag)
	default:
		fmt.Fprintf(w, "total lag: %d\n", lag)
	}
	for _, p := range r.Partitions {
		if p.StoppedAt != nil {
			fmt.Fprintf(w, "STOPPED %s/%d since %s: %s\n", p.Topic, p.Partition, p.StoppedAt.UTC().Format(time.RFC3339), firstLine(p.StopReason))
		}
		if p.HeldAt != nil {
			fmt.Fprintf(w, "HELD %s/%d since %s: a producer's open transaction, from offset %d, holds back what follows until it commits or aborts\n",
				p.Topic, p.Partition, p.HeldSince.UTC().Format(time.RFC3339), *p.HeldAt)
		}
	}
	if contended {
		fmt.Fprintln(w, "contention: transactions lost races for rows and ran again with smaller batches; see \"Hot rows\" in docs/design.md")
	}
	printKafkaProblems(w, r)
}

// printKafkaProblems says what Kafka did not give, and that what is shown
// of those topics comes from Postgres.
func printKafkaProblems(w io.Writer, r statusReport) {
	lines := r.kafkaProblems()
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	if len(lines) > 0 {
		fmt.Fprintln(w, "what Kafka did not give shows as -; the stored positions, claims and dead letters are read from Postgres")
	}
}

// printRecorded shows what the consumer recorded when it last started, or
// that the tools fall back to their defaults.
func printRecorded(w io.Writer, r statusReport) {
	v := r.Recorded
	if v == nil {
		fmt.Fprintf(w, "recorded settings: none (the consumer has not started since kafkaonce began recording them): audit assumes --id header:%s, and group, topics and brokers come from flags\n",
			consumer.DefaultMessageIDHeader)
		return
	}
	ids := v.MessageIDRule
	if ids == recorded.Custom {
		ids += " (a function of its own: audit needs --id)"
	}
	kafkaVia := ""
	if v.KafkaTLS {
		kafkaVia += ", TLS"
	}
	if v.KafkaSASL != "" {
		kafkaVia += ", SASL " + v.KafkaSASL
	}
	fmt.Fprintf(w, "recorded settings (by %s, which joined its group %s): ids %s, group %s, topics %s, brokers %s%s\n",
		orDash(v.RecordedBy), v.RecordedAt.UTC().Format(time.RFC3339), ids, v.Group, strings.Join(v.Topics, ","), strings.Join(v.Brokers, ","), kafkaVia)
}
