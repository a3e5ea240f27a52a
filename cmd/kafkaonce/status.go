package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// What status prints, read by internal/consumerstatus, which the page
// (package opspage) shows too.
type (
	statusReport    = consumerstatus.Report
	partitionStatus = consumerstatus.Partition
	kafkaUnread     = consumerstatus.Unread
	pauseView       = consumerstatus.PauseView
)

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

For a consumer group, status shows the group's members as the broker
reports them: each one's client, host and partitions, and under the
consumer group protocol (KIP-848) the group epoch and each member's epoch
and protocol (a group migrating lists its classic members too).

For a share group (the consumer recorded Config.GroupType ShareGroup),
status shows the group's members as the broker reports them and its
settings (delivery limit, lock duration, start, isolation), and for each
partition the share-partition start offset and share lag in place of the
committed offset, stored position and lag.

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
			r, err := consumerstatus.Read(ctx, c.pool, c.admin, s.schema, consumerName, groupOf(group, c.record, consumerName), c.record, topics)
			if err != nil {
				return err
			}
			for i := range r.KafkaUnread {
				r.KafkaUnread[i].Error = s.redact(r.KafkaUnread[i].Error)
			}
			if r.Share != nil {
				r.Share.Error = s.redact(r.Share.Error)
			}
			if r.ConsumerGroup != nil {
				r.ConsumerGroup.Error = s.redact(r.ConsumerGroup.Error)
			}
			if err := s.emit(r, func(w io.Writer) { printStatus(w, r) }); err != nil {
				return err
			}
			if r.Incomplete() {
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

// nextDue says when the first waiting retry is due, if any waits.
func nextDue(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return ", next due at " + at.UTC().Format(time.RFC3339)
}

func printStatus(w io.Writer, r statusReport) {
	kind := "group"
	if r.Share != nil {
		kind = "share group"
	}
	fmt.Fprintf(w, "consumer %s (%s %s), schema %s at version %d\n", r.Consumer, kind, r.Group, r.Schema, r.SchemaVersion)
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
	printShare(w, r)
	printGroup(w, r)
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
	if r.Share != nil {
		printSharePartitions(w, r)
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
	lines := r.KafkaProblems()
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
	group := v.Group
	if v.GroupType == recorded.ShareGroup {
		group += " (a share group)"
	}
	fmt.Fprintf(w, "recorded settings (by %s, which joined its group %s): ids %s, group %s, topics %s, brokers %s%s\n",
		orDash(v.RecordedBy), v.RecordedAt.UTC().Format(time.RFC3339), ids, group, strings.Join(v.Topics, ","), strings.Join(v.Brokers, ","), kafkaVia)
}

// printShare shows what the broker says of a share group: its settings
// and members.
func printShare(w io.Writer, r statusReport) {
	v := r.Share
	if v == nil {
		return
	}
	if st := v.Settings; st != nil {
		fmt.Fprintf(w, "share group settings: delivery limit %d, lock duration %s, start %s, isolation %s\n", st.DeliveryLimit, st.LockDuration, st.Start, st.Isolation)
	}
	if v.Error != "" && v.State == "" {
		return
	}
	fmt.Fprintf(w, "share group members: %d (state %s)\n", len(v.Members), orDash(v.State))
	for _, m := range v.Members {
		fmt.Fprintf(w, "  %s, client %s on %s, epoch %d, %d partitions assigned\n", m.ID, orDash(m.ClientID), orDash(m.Host), m.Epoch, m.Assigned)
	}
}

// printGroup shows what the broker says of a consumer group: its protocol
// and members.
func printGroup(w io.Writer, r statusReport) {
	v := r.ConsumerGroup
	if v == nil || (v.Error != "" && v.State == "") {
		return
	}
	how := "state " + orDash(v.State)
	if v.Protocol != "" {
		how = v.Protocol + " protocol, " + how
	}
	if v.Epoch != 0 {
		how += fmt.Sprintf(", group epoch %d", v.Epoch)
	}
	fmt.Fprintf(w, "group members: %d (%s)\n", len(v.Members), how)
	for _, m := range v.Members {
		who := m.ID
		if m.InstanceID != "" {
			who = fmt.Sprintf("%s (instance %s)", m.ID, m.InstanceID)
		}
		epoch := ""
		if v.Protocol == "consumer" {
			epoch = fmt.Sprintf(", %s protocol, epoch %d", m.Type, m.Epoch)
		}
		fmt.Fprintf(w, "  %s, client %s on %s%s, assigned %s\n", who, orDash(m.ClientID), orDash(m.Host), epoch, consumerstatus.AssignedText(m.Assigned))
	}
}

// printSharePartitions shows a share group's partitions: a share group
// has no committed offset and no stored position, but a share-partition
// start offset and a share lag.
func printSharePartitions(w io.Writer, r statusReport) {
	var rows [][]string
	var lag int64
	unknown := 0
	for _, p := range r.Partitions {
		start, shareLag := "-", "-"
		if p.ShareStart != nil {
			start = strconv.FormatInt(*p.ShareStart, 10)
		}
		if p.Lag >= 0 {
			shareLag = strconv.FormatInt(p.Lag, 10)
			lag += p.Lag
		} else {
			unknown++
		}
		rows = append(rows, []string{p.Topic, strconv.Itoa(p.Partition), optional(p.LogStart), optional(p.LogEnd), start, shareLag})
	}
	fmt.Fprintln(w)
	table(w, "TOPIC\tPARTITION\tLOG START\tLOG END\tSHARE START\tSHARE LAG", rows)
	switch {
	case unknown == len(r.Partitions):
		fmt.Fprintln(w, "total share lag: unknown (the group has not read these partitions, or the broker gives no share lag)")
	case unknown > 0:
		fmt.Fprintf(w, "total share lag: %d, and unknown for %d partitions (not read by the group yet, or not given)\n", lag, unknown)
	default:
		fmt.Fprintf(w, "total share lag: %d\n", lag)
	}
	fmt.Fprintln(w, "records in flight (delivered, not yet settled) are part of the share lag: Kafka does not report them apart")
}
