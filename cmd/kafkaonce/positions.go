package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// Where a partition starts after positions forget (positionChange.From).
const (
	fromFirstStart  = "first_start"  // the group offset is this consumer's: a lost position
	fromLogStart    = "log_start"    // the same, the first start not known
	fromGroupOffset = "group_offset" // another client's group offset, adopted
	fromStartPolicy = "start_offset" // no group offset: Config.StartOffset
)

// positionChange is what positions reset or forget does to a partition.
type positionChange struct {
	Partition int `json:"partition"`
	// LogStart and LogEnd are the log's bounds, -1 when Kafka has not the
	// partition.
	LogStart  int64 `json:"log_start"`
	LogEnd    int64 `json:"log_end"`
	Committed int64 `json:"kafka_committed"`
	// Stored is the stored position before the change, -1 when none.
	Stored int64 `json:"stored_position"`
	// Target is the new position (reset), or where the next member starts
	// (forget; -1 when Config.StartOffset decides, which is not recorded).
	Target int64 `json:"target"`
	// From says, for forget, why the next member starts at Target; for a
	// reset of a partition without a stored position, why a member would
	// start at Start (-1 for a partition with a stored position), which
	// the counts are from.
	From  string `json:"starts_from,omitempty"`
	Start int64  `json:"start_without_position"`
	// ReadAgain counts the offsets between Target and the stored position
	// that the consumer reads again; its claims decide what is applied.
	ReadAgain int64 `json:"read_again"`
	// SkippedForGood counts the offsets between the stored position and a
	// Target ahead of it: never processed.
	SkippedForGood int64 `json:"skipped_for_good"`
}

type positionsPlan struct {
	Action string `json:"action"`
	planHead
	Partitions []positionChange `json:"partitions"`
	Executed   bool             `json:"executed"`
}

func (p positionsPlan) totals() (readAgain, skipped int64) {
	for _, pc := range p.Partitions {
		readAgain += pc.ReadAgain
		skipped += pc.SkippedForGood
	}
	return readAgain, skipped
}

func positionsCmd(s *settings) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "positions",
		Short: "Move (reset) or delete (forget) a consumer's stored positions on a topic; status lists them",
		Long: `positions changes the stored positions of a consumer, the offsets in Postgres
where each partition's processing goes on from (kafkaonce status lists
them, in its STORED column). The group's committed offsets in Kafka are not
touched: the stored position decides where a partition starts, and the
consumer brings the group's offset along when it commits.

Like replay, each command shows its plan first, refuses while the group has
active members (unless --force), and asks for confirmation on a terminal or
needs --yes elsewhere; --dry-run only shows the plan. A change that passes
over messages never processed needs --allow-skip.`,
	}
	cmd.AddCommand(positionsResetCmd(s), positionsForgetCmd(s))
	return cmd
}

// positionsFlags are the flags reset and forget share.
type positionsFlags struct {
	consumer, group, topic string
	allowSkip              bool
	act                    actFlags
}

func (f *positionsFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "the consumer's name (Config.Name)")
	cmd.Flags().StringVar(&f.group, "group", "", "the consumer group, whose members must be stopped (default: the recorded one, else the consumer's name)")
	cmd.Flags().StringVar(&f.topic, "topic", "", "the topic (default: the consumer's, when it records one)")
	cmd.Flags().BoolVar(&f.allowSkip, "allow-skip", false, "allow a change that passes over messages never processed")
	f.act.register(cmd, "act even while the group has active members: only a paused partition (kafkaonce pause) reads its moved position again")
}

// positionsScene is what reset and forget read before they plan.
type positionsScene struct {
	c            *conn
	store        *offsets.Store
	group, topic string
	members      []kafkaadmin.Member
	parts        []int
	bounds       map[int]kafkaadmin.Bounds
	commits      map[int]kafkaadmin.Commit
	stored       map[int]int64
}

