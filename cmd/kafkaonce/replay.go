package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
)

type replayPartition struct {
	Partition int   `json:"partition"`
	Committed int64 `json:"kafka_committed"`
	Target    int64 `json:"target"`
	Stored    int64 `json:"stored_position"`
	// Skipped counts the messages the replay reads again that are below the
	// stored position, so the consumer skips them without calling the
	// handler. Every count is of messages, as the consumer is handed them:
	// transaction markers and records of aborted transactions are not.
	Skipped int64 `json:"skipped_by_position"`
	// SkippedByClaim counts the messages past the stored position whose
	// ids are claimed already, for the same content (applied, here or at
	// another offset, or set aside): the consumer skips them too.
	SkippedByClaim int64 `json:"skipped_by_claim"`
	// Conflicts counts the messages past the stored position whose ids are
	// claimed for other content: the consumer sets them aside.
	Conflicts int64 `json:"conflicts"`
	// New counts the messages past the stored position that are not
	// claimed: processed for the first time.
	New int64 `json:"new"`
	// Unread counts the offsets the plan could not read (a fetch failed,
	// retention deleted them first): the counts leave them out.
	Unread int64 `json:"unread_offsets,omitempty"`
	// SkippedForGood counts the messages between the stored position and a
	// target ahead of it, never processed: the stored position moves to
	// the target too.
	SkippedForGood int64 `json:"skipped_for_good"`
}

type replayPlan struct {
	planHead
	Partitions []replayPartition `json:"partitions"`
	Executed   bool              `json:"executed"`
	// GroupType is "share" for a share group, whose Committed are its
	// start offsets and which has no stored positions.
	GroupType string `json:"group_type,omitempty"`
	// ClaimsCountedBy is the id rule the claims were looked up by, and
	// where it came from; ClaimsNotCounted says why they were not, and New
	// then counts every message past the stored positions.
	ClaimsCountedBy  string `json:"claims_counted_by,omitempty"`
	ClaimsNotCounted string `json:"claims_not_counted,omitempty"`
}