// readScene opens Postgres and Kafka for the flags' consumer and topic and
// reads what a plan needs. It refuses a consumer the schema does not know
// (a mistyped name would plan changes no consumer reads) and a topic the
// consumer neither records nor has positions on.
func (s *settings) readScene(ctx context.Context, f *positionsFlags) (*positionsScene, error) {
	if f.consumer == "" {
		return nil, errors.New("--consumer is required: the consumer's Config.Name")
	}
	c, err := s.connectDB(ctx, f.consumer)
	if err != nil {
		return nil, err
	}
	sc := &positionsScene{c: c, group: groupOf(f.group, c.record, f.consumer)}
	fail := func(err error) (*positionsScene, error) {
		c.close()
		return nil, err
	}
	if err := schema.RequireLatest(ctx, c.pool, s.schema); err != nil {
		return fail(err)
	}
	known, err := consumerKnown(ctx, c.pool, s.schema, f.consumer)
	if err != nil {
		return fail(err)
	}
	if !known {
		return fail(fmt.Errorf("consumer %q is not known in schema %s: it has recorded no settings and stored no positions there; check --consumer (is the name mistyped?) or --schema", f.consumer, s.schema))
	}
	if sc.topic, err = topicOf(f.topic, c.record, f.consumer); err != nil {
		return fail(err)
	}
	sc.store, _ = offsets.NewStore(s.schema) // RequireLatest checked the name
	all, err := sc.store.List(ctx, c.pool, f.consumer)
	if err != nil {
		return fail(err)
	}
	sc.stored = map[int]int64{}
	for _, p := range all {
		if p.Topic == sc.topic {
			sc.stored[p.Partition] = p.Next
		}
	}
	recorded := c.record != nil && slices.Contains(c.record.Topics, sc.topic)
	if len(sc.stored) == 0 && !recorded {
		return fail(fmt.Errorf("consumer %s has no stored positions on topic %q and does not record reading it: check --topic (kafkaonce status --consumer %s lists its topics)", f.consumer, sc.topic, f.consumer))
	}
	if err := s.connectKafka(c, f.consumer); err != nil {
		return fail(err)
	}
	if sc.parts, err = c.admin.Partitions(ctx, sc.topic); err != nil {
		return fail(err)
	}
	if sc.bounds, err = c.admin.LogBounds(ctx, sc.topic, sc.parts); err != nil {
		return fail(err)
	}
	if sc.commits, err = c.admin.Commits(ctx, sc.group, sc.topic, sc.parts); err != nil {
		return fail(err)
	}
	g, err := c.admin.DescribeGroup(ctx, sc.group)
	if err != nil {
		return fail(err)
	}
	sc.members = g.Members
	return sc, nil
}

func (sc *positionsScene) plan(s *settings, action, consumerName string) positionsPlan {
	return positionsPlan{Action: action, planHead: newPlanHead(consumerName, s.schema, sc.group, sc.topic, sc.members)}
}

// change fills in a partition's row, from what the scene read, for a
// partition moving to target (-1: not known).
func (sc *positionsScene) change(p int, target int64) positionChange {
	pc := positionChange{Partition: p, LogStart: -1, LogEnd: -1, Committed: -1, Stored: -1, Target: target, Start: -1}
	if b, ok := sc.bounds[p]; ok {
		pc.LogStart, pc.LogEnd = b.Start, b.End
	}
	if c, ok := sc.commits[p]; ok {
		pc.Committed = c.Offset
	}
	if v, ok := sc.stored[p]; ok {
		pc.Stored = v
	}
	if pc.Stored >= 0 && target >= 0 {
		pc.ReadAgain = max(pc.Stored-target, 0)
		pc.SkippedForGood = max(target-pc.Stored, 0)
	}
	return pc
}

// changeUnstored is change for a partition without a stored position,
// which a member would start where the consumer decides at assignment
// (see nextStart): the counts are from there. Where Config.StartOffset
// decides, which the tool cannot know, they are from the log's start
// (StartEarliest, the default), so that a move forward is never taken
// for one that skips nothing.
func (sc *positionsScene) changeUnstored(p int, target int64, storeID, consumerName string) positionChange {
	pc := sc.change(p, target)
	start, from := nextStart(sc, p, storeID, consumerName)
	if start < 0 {
		start = max(pc.LogStart, 0)
	}
	pc.Start, pc.From = start, from
	if target >= 0 {
		pc.ReadAgain = max(start-target, 0)
		pc.SkippedForGood = max(target-start, 0)
	}
	return pc
}

// carryOut shows the plan, refuses a skip not allowed, runs the checks
// replay runs, and then execute; after says what follows the change.
func (s *settings) carryOut(ctx context.Context, f *positionsFlags, sc *positionsScene, plan positionsPlan, execute func() error, after string) error {
	if !s.json {
		printPositionsPlan(s.st.out, plan)
	}
	if _, skipped := plan.totals(); skipped > 0 && !f.allowSkip && !f.act.dryRun {
		return fmt.Errorf("the %s passes over %d offsets never processed (the plan's SKIPPED column): pass --allow-skip to skip them for good, or choose another --to", plan.Action, skipped)
	}
	gate := actGate{group: plan.Group, members: sc.members,
		forced: "a member processing a partition goes on from where it is and overwrites the change; a paused partition reads it at its resume",
		verb:   plan.Action + " the positions", question: strings.ToUpper(plan.Action[:1]) + plan.Action[1:] + " the stored positions? [y/N] "}
	ok, err := s.clearToAct(f.act, gate)
	if err != nil {
		return err
	}
	if !ok {
		return s.emitJSONOnly(plan)
	}
	if err := s.removeStatic(ctx, sc.c.admin, f.act, gate); err != nil {
		return err
	}
	if err := execute(); err != nil {
		return err
	}
	plan.Executed = true
	if !s.json {
		fmt.Fprintf(s.st.out, "positions %s done for consumer %s on %s; %s\n", plan.Action, plan.Consumer, plan.Topic, after)
	}
	return s.emitJSONOnly(plan)
}

// movedSincePlan says what a position a consumer moved since the plan
// means: nothing changed, and the plan is stale.
func movedSincePlan(err error, action string) error {
	if errors.Is(err, offsets.ErrMoved) {
		return fmt.Errorf("%w: a consumer is processing it; nothing changed: stop the consumers and run positions %s again to see the new plan", err, action)
	}
	return fmt.Errorf("%w; nothing changed", err)
}