func replayCmd(s *settings) *cobra.Command {
	var consumerName, group, topic, to, idSpec string
	var act actFlags
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Rewind a consumer group (to earliest, an offset or a time) so the topic is read again",
		Long: `replay rewinds a consumer group's committed offsets on a topic, so its members
read the topic again from there. It first shows what will happen: the
messages below each partition's stored position are skipped by kafkaonce
without calling the handler (they were processed, or came before the
partition's first start); of the rest, those whose ids are claimed already
are skipped too (their claims are looked up as kafkaonce audit does, with
the id rule the consumer records, or --id), and the others are processed
for the first time. A replay therefore applies nothing twice; kafkaonce audit
checks that in advance.

Kafka only lets offsets be reset while the group has no active members, so
replay refuses while members are active unless --force (the broker may
still refuse): a classic group's, or those of a group of the consumer group
protocol (KIP-848), named with their epochs and partitions. It asks for confirmation on a terminal; pass --yes otherwise.

A replay past a stored position moves that position forward, but only from
the position the plan showed, and only if Kafka accepts the group's new
offsets: when a consumer moved the position meanwhile, or Kafka refuses,
nothing changes.

--group defaults to the group the consumer records when it starts, else
its name; --topic to its topic, when it records exactly one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if consumerName == "" {
				return errors.New("--consumer is required: the consumer's Config.Name")
			}
			ctx := cmd.Context()
			c, err := s.connectDB(ctx, consumerName)
			if err != nil {
				return err
			}
			defer c.close()
			group = groupOf(group, c.record, consumerName)
			if topic, err = topicOf(topic, c.record, consumerName); err != nil {
				return err
			}
			// The plan needs ids only to count claims: without a rule it
			// can derive, it counts none and says so.
			ids, idErr := idRuleOf(idSpec, c.record, consumerName)
			if idErr != nil && idSpec != "" {
				return idErr
			}
			if err := s.connectKafka(c, consumerName); err != nil {
				return err
			}
			pool, admin := c.pool, c.admin

			parts, err := admin.Partitions(ctx, topic)
			if err != nil {
				return err
			}
			bounds, err := admin.LogBounds(ctx, topic, parts)
			if err != nil {
				return err
			}
			targets, err := resolveOffsets(ctx, admin, topic, parts, bounds, to, true)
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			// A share group is known from what the consumer recorded (as
			// status and audit know it), not asked of the broker: a broker
			// without share groups may take its time to say so.
			if kind, _ := groupTypeOf("", c.record); kind.typ == recorded.ShareGroup {
				share, err := admin.DescribeShareGroup(ctx, group)
				if err != nil {
					return err
				}
				r := shareReplay{s: s, consumer: consumerName, group: group, topic: topic, parts: parts, bounds: bounds,
					targets: targets, members: shareMembers(share), ids: ids, idErr: idErr, act: act}
				return r.run(ctx, c)
			}
			committed, err := admin.Committed(ctx, group, topic, parts)
			if err != nil {
				return err
			}
			g, err := admin.DescribeGroup(ctx, group)
			if err != nil {
				return err
			}
			positions, _ := offsets.NewStore(s.schema)
			plan := replayPlan{planHead: newPlanHead(consumerName, s.schema, group, topic, g.Members)}
			for _, p := range parts {
				stored, ok, err := positions.Load(ctx, pool, consumerName, topic, p)
				if err != nil {
					return err
				}
				if !ok {
					stored = -1
				}
				plan.Partitions = append(plan.Partitions, replayPartition{Partition: p, Committed: committed[p], Target: targets[p], Stored: stored})
			}
			a := &auditor{pool: pool, admin: admin, schema: s.schema, consumer: consumerName, topic: topic, id: ids.rule,
				progress: newProgress(s.st, "counting the messages")}
			if err := countPlan(ctx, a, &plan, bounds, idErr == nil); err != nil {
				return err
			}
			if idErr != nil {
				plan.ClaimsNotCounted = idErr.Error()
			} else {
				plan.ClaimsCountedBy = describeRule(auditReport{Consumer: consumerName, MessageIDRule: ids.rule.String(), MessageIDRuleFrom: ids.from})
			}
			if !s.json {
				printReplayPlan(s.st.out, plan)
			}
			gate := actGate{group: group, members: g.Members, forced: "Kafka refuses resets of active groups",
				verb: "rewind", question: "Rewind the group? [y/N] "}
			ok, err := s.clearToAct(act, gate)
			if err != nil {
				return err
			}
			if !ok {
				return s.emitJSONOnly(plan)
			}
			if err := s.removeStatic(ctx, admin, act, gate); err != nil {
				return err
			}
			if err := executeReplay(ctx, pool, positions, admin, plan, targets); err != nil {
				return err
			}
			plan.Executed = true
			if !s.json {
				fmt.Fprintf(s.st.out, "group %s rewound on %s; start the consumers to replay\n", group, topic)
			}
			return s.emitJSONOnly(plan)
		},
	}
	f := cmd.Flags()
	f.StringVar(&consumerName, "consumer", "", "the consumer's name (Config.Name)")
	f.StringVar(&group, "group", "", "the consumer group (default: the recorded one, else the consumer's name)")
	f.StringVar(&topic, "topic", "", "the topic to replay (default: the consumer's, when it records one)")
	f.StringVar(&to, "to", "earliest", "where to rewind to: earliest, an offset, an RFC 3339 time, or a duration ago (24h)")
	f.StringVar(&idSpec, "id", "", "how ids are derived, to count the claims of the messages past the stored positions: "+consumer.MessageIDRuleForms+" (default: the rule the consumer records, else header:"+consumer.DefaultMessageIDHeader+")")
	act.register(cmd, "try even while the group has active members")
	return cmd
}

// countPlan counts, partition by partition, the messages the replay
// hands the consumer, by reading the log as the consumer reads it:
// committed records only, so that transaction markers and the records of
// aborted transactions, which take offsets and are never handed to a
// handler, are not counted. Below the stored position they are read again
// and skipped by position; between a stored position and a target ahead
// of it they are skipped for good; past both, with claims, the ones
// claimed already are looked up as the audit does (skipped by claim, or
// conflicts) and the rest are new. Offsets it cannot read are counted in
// Unread, and left out of the counts.
func countPlan(ctx context.Context, a *auditor, plan *replayPlan, bounds map[int]kafkaadmin.Bounds, claims bool) error {
	var total int64
	for _, rp := range plan.Partitions {
		total += max(bounds[rp.Partition].End-lowest(rp), 0)
	}
	a.progress.start(total)
	defer a.progress.done()
	count := func(rp *replayPartition, from, to int64) (int64, error) {
		ap := auditPartition{Partition: rp.Partition, From: from, To: to, Stored: rp.Stored}
		if from >= to {
			return 0, nil
		}
		err := a.scan(ctx, &ap, func(chunk []kafkaclient.Record) error {
			ap.Read += int64(len(chunk))
			a.progress.add(int64(len(chunk)))
			return nil
		})
		rp.Unread += ap.Unread
		return ap.Read, err
	}
	for i := range plan.Partitions {
		rp := &plan.Partitions[i]
		end := bounds[rp.Partition].End
		var err error
		if rp.Stored >= 0 {
			if rp.Skipped, err = count(rp, rp.Target, min(rp.Stored, end)); err != nil {
				return fmt.Errorf("count the messages of %s/%d: %w", plan.Topic, rp.Partition, err)
			}
			if rp.SkippedForGood, err = count(rp, rp.Stored, min(rp.Target, end)); err != nil {
				return fmt.Errorf("count the messages of %s/%d: %w", plan.Topic, rp.Partition, err)
			}
		}
		from := max(rp.Target, rp.Stored)
		if !claims {
			if rp.New, err = count(rp, from, end); err != nil {
				return fmt.Errorf("count the messages of %s/%d: %w", plan.Topic, rp.Partition, err)
			}
			continue
		}
		ap := auditPartition{Partition: rp.Partition, From: from, To: end, Stored: rp.Stored}
		if err := a.partition(ctx, &ap, &auditReport{}); err != nil {
			return fmt.Errorf("count the claims of %s/%d: %w", plan.Topic, rp.Partition, err)
		}
		rp.SkippedByClaim = ap.Applied + ap.Duplicates + ap.DeadLettered
		rp.Conflicts = ap.Conflicts
		rp.New = ap.Read - rp.SkippedByClaim - rp.Conflicts
		rp.Unread += ap.Unread
	}
	return nil
}

// lowest is the first offset the plan reads in rp.
func lowest(rp replayPartition) int64 {
	if rp.Stored >= 0 {
		return min(rp.Target, rp.Stored)
	}
	return rp.Target
}

// executeReplay moves the stored positions the plan moves forward and
// commits the group's offsets, so that a failure changes nothing: the
// positions move in a transaction that commits only after Kafka accepted
// the offsets. Each position moves only from what the plan read, so a
// consumer that moved it meanwhile (a group reset with --force) keeps its
// position, and the command stops before Kafka is touched. The rows stay
// locked while Kafka answers, so no consumer moves them in between. Only a
// failure of the final Postgres commit leaves a change behind (the Kafka
// offsets), and the error says so.
func executeReplay(ctx context.Context, pool *pgxpool.Pool, positions *offsets.Store, admin *kafkaadmin.Admin, plan replayPlan, targets map[int]int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%w; nothing changed", err)
	}
	defer rollback(ctx, tx)
	// Moving forward skips messages: the stored position must move too, or
	// the consumer would process them anyway (the stored position decides
	// where a partition starts).
	for _, rp := range plan.Partitions {
		// By offsets, not by the messages counted: a target past offsets
		// that hold no message moves the stored position too.
		if rp.Stored >= 0 && rp.Target > rp.Stored {
			if err := positions.ResetFrom(ctx, tx, plan.Consumer, plan.Topic, rp.Partition, rp.Stored, rp.Target); err != nil {
				if errors.Is(err, offsets.ErrMoved) {
					return fmt.Errorf("%w: a consumer is processing it; nothing changed: stop the consumers and run replay again to see the new plan", err)
				}
				return fmt.Errorf("%w; nothing changed", err)
			}
		}
	}
	if err := admin.CommitOffsets(ctx, plan.Group, plan.Topic, targets); err != nil {
		return commitFailed(plan.Topic, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("the group's offsets on %s were committed to Kafka, but the stored positions were not moved: %w; run replay again with the same --to to move them", plan.Topic, err)
	}
	return nil
}

// commitFailed says what a failed offset commit changed: the stored
// positions are as they were (their transaction rolls back), and the
// group's offsets are too, unless Kafka committed some partitions and
// refused others, or the request failed without an answer.
func commitFailed(topic string, err error) error {
	var ce *kafkaadmin.CommitError
	switch {
	case errors.As(err, &ce) && len(ce.Committed) > 0:
		var moved []string
		for _, p := range slices.Sorted(maps.Keys(ce.Committed)) {
			moved = append(moved, fmt.Sprintf("%s/%d to %d", topic, p, ce.Committed[p]))
		}
		return fmt.Errorf("%w; Kafka committed the group's offsets on %s all the same, the other partitions' offsets and every stored position are as they were: fix the cause and run replay again with the same --to",
			err, strings.Join(moved, ", "))
	case errors.As(err, &ce):
		return fmt.Errorf("%w; nothing changed: the group's offsets and the stored positions are as they were", err)
	}
	return fmt.Errorf("%w; the stored positions are as they were, and Kafka may or may not have committed the group's offsets (the request got no answer): see them with status, and run replay again with the same --to", err)
}

// emitJSONOnly prints v with --json; text output was already printed.
func (s *settings) emitJSONOnly(v any) error {
	if !s.json {
		return nil
	}
	return s.emit(v, nil)
}

func printReplayPlan(w io.Writer, p replayPlan) {
	kind, committed := "group", "COMMITTED"
	if p.GroupType == "share" {
		kind, committed = "share group", "START OFFSET"
	}
	fmt.Fprintf(w, "replay of %s for consumer %s (schema %s, %s %s, %d active members%s)\n\n", p.Topic, p.Consumer, p.Schema, kind, p.Group, p.Members, staticNote(p.Static))
	var rows [][]string
	var skipped, claimed, conflicts, fresh, unread, lost int64
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, rp := range p.Partitions {
		skipped += rp.Skipped
		claimed += rp.SkippedByClaim
		conflicts += rp.Conflicts
		fresh += rp.New
		unread += rp.Unread
		lost += rp.SkippedForGood
		rows = append(rows, []string{strconv.Itoa(rp.Partition), optional(rp.Committed), n(rp.Target), optional(rp.Stored),
			n(rp.Skipped), n(rp.SkippedByClaim), n(rp.Conflicts), n(rp.New), n(rp.SkippedForGood)})
	}
	table(w, "PARTITION\t"+committed+"\tREWIND TO\tSTORED\tSKIPPED BY POSITION\tSKIPPED BY CLAIM\tCONFLICTS\tNEW\tNEVER PROCESSED", rows)
	fmt.Fprintf(w, "\n%d messages will be read again and skipped without calling the handler: %d below the stored positions, %d already claimed (applied, or set aside); %d are new\n",
		skipped+claimed, skipped, claimed, fresh)
	if p.ClaimsCountedBy != "" {
		fmt.Fprintf(w, "claims looked up by ids %s\n", p.ClaimsCountedBy)
	}
	if p.ClaimsNotCounted != "" {
		fmt.Fprintf(w, "claims not counted, so the new messages may include some already claimed, which the consumer will skip: %s\n", p.ClaimsNotCounted)
	}
	if unread > 0 {
		fmt.Fprintf(w, "%d offsets could not be read (a fetch failed, or retention deleted them first): the counts leave out the messages there\n", unread)
	}
	if conflicts > 0 {
		fmt.Fprintf(w, "WARNING: %d messages have an id claimed for other content: the consumer sets them aside as conflict letters (or stops at them, with StopPartition); kafkaonce audit lists them\n", conflicts)
	}
	if lost > 0 {
		fmt.Fprintf(w, "WARNING: %d messages between the stored positions and the target will never be processed: the stored positions move forward too\n", lost)
	}
}

func confirm(st streams, question string) bool {
	fmt.Fprint(st.err, question)
	line, _ := bufio.NewReader(st.in).ReadString('\n')
	return strings.EqualFold(strings.TrimSpace(line), "y") || strings.EqualFold(strings.TrimSpace(line), "yes")
}