func positionsResetCmd(s *settings) *cobra.Command {
	var f positionsFlags
	var to string
	var partition int
	cmd := &cobra.Command{
		Use:   "reset",
		Short: "Move a consumer's stored positions on a topic (back: read again; forward: skip)",
		Long: `reset moves the stored positions of a consumer's partitions on a topic (one
with --partition) to --to: earliest (the log's start), latest (its end), or
an offset within the log.

Moving a position back makes the consumer read the messages from there
again; the claims decide what is applied: a message whose claim is still
there (applied, or set aside) is skipped without calling the handler, and
one whose claim was pruned, or that never had one, is applied.
kafkaonce audit shows which claims are missing. Moving a position forward
passes over the messages between, never processed: the plan counts them,
and the reset needs --allow-skip.

Each position moves only from the one the plan showed, in one transaction:
when a consumer moved one meanwhile, nothing changes.

  kafkaonce positions reset --consumer ledger --topic transfers --partition 3 --to 8812 --dry-run
  kafkaonce positions reset --consumer ledger --to earliest --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return errors.New("--to is required: earliest, latest, or an offset")
			}
			ctx := cmd.Context()
			sc, err := s.readScene(ctx, &f)
			if err != nil {
				return err
			}
			defer sc.c.close()
			parts := sc.parts
			if cmd.Flags().Changed("partition") {
				if partition < 0 {
					return fmt.Errorf("--partition %d is negative: partitions are numbered from 0; leave --partition out for every partition of the topic", partition)
				}
				if !slices.Contains(sc.parts, partition) {
					return fmt.Errorf("--partition %d is not a partition of %s, which has partitions 0 to %d; leave --partition out for every partition", partition, sc.topic, len(sc.parts)-1)
				}
				parts = []int{partition}
			}
			targets, err := resetTargets(sc, parts, to)
			if err != nil {
				return err
			}
			storeID, err := sc.store.StoreID(ctx, sc.c.pool)
			if err != nil {
				return err
			}
			plan := sc.plan(s, "reset", f.consumer)
			for _, p := range parts {
				if _, stored := sc.stored[p]; stored {
					plan.Partitions = append(plan.Partitions, sc.change(p, targets[p]))
					continue
				}
				plan.Partitions = append(plan.Partitions, sc.changeUnstored(p, targets[p], storeID, f.consumer))
			}
			if !slices.ContainsFunc(plan.Partitions, func(pc positionChange) bool { return pc.Stored != pc.Target }) {
				return s.emit(plan, func(w io.Writer) {
					printPositionsPlan(w, plan)
					fmt.Fprintln(w, "every position is at its target already; nothing changed")
				})
			}
			return s.carryOut(ctx, &f, sc, plan, func() error { return executeReset(ctx, sc, plan) },
				"a member starting a partition goes on from its new position")
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&to, "to", "", "the new position: earliest, latest, or an offset (required)")
	cmd.Flags().IntVar(&partition, "partition", -1, "one partition of --topic (default: every partition)")
	return cmd
}

// resetTargets resolves --to for each partition. An offset outside a
// partition's log is refused rather than clamped: a position below the log's
// start stops the partition at the deleted messages, one past its end stops
// it as a truncated log.
func resetTargets(sc *positionsScene, parts []int, to string) (map[int]int64, error) {
	out := map[int]int64{}
	for _, p := range parts {
		b := sc.bounds[p]
		switch to {
		case "earliest":
			out[p] = b.Start
			continue
		case "latest":
			out[p] = b.End
			continue
		}
		off, err := strconv.ParseInt(to, 10, 64)
		switch {
		case err != nil:
			return nil, fmt.Errorf("--to %q is not earliest, latest or an offset", to)
		case off < 0:
			return nil, fmt.Errorf("--to %d is negative: offsets start at 0; use --to earliest for the log's start", off)
		case off < b.Start:
			return nil, fmt.Errorf("--to %d is below the log start of %s/%d (%d): retention deleted the messages there; use --to earliest, or an offset from %d", off, sc.topic, p, b.Start, b.Start)
		case off > b.End:
			return nil, fmt.Errorf("--to %d is past the log end of %s/%d (%d): the partition would stop there as a truncated log; use --to latest, or an offset up to %d (name one partition with --partition)", off, sc.topic, p, b.End, b.End)
		}
		out[p] = off
	}
	return out, nil
}

// inOneTx runs change in one transaction, committed only if all of it
// went through: a failure changes nothing.
func inOneTx(ctx context.Context, sc *positionsScene, change func(pgx.Tx) error) error {
	tx, err := sc.c.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%w; nothing changed", err)
	}
	defer rollback(ctx, tx)
	if err := change(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%w; nothing changed", err)
	}
	return nil
}

// executeReset moves the positions of the plan in one transaction, each
// only from what the plan read.
func executeReset(ctx context.Context, sc *positionsScene, plan positionsPlan) error {
	return inOneTx(ctx, sc, func(tx pgx.Tx) error {
		for _, pc := range plan.Partitions {
			if pc.Target == pc.Stored {
				continue
			}
			if err := sc.store.ResetFrom(ctx, tx, plan.Consumer, plan.Topic, pc.Partition, pc.Stored, pc.Target); err != nil {
				return movedSincePlan(err, "reset")
			}
		}
		return nil
	})
}

func positionsForgetCmd(s *settings) *cobra.Command {
	var f positionsFlags
	cmd := &cobra.Command{
		Use:   "forget",
		Short: "Delete a consumer's stored positions on a topic, so the next member starts as Kafka's group offset says",
		Long: `forget deletes the stored positions of every partition of a consumer's topic
(offsets.Store.Forget). The next member to start a partition then starts
where the group's offset committed to Kafka says, as the plan shows per
partition:

  - a group offset this consumer committed against this database (the
    usual case) is taken for a lost position: the partition is processed
    again from its first start, the claims deciding what was applied
    (logged at error level, as any lost position);
  - a group offset another client committed, or that was reset (Kafka's
    tools, kafkaonce replay), is adopted: processing starts there;
  - with no group offset, Config.StartOffset decides: the log's start
    (StartEarliest, the default) or its end (StartLatest).

Messages read again are skipped by their claims, or applied where the
claims were pruned; a start past the stored position passes over messages
never processed, and needs --allow-skip. The positions are deleted only as
the plan showed them: when a consumer moved or stored one meanwhile,
nothing changes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			sc, err := s.readScene(ctx, &f)
			if err != nil {
				return err
			}
			defer sc.c.close()
			if len(sc.stored) == 0 {
				return fmt.Errorf("consumer %s has no stored positions on topic %s: nothing to forget; check --topic (kafkaonce status --consumer %s lists its positions)", f.consumer, sc.topic, f.consumer)
			}
			storeID, err := sc.store.StoreID(ctx, sc.c.pool)
			if err != nil {
				return err
			}
			plan := sc.plan(s, "forget", f.consumer)
			for _, p := range slices.Sorted(maps.Keys(sc.stored)) {
				target, from := nextStart(sc, p, storeID, f.consumer)
				pc := sc.change(p, target)
				pc.From = from
				plan.Partitions = append(plan.Partitions, pc)
			}
			return s.carryOut(ctx, &f, sc, plan, func() error { return executeForget(ctx, sc, plan) },
				"a member starting a partition starts where the plan says")
		},
	}
	f.register(cmd)
	return cmd
}

// nextStart is where a member starts partition p once its position is
// forgotten, as the consumer decides at assignment (see docs/guarantee.md,
// "The database is the source of truth"): -1 when Config.StartOffset
// decides.
func nextStart(sc *positionsScene, p int, storeID, consumerName string) (int64, string) {
	c, ok := sc.commits[p]
	if !ok || c.Offset < 0 {
		return -1, fromStartPolicy
	}
	m, marked := offsets.ParseCommitMark(c.Metadata)
	switch {
	case !marked || m.Store != storeID || m.Consumer != consumerName:
		return c.Offset, fromGroupOffset
	case m.First >= 0:
		return m.First, fromFirstStart
	}
	if b, ok := sc.bounds[p]; ok {
		return b.Start, fromLogStart
	}
	return -1, fromLogStart
}

// executeForget deletes the topic's positions in one transaction, only as
// the plan read them: each is first set to itself from what the plan read,
// which locks its row and fails if a consumer moved it, and a position
// stored since the plan makes the count differ.
func executeForget(ctx context.Context, sc *positionsScene, plan positionsPlan) error {
	return inOneTx(ctx, sc, func(tx pgx.Tx) error {
		for _, pc := range plan.Partitions {
			if err := sc.store.ResetFrom(ctx, tx, plan.Consumer, plan.Topic, pc.Partition, pc.Stored, pc.Stored); err != nil {
				return movedSincePlan(err, "forget")
			}
		}
		n, err := sc.store.Forget(ctx, tx, plan.Consumer, plan.Topic)
		if err != nil {
			return fmt.Errorf("%w; nothing changed", err)
		}
		if n != int64(len(plan.Partitions)) {
			return fmt.Errorf("%d positions of %s are stored, the plan showed %d: a consumer stored one since; nothing changed: stop the consumers and run positions forget again to see the new plan", n, plan.Topic, len(plan.Partitions))
		}
		return nil
	})
}

var startsFromText = map[string]string{
	fromFirstStart:  "first start",
	fromLogStart:    "log start",
	fromGroupOffset: "group offset",
	fromStartPolicy: "StartOffset",
}

// startsWithout says why a partition without a stored position starts
// where it does.
var startsWithout = map[string]string{
	fromFirstStart:  "its first start, which the group's offset records",
	fromLogStart:    "the log's start: the group's offset is this consumer's and records no first start",
	fromGroupOffset: "the group's offset, committed by another client or reset",
	fromStartPolicy: "no group offset: Config.StartOffset decides, taken here as StartEarliest, the default",
}

func printPositionsPlan(w io.Writer, p positionsPlan) {
	fmt.Fprintf(w, "positions %s on %s for consumer %s (schema %s, group %s, %d active members%s)\n\n", p.Action, p.Topic, p.Consumer, p.Schema, p.Group, p.Members, staticNote(p.Static))
	header := "PARTITION\tLOG START\tLOG END\tCOMMITTED\tSTORED\tNEW POSITION\tREAD AGAIN\tSKIPPED"
	if p.Action == "forget" {
		header = "PARTITION\tLOG START\tLOG END\tCOMMITTED\tSTORED\tNEXT START\tFROM\tREAD AGAIN\tSKIPPED"
	}
	var rows [][]string
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	froms := map[string]int{}
	var below []string
	for _, pc := range p.Partitions {
		row := []string{strconv.Itoa(pc.Partition), optional(pc.LogStart), optional(pc.LogEnd), optional(pc.Committed), optional(pc.Stored), optional(pc.Target)}
		if p.Action == "forget" {
			row = append(row, startsFromText[pc.From])
			froms[pc.From]++
			if pc.Target >= 0 && pc.Target < pc.LogStart {
				below = append(below, strconv.Itoa(pc.Partition))
			}
		}
		rows = append(rows, append(row, n(pc.ReadAgain), n(pc.SkippedForGood)))
	}
	table(w, header, rows)
	fmt.Fprintln(w)
	if k := froms[fromFirstStart] + froms[fromLogStart]; k > 0 {
		fmt.Fprintf(w, "%d partition(s): the group's offset was committed by this consumer against this database, so the next member takes the forgotten position for a lost one and processes again from the partition's first start (the log's start where it is not known), logging it at error level\n", k)
	}
	if k := froms[fromGroupOffset]; k > 0 {
		fmt.Fprintf(w, "%d partition(s): the group's offset was committed by another client or reset: the next member starts there\n", k)
	}
	if k := froms[fromStartPolicy]; k > 0 {
		fmt.Fprintf(w, "%d partition(s) without a group offset: the next member starts where the consumer's Config.StartOffset says, the log's start (StartEarliest, the default: the messages below the stored position are read again) or its end (StartLatest: the messages from the stored position to the end are never processed)\n", k)
	}
	if len(below) > 0 {
		fmt.Fprintf(w, "WARNING: partition(s) %s start below the log's start: retention deleted messages processed since, and the partition stops with ErrMessagesDeleted; reset the position instead (kafkaonce positions reset)\n", strings.Join(below, ", "))
	}
	readAgain, skipped := p.totals()
	if readAgain > 0 {
		fmt.Fprintf(w, "%d offsets below the stored positions will be read again: the consumer skips the messages whose claims it still has (applied, or set aside) without calling the handler, and applies the others (claims pruned, or never made); kafkaonce audit shows which claims are missing\n", readAgain)
	}
	if skipped > 0 {
		fmt.Fprintf(w, "WARNING: %d offsets between the stored positions and the new ones will never be processed (--allow-skip)\n", skipped)
	}
	if p.Action == "reset" {
		for _, pc := range p.Partitions {
			if pc.Stored < 0 {
				fmt.Fprintf(w, "partition %d has no stored position: a member would start at %d (%s), and the plan counts from there\n", pc.Partition, pc.Start, startsWithout[pc.From])
			}
		}
		fmt.Fprintln(w, "the group's offsets in Kafka are left as they are: the stored position decides where a partition starts, and the consumer commits the group's offset from it")
	}
}
