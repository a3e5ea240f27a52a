package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/recent"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	lettersstore "github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// auditCounts is what an audit found, for a partition or in total.
type auditCounts struct {
	Read int64 `json:"read"`
	// Covered: a replay would not apply these again.
	Applied      int64 `json:"applied"`
	Duplicates   int64 `json:"duplicates"`
	DeadLettered int64 `json:"dead_lettered"`
	Pruned       int64 `json:"pruned"`
	// DiedOnLastDelivery (a share group's) are below the share start
	// offset with only a provisional letter: the broker archived them
	// after a last delivery that never finished, and the letter, an
	// ordinary open one, sets them aside.
	DiedOnLastDelivery int64 `json:"died_on_last_delivery"`
	// Unprocessed are at or past the stored position (a share group's
	// start offset) with no claim and no letter: not processed yet.
	Unprocessed int64 `json:"unprocessed"`
	// PastStart (a share group's) are at or past the share start offset,
	// whatever their claims and letters say: in flight or not delivered
	// yet, so none of them is missing.
	PastStart int64 `json:"past_share_start"`
	// Problems.
	WouldReapply int64 `json:"would_reapply"`
	Conflicts    int64 `json:"conflicts"`
	Missing      int64 `json:"missing"`
	// Suspects have the content of a recent message under another id.
	Suspects int64 `json:"suspect_duplicates"`
	// Unread offsets of the range were not read (a fetch failed, or
	// retention deleted them first): the audit says nothing about them.
	Unread int64 `json:"unread"`
}

func (c *auditCounts) add(o auditCounts) {
	c.Read += o.Read
	c.Applied += o.Applied
	c.Duplicates += o.Duplicates
	c.DeadLettered += o.DeadLettered
	c.Pruned += o.Pruned
	c.DiedOnLastDelivery += o.DiedOnLastDelivery
	c.Unprocessed += o.Unprocessed
	c.PastStart += o.PastStart
	c.WouldReapply += o.WouldReapply
	c.Conflicts += o.Conflicts
	c.Missing += o.Missing
	c.Suspects += o.Suspects
	c.Unread += o.Unread
}

func (c auditCounts) problems() int64 { return c.WouldReapply + c.Conflicts + c.Missing }

type auditFinding struct {
	Kind      string `json:"kind"`
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	Offset    int64  `json:"offset"`
	MessageID string `json:"message_id,omitempty"`
	Detail    string `json:"detail"`
}

type auditPartition struct {
	Partition int   `json:"partition"`
	From      int64 `json:"from"`
	To        int64 `json:"to"`
	Stored    int64 `json:"stored_position"`
	// ShareStart is a share group's share-partition start offset, the
	// boundary in place of Stored (every record below it settled by the
	// broker); absent for a consumer group, and for a partition the share
	// group has no state for (then every record is past it).
	ShareStart *int64 `json:"share_start,omitempty"`
	// Incomplete says why offsets of the range were not read.
	Incomplete string `json:"incomplete,omitempty"`
	auditCounts
	// processedSince is the latest processed_at of the claims applied at
	// the offsets read so far: a message after them in the partition was
	// processed no earlier.
	processedSince time.Time
}

// boundary is the offset below which every message was processed: the
// stored position, or a share group's start offset; -1 for none.
func (ap *auditPartition) boundary() int64 {
	if ap.ShareStart != nil {
		return *ap.ShareStart
	}
	return ap.Stored
}

type auditReport struct {
	Consumer string `json:"consumer"`
	Topic    string `json:"topic"`
	Schema   string `json:"schema"`
	// GroupType is the kind of group the audit took the consumer's to be:
	// "consumer" (the boundary is each partition's stored position) or
	// "share" (each partition's share start offset, of share group
	// Group). GroupTypeFrom says why: "record" (what the consumer
	// recorded), "--group-type", or "default" (it recorded nothing).
	GroupType     string `json:"group_type"`
	GroupTypeFrom string `json:"group_type_from"`
	Group         string `json:"group,omitempty"`
	// MessageIDRule is the rule ids were derived by, and MessageIDRuleFrom
	// where it came from: "--id", "record" (what the consumer recorded) or
	// "default" (the consumer recorded nothing).
	MessageIDRule     string `json:"message_id_rule"`
	MessageIDRuleFrom string `json:"message_id_rule_from"`
	// RecordedMessageIDRule is the rule the consumer records ("custom" for
	// a function of its own); absent when it recorded none.
	RecordedMessageIDRule string `json:"recorded_message_id_rule,omitempty"`
	// Hints say, for each kind of problem found, what it more likely means
	// and what to do.
	Hints      []auditHint      `json:"hints,omitempty"`
	Partitions []auditPartition `json:"partitions"`
	Total      auditCounts      `json:"total"`
	// Findings lists the first problems and suspects found.
	Findings []auditFinding `json:"findings"`
	// Complete is false when offsets of the range were not read (see
	// Unread); OK is then false too.
	Complete bool `json:"complete"`
	OK       bool `json:"ok"`
}

// auditHint is what a kind of problem ("would_reapply", "conflict",
// "missing") more likely means.
type auditHint struct {
	Kind string `json:"kind"`
	Text string `json:"text"`
}

const maxFindings = 50

func auditCmd(s *settings) *cobra.Command {
	var consumerName, topic, from, to, idSpec, retentionText, windowText, groupTypeText, group string
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Check a range of the log against what was applied: would a replay apply anything twice?",
		Long: `audit reads a range of a topic and checks every message against the
consumer's claims (processed_messages), dead letters and stored positions:

  applied        claimed and applied at this position
  duplicates     the id was applied at another position (a copy that was skipped)
  dead-lettered  set aside (see kafkaonce dead-letters)
  pruned         below the stored position, claim missing, and processed before
                 the --retention horizon, so pruning may have deleted it: a
                 replay is still safe (the position covers it)
  unprocessed    at or past the stored position: not processed yet
  WOULD REAPPLY  below the stored position but its claim is missing although it
                 was processed after the horizon, so no prune deleted it: if
                 the position were reset (or the producer re-sent it), it
                 would be applied again
  CONFLICT       its id is claimed for different content
  MISSING        below the stored position without a valid id and without a
                 dead letter: it was skipped without a trace

It also lists suspect duplicates: the same content under another id within
--suspect-window (a producer that makes a new id on each retry).

For a share group (the consumer recorded Config.GroupType ShareGroup, or
--group-type share) there are no stored positions: the boundary is each
partition's share start offset, below which the broker settled every
record (accepted, rejected or archived), and the audit checks that each
record below it was applied, claimed as a duplicate or set aside:

  died on last delivery  only a provisional letter: the broker archived the
                 record after a last delivery that never finished (its
                 process died, or the member stopped); the letter stands as
                 an open letter (class crashed) that redrive applies once
  past start     at or past the share start offset: in flight or not
                 delivered yet, never missing (those without a claim or a
                 letter are also unprocessed)

A record below the start offset with no claim is pruned or WOULD REAPPLY
as above, its own time alone bounding when it was processed (a share group
processes a partition out of order). The share group is --group, else the
recorded group, else the consumer's name.

Pruning deletes claims by the time they were processed (processed_at),
and a missing claim's time is gone with it. The audit bounds it from below:
a message is processed no earlier than its own time, nor than the claims
applied at lower offsets of its partition. Only a message whose bound is
before the horizon counts as pruned. Set --retention to the --older-than
prune uses.

--id must derive ids the way the consumer's Config.MessageID does. Without
it, the audit uses the rule the consumer recorded when it last started; a
consumer that derives ids with a function of its own (a MessageIDFunc) must
be given --id. An --id other than the recorded rule is named in the report
with the rule to pass instead, and each kind of problem found gets a HINT
line: the rule first, then the likelier causes. --topic defaults to the
consumer's topic when it records exactly one.

The exit code is 1 when anything would be applied again, conflicts, or is
missing; it is 2, with the partial report, when offsets of the range could
not be read (a fetch failed or timed out, or retention deleted them before
the audit read them): an audit that did not read everything is no verdict.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if consumerName == "" {
				return errors.New("--consumer is required: the consumer's Config.Name")
			}
			retention, err := parseDuration(retentionText)
			if err != nil {
				return fmt.Errorf("--retention: %w", err)
			}
			window, err := parseDuration(windowText)
			if err != nil {
				return fmt.Errorf("--suspect-window: %w", err)
			}
			ctx := cmd.Context()
			c, err := s.connectDB(ctx, consumerName)
			if err != nil {
				return err
			}
			defer c.close()
			if err := schema.RequireLatest(ctx, c.pool, s.schema); err != nil {
				return err
			}
			// Before Kafka is read: a rule the audit cannot have is no
			// reason to read the log, and a wrong one would call every
			// message missing.
			ids, err := idRuleOf(idSpec, c.record, consumerName)
			if err != nil {
				return err
			}
			if topic, err = topicOf(topic, c.record, consumerName); err != nil {
				return err
			}
			kind, err := groupTypeOf(groupTypeText, c.record)
			if err != nil {
				return err
			}
			share := kind.typ == recorded.ShareGroup
			if group != "" && !share {
				return fmt.Errorf("--group names a share group, and consumer %s is audited as a consumer group (%s): its boundary is its stored positions, of no group; pass --group-type share for a share group", consumerName, kind.from)
			}
			if err := s.connectKafka(c, consumerName); err != nil {
				return err
			}
			a := &auditor{pool: c.pool, admin: c.admin, schema: s.schema, consumer: consumerName,
				topic: topic, id: ids.rule, retention: retention, window: window, progress: newProgress(s.st, "auditing")}
			if share {
				a.shareGroup = groupOf(group, c.record, consumerName)
			}
			r, err := a.run(ctx, from, to)
			if err != nil {
				return err
			}
			r.GroupType, r.GroupTypeFrom = kind.typ, kind.from
			r.Schema, r.MessageIDRule, r.MessageIDRuleFrom = s.schema, ids.rule.String(), ids.from
			if c.record != nil {
				r.RecordedMessageIDRule = c.record.MessageIDRule
			}
			r.Hints = problemHints(r.Total, ids, c.record, consumerName, retentionText, share)
			if err := s.emit(r, func(w io.Writer) { printAudit(w, r) }); err != nil {
				return err
			}
			if !r.Complete {
				return fmt.Errorf("the audit did not read %d offsets of the range (%s): run it again, or narrow --from and --to to what can be read", r.Total.Unread, incompleteReasons(r))
			}
			if !r.OK {
				return errFindings
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&consumerName, "consumer", "", "the consumer's name (Config.Name)")
	f.StringVar(&topic, "topic", "", "the topic to audit (default: the consumer's, when it records one)")
	f.StringVar(&from, "from", "earliest", "start: earliest, an offset, an RFC 3339 time, or a duration ago (24h)")
	f.StringVar(&to, "to", "latest", "end (exclusive): latest, an offset, or an RFC 3339 time")
	f.StringVar(&idSpec, "id", "", "how ids are derived: "+consumer.MessageIDRuleForms+" (default: the rule the consumer records, else header:"+consumer.DefaultMessageIDHeader+")")
	f.StringVar(&retentionText, "retention", "7d", "claims older than this may have been pruned")
	f.StringVar(&windowText, "suspect-window", "10m", "how close in time a suspect duplicate must be")
	f.StringVar(&groupTypeText, "group-type", "", "consumer or share: the kind of group the consumer reads in (default: what it records, else consumer)")
	f.StringVar(&group, "group", "", "the share group, for a share group (default: the recorded group, else the consumer's name)")
	return cmd
}

type auditor struct {
	pool      *pgxpool.Pool
	admin     *kafkaadmin.Admin
	schema    string
	consumer  string
	topic     string
	id        consumer.MessageIDRule
	retention time.Duration
	window    time.Duration
	progress  *progress
	// shareGroup is the share group whose start offsets are the
	// boundary, for a consumer in a share group; "" for a consumer group.
	shareGroup string
}

func (a *auditor) run(ctx context.Context, from, to string) (auditReport, error) {
	r := auditReport{Consumer: a.consumer, Topic: a.topic, Group: a.shareGroup}
	parts, err := a.admin.Partitions(ctx, a.topic)
	if err != nil {
		return r, err
	}
	// Read before the records: the claims and letters read after it are
	// of records the broker settled already.
	var shareStarts map[int]kafkaadmin.SharePartition
	if a.shareGroup != "" {
		if shareStarts, err = a.admin.ShareOffsets(ctx, a.shareGroup, a.topic); err != nil {
			return r, err
		}
	}
	bounds, err := a.admin.LogBounds(ctx, a.topic, parts)
	if err != nil {
		return r, err
	}
	starts, err := resolveOffsets(ctx, a.admin, a.topic, parts, bounds, from, true)
	if err != nil {
		return r, fmt.Errorf("--from: %w", err)
	}
	ends, err := resolveOffsets(ctx, a.admin, a.topic, parts, bounds, to, false)
	if err != nil {
		return r, fmt.Errorf("--to: %w", err)
	}
	var total int64
	for _, p := range parts {
		total += max(ends[p]-starts[p], 0)
	}
	a.progress.start(total)
	defer a.progress.done()
	positions, _ := offsets.NewStore(a.schema)
	for _, p := range parts {
		ap := auditPartition{Partition: p, From: starts[p], To: ends[p], Stored: -1}
		if a.shareGroup != "" {
			// A share group stores no positions: the broker's start
			// offset is the boundary.
			if sp, ok := shareStarts[p]; ok {
				ap.ShareStart = &sp.Start
			}
		} else {
			stored, ok, err := positions.Load(ctx, a.pool, a.consumer, a.topic, p)
			if err != nil {
				return r, err
			}
			if ok {
				ap.Stored = stored
			}
		}
		if err := a.partition(ctx, &ap, &r); err != nil {
			return r, err
		}
		r.Partitions = append(r.Partitions, ap)
		r.Total.add(ap.auditCounts)
	}
	r.Complete = r.Total.Unread == 0
	r.OK = r.Total.problems() == 0 && r.Complete
	return r, nil
}

// incompleteReasons joins the partitions' reasons for offsets not read.
func incompleteReasons(r auditReport) string {
	var reasons []string
	for _, p := range r.Partitions {
		if p.Incomplete != "" {
			reasons = append(reasons, fmt.Sprintf("partition %d: %s", p.Partition, p.Incomplete))
		}
	}
	return strings.Join(reasons, "; ")
}

// resolveOffsets turns earliest/latest/an offset/a time into an offset per
// partition, within the log's bounds.
func resolveOffsets(ctx context.Context, admin *kafkaadmin.Admin, topic string, parts []int, bounds map[int]kafkaadmin.Bounds, spec string, isStart bool) (map[int]int64, error) {
	out := map[int]int64{}
	switch {
	case spec == "earliest":
		for _, p := range parts {
			out[p] = bounds[p].Start
		}
	case spec == "latest":
		for _, p := range parts {
			out[p] = bounds[p].End
		}
	default:
		if off, err := strconv.ParseInt(spec, 10, 64); err == nil {
			for _, p := range parts {
				out[p] = min(max(off, bounds[p].Start), bounds[p].End)
			}
			return out, nil
		}
		t, err := time.Parse(time.RFC3339, spec)
		if err != nil {
			d, derr := parseDuration(spec)
			if derr != nil || !isStart {
				return nil, fmt.Errorf("%q is not earliest, latest, an offset or an RFC 3339 time", spec)
			}
			t = time.Now().Add(-d)
		}
		return admin.OffsetsAt(ctx, topic, parts, t)
	}
	return out, nil
}

// partition audits one partition's range in chunks.
func (a *auditor) partition(ctx context.Context, ap *auditPartition, r *auditReport) error {
	if ap.From >= ap.To {
		return nil
	}
	claims, _ := dedupe.NewStore(a.schema)
	letters, _ := lettersstore.NewStore(a.schema)
	window := recent.New(100000, a.window)
	horizon := time.Now().Add(-a.retention)
	return a.scan(ctx, ap, func(chunk []kafkaclient.Record) error {
		err := a.classify(ctx, claims, letters, window, horizon, chunk, ap, r)
		a.progress.add(int64(len(chunk)))
		return err
	})
}

// scan reads ap's range as the consumer reads it, committed records only,
// every offset accounted for, and hands each chunk of records to fn.
// Offsets without a record (compaction, transaction markers, records of
// aborted transactions) are passed; records deleted by retention before
// they were read come back as a DeletedError, and the read goes on from
// the log's new start. What could not be read is counted in ap.Unread and
// said in ap.Incomplete; only a failure of fn, or ctx's end, is returned.
func (a *auditor) scan(ctx context.Context, ap *auditPartition, fn func([]kafkaclient.Record) error) error {
	var deleted int64
	var deletedBelow int64
	next := ap.From
	var stopped error
	for next < ap.To && stopped == nil {
		var err error
		next, err = a.read(ctx, ap, next, fn)
		var gone *kafkaclient.DeletedError
		var failed *classifyError
		switch {
		case errors.As(err, &gone):
			deleted += gone.LogStart - next
			deletedBelow, next = gone.LogStart, gone.LogStart
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.As(err, &failed):
			return failed.err
		default:
			stopped = err
		}
	}
	if stopped != nil {
		ap.Unread += ap.To - next
		ap.Incomplete = fmt.Sprintf("the read stopped at offset %d of %d..%d: %v", next, ap.From, ap.To, stopped)
	}
	if deleted > 0 {
		ap.Unread += deleted
		reason := fmt.Sprintf("%d offsets below %d were deleted (retention) before they were read", deleted, deletedBelow)
		if ap.Incomplete != "" {
			reason = ap.Incomplete + "; " + reason
		}
		ap.Incomplete = reason
	}
	return nil
}

// classifyError is a failure of classify, which ends the audit.
type classifyError struct{ err error }

func (e *classifyError) Error() string { return e.err.Error() }

// auditWait is how long the read waits for the next record.
const auditWait = 2 * time.Second

// read reads ap's partition from next towards ap.To, passing chunks of up
// to 1000 records to classify, and returns where it stopped: ap.To, or
// the offset of the error it returns. The offsets that hold no record
// (transaction markers, records of aborted transactions, compaction) are
// accounted for by the fetcher, so a read that gets nothing for auditWait
// has not reached ap.To: a transaction still open holds the rest back, or
// the broker fails the fetches.
func (a *auditor) read(ctx context.Context, ap *auditPartition, next int64, classify func([]kafkaclient.Record) error) (int64, error) {
	f, err := a.admin.Client().Open(kafkaclient.FetchConfig{Topic: a.topic, Partition: ap.Partition, Start: next, MaxBatch: 1000,
		Linger: 250 * time.Millisecond, Quiet: 50 * time.Millisecond})
	if err != nil {
		return next, err
	}
	defer f.Close()
	var buf []kafkaclient.Record
	for next < ap.To {
		fctx, cancel := context.WithTimeout(ctx, auditWait)
		buf, err = f.Next(fctx, buf)
		timedOut := fctx.Err() != nil && ctx.Err() == nil
		cancel()
		if timedOut {
			if b, berr := a.admin.Client().Bounds(ctx, a.topic, ap.Partition); berr == nil && b.Stable < b.End && b.Stable <= next {
				return next, fmt.Errorf("an open transaction holds back the records from offset %d on", b.Stable)
			}
			return next, fmt.Errorf("no record came from offset %d on within %v: the broker may be failing the fetches", next, auditWait)
		}
		if err != nil {
			return next, err
		}
		n := 0
		for n < len(buf) && buf[n].Offset < ap.To {
			n++
		}
		if n > 0 {
			if err := classify(buf[:n]); err != nil {
				return next, &classifyError{err}
			}
		}
		next = min(f.Position(), ap.To)
	}
	return next, nil
}

// classify checks a chunk of messages against the tables.
func (a *auditor) classify(ctx context.Context, claims *dedupe.Store, letters *lettersstore.Store, window *recent.Window, horizon time.Time, chunk []kafkaclient.Record, ap *auditPartition, r *auditReport) error {
	ids := make([]string, len(chunk))
	idErrs := make([]error, len(chunk))
	fps := make([]dedupe.Fingerprint, len(chunk))
	var lookup []string
	for i := range chunk {
		m := consumer.Message{Topic: chunk[i].Topic, Partition: chunk[i].Partition, Offset: chunk[i].Offset, Key: chunk[i].Key,
			Value: chunk[i].Value, Headers: chunk[i].Headers, Time: chunk[i].Time}
		id, err := a.id.MessageID(&m)
		if err == nil {
			err = consumer.ValidateMessageID(id)
		}
		ids[i], idErrs[i] = id, err
		fps[i] = dedupe.FingerprintOf(chunk[i].Key, chunk[i].Value)
		if err == nil {
			lookup = append(lookup, id)
		}
	}
	existing, err := claims.Lookup(ctx, a.pool, a.consumer, lookup)
	if err != nil {
		return err
	}
	// A letter accounts for the message whose content it holds: after a
	// topic is re-created and its positions reset, a letter of the old
	// topic's message may sit at the same offset as the new one's.
	footprints, err := letters.FootprintsMarked(ctx, a.pool, a.consumer, a.topic, ap.Partition, chunk[0].Offset, chunk[len(chunk)-1].Offset)
	if err != nil {
		return err
	}
	// setAside holds the messages with a letter that sets them aside;
	// provisional, those whose only letter is provisional. A consumer
	// group's audit takes any letter as setting its message aside, as it
	// did before share groups. A share group's provisional letter of a
	// record in flight stands for its last delivery, still under way; of a
	// record the broker settled (below its start offset), for one that
	// died: the record was archived, and the letter, which the engine
	// leaves in place, is its letter (docs/guarantee.md, "Share groups").
	// A record applied on its last delivery has its provisional letter
	// removed by the transaction that applied it: a claim beside one is
	// of an earlier delivery, and the record was applied.
	setAside := make(map[deadletter.Footprint]bool, len(footprints))
	provisional := map[deadletter.Footprint]bool{}
	for _, f := range footprints {
		switch {
		case f.Provisional && a.shareGroup != "" && !setAside[f.Footprint]:
			provisional[f.Footprint] = true
		case !f.Provisional || a.shareGroup == "":
			setAside[f.Footprint] = true
			delete(provisional, f.Footprint)
		}
	}

	find := func(kind string, i int, detail string) {
		if len(r.Findings) < maxFindings {
			r.Findings = append(r.Findings, auditFinding{Kind: kind, Topic: a.topic, Partition: ap.Partition, Offset: chunk[i].Offset, MessageID: ids[i], Detail: detail})
		}
	}
	boundary := ap.boundary()
	for i := range chunk {
		off := chunk[i].Offset
		below := boundary >= 0 && off < boundary
		ap.Read++
		if a.shareGroup != "" && !below {
			ap.PastStart++
		}
		if idErrs[i] == nil {
			if prev, ok := window.Observe(fps[i], ids[i], off, chunk[i].Time); ok {
				ap.Suspects++
				find("suspect_duplicate", i, fmt.Sprintf("same content as %q at offset %d", prev.MessageID, prev.Offset))
			}
		}
		rec, claimed := existing[ids[i]]
		claimed = claimed && idErrs[i] == nil
		footprint := deadletter.Footprint{Offset: off, Fingerprint: fps[i]}
		switch {
		case setAside[footprint]:
			ap.DeadLettered++
		case provisional[footprint] && !claimed && below:
			ap.DiedOnLastDelivery++
		case provisional[footprint] && !claimed:
			// On its last delivery now.
			ap.Unprocessed++
		case idErrs[i] != nil && below:
			ap.Missing++
			find("missing", i, fmt.Sprintf("no valid id by %s (%v) and no dead letter, yet below the %s", a.id, idErrs[i], a.boundaryName()))
		case idErrs[i] != nil:
			ap.Unprocessed++
		case claimed && rec.Fingerprint != fps[i]:
			ap.Conflicts++
			find("conflict", i, fmt.Sprintf("the id is claimed by %s/%d/%d with other content", rec.Topic, rec.Partition, rec.Offset))
		case claimed && rec.Topic == a.topic && rec.Partition == ap.Partition && rec.Offset == off:
			if rec.Status == dedupe.StatusDeadLettered {
				ap.DeadLettered++
			} else {
				ap.Applied++
				if rec.ProcessedAt.After(ap.processedSince) {
					ap.processedSince = rec.ProcessedAt
				}
			}
		case claimed:
			ap.Duplicates++
		case !below:
			ap.Unprocessed++
		case chunk[i].Time.Before(horizon) && (a.shareGroup != "" || ap.processedSince.Before(horizon)):
			// Pruning deletes by processed_at: both bounds on this
			// message's say it may have been processed before the horizon.
			// A share group hands a partition's records out of order, so
			// the claims at lower offsets bound nothing: only the
			// message's own time does.
			ap.Pruned++
		case a.shareGroup != "":
			ap.WouldReapply++
			find("would_reapply", i, "settled by the broker (below the share start offset) after the retention horizon, so not pruned, but its claim is missing: a reset of the start offset (replay) or a re-send would apply it again")
		default:
			ap.WouldReapply++
			find("would_reapply", i, "processed (below the stored position) after the retention horizon, so not pruned, but its claim is missing: a position reset or a re-send would apply it again")
		}
	}
	return nil
}

// boundaryName names the boundary below which every message was
// processed.
func (a *auditor) boundaryName() string {
	if a.shareGroup != "" {
		return "share start offset"
	}
	return "stored position"
}

// problemHints says, for each kind of problem found, what it more likely
// means. Each starts with the id rule, since an audit by another rule than
// the consumer's finds all three kinds: no id (missing), ids never claimed
// (would reapply), or ids claimed by other messages (conflicts).
func problemHints(t auditCounts, ids idChoice, rec *recorded.Settings, consumerName, retention string, share bool) []auditHint {
	var hints []auditHint
	hint := func(kind string, n int64, what, cause string) {
		if n > 0 {
			hints = append(hints, auditHint{Kind: kind, Text: ruleHint(fmt.Sprintf(what, n, ruleSubject(ids, consumerName)), ids, rec, consumerName, cause)})
		}
	}
	if share {
		// Below a share start offset, a record may also never have
		// reached a kafkaonce member: the broker settles what it skips.
		hint("would_reapply", t.WouldReapply, "%d records below the share start offset have no claim by %s",
			fmt.Sprintf("their claims were deleted, by a prune with a shorter --older-than than --retention %s (audit again with that as --retention) or by other means (by hand, a restore of processed_messages); or the group never handed them to a kafkaonce member: it started past them (share.auto.offset.reset latest, Kafka's default: audit --from where it started), its start offset was moved past them (replay --to), or the broker archived them without a letter (docs/guarantee.md, \"Share groups\"). A reset of the start offset (replay) or a re-send would apply them", retention))
	} else {
		hint("would_reapply", t.WouldReapply, "%d messages below the stored position have no claim by %s",
			fmt.Sprintf("their claims were deleted, by a prune with a shorter --older-than than --retention %s (audit again with that as --retention) or by other means (by hand, a restore of processed_messages), and a reset of the stored position or a re-send would apply them again", retention))
	}
	hint("conflict", t.Conflicts, "%d messages have an id claimed for other content (ids by %s)",
		"another message was applied under the same id: a producer that reuses ids for other content, or a topic re-created without kafkaonce topic-recreated (ids by position); the consumer sets such a message aside as a conflict letter when it meets it")
	hint("missing", t.Missing, "%d messages have no id by %s",
		"they were skipped without a trace (the consumer sets messages without an id aside as dead letters)")
	return hints
}

// ruleSubject names the rule the audit derived ids by, and why.
func ruleSubject(ids idChoice, consumerName string) string {
	switch ids.from {
	case "--id":
		return "--id " + ids.rule.String()
	case "default":
		return ids.rule.String() + ", the default"
	}
	return ids.rule.String() + ", the rule consumer " + consumerName + " records"
}

// ruleHint completes a hint whose subject is what was found: an audit by
// a rule that may not be the consumer's points at the rule first, and at
// cause only when the rule is not the explanation.
func ruleHint(subject string, ids idChoice, rec *recorded.Settings, consumerName, cause string) string {
	rule := ids.rule.String()
	switch {
	case ids.from == "--id" && rec != nil && rec.MessageIDRule == recorded.Custom:
		return fmt.Sprintf("%s, and consumer %s derives its ids with a function of its own: pass as --id the rule that function follows (%s)",
			subject, consumerName, consumer.MessageIDRuleForms)
	case ids.from == "--id" && rec != nil && rec.MessageIDRule != rule:
		return fmt.Sprintf("%s, but consumer %s records its ids as %s: run the audit again without --id (or with --id %s)",
			subject, consumerName, rec.MessageIDRule, rec.MessageIDRule)
	case ids.from == "--id" && rec == nil:
		return fmt.Sprintf("%s, and %s: if it derives ids by another rule, audit with that one; if not, %s", subject, noRecord(consumerName), cause)
	case ids.from == "default":
		return fmt.Sprintf("%s: %s, so the audit cannot know its Config.MessageID. If it derives ids otherwise, pass that rule as --id (%s), and a start of the consumer with this kafkaonce records it; if not, %s",
			subject, noRecord(consumerName), consumer.MessageIDRuleForms, cause)
	}
	return fmt.Sprintf("%s: if it derived ids by another rule when it processed them, audit with that one (--id %s); if not, %s",
		subject, consumer.MessageIDRuleForms, cause)
}

// recordedRuleNote says that --id is not the rule the consumer records,
// and what to pass instead; "" when it is, or when no --id was given.
func recordedRuleNote(r auditReport) string {
	if r.MessageIDRuleFrom != "--id" || r.RecordedMessageIDRule == "" || r.RecordedMessageIDRule == r.MessageIDRule {
		return ""
	}
	if r.RecordedMessageIDRule == recorded.Custom {
		return fmt.Sprintf("consumer %s derives its ids with a function of its own: --id %s must be the rule that function follows", r.Consumer, r.MessageIDRule)
	}
	return fmt.Sprintf("consumer %s records its ids as %s, and you asked for --id %s: to audit as the consumer derives its ids, leave --id out (or pass --id %s)",
		r.Consumer, r.RecordedMessageIDRule, r.MessageIDRule, r.RecordedMessageIDRule)
}

func printAudit(w io.Writer, r auditReport) {
	fmt.Fprintf(w, "audit of consumer %s on %s (schema %s)\n", r.Consumer, r.Topic, r.Schema)
	if g := describeGroup(r); g != "" {
		fmt.Fprintf(w, "group: %s\n", g)
	}
	fmt.Fprintf(w, "ids: %s\n", describeRule(r))
	if note := recordedRuleNote(r); note != "" {
		fmt.Fprintf(w, "NOTE: %s\n", note)
	}
	fmt.Fprintln(w)
	if r.GroupType == recorded.ShareGroup {
		printShareAudit(w, r)
		return
	}
	var rows [][]string
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	for _, p := range r.Partitions {
		rows = append(rows, []string{strconv.Itoa(p.Partition), n(p.From) + ".." + n(p.To), optional(p.Stored), n(p.Read), n(p.Unread), n(p.Applied), n(p.Duplicates),
			n(p.DeadLettered), n(p.Pruned), n(p.Unprocessed), n(p.WouldReapply), n(p.Conflicts), n(p.Missing), n(p.Suspects)})
	}
	t := r.Total
	rows = append(rows, []string{"total", "", "", n(t.Read), n(t.Unread), n(t.Applied), n(t.Duplicates), n(t.DeadLettered), n(t.Pruned), n(t.Unprocessed),
		n(t.WouldReapply), n(t.Conflicts), n(t.Missing), n(t.Suspects)})
	table(w, "PARTITION\tRANGE\tSTORED\tREAD\tUNREAD\tAPPLIED\tDUPLICATES\tDEAD-LETTERED\tPRUNED\tUNPROCESSED\tWOULD REAPPLY\tCONFLICTS\tMISSING\tSUSPECTS", rows)
	printFindings(w, r)
	fmt.Fprintln(w)
	switch {
	case r.OK:
		fmt.Fprintf(w, "OK: a replay of this range applies nothing twice (%d messages checked)\n", t.Read)
	case t.problems() > 0:
		fmt.Fprintf(w, "PROBLEMS: %d would be applied again, %d conflict, %d missing\n", t.WouldReapply, t.Conflicts, t.Missing)
	}
	printVerdictNotes(w, r)
}

// printFindings lists the problems and suspects found, by kind.
func printFindings(w io.Writer, r auditReport) {
	if len(r.Findings) > 0 {
		fmt.Fprintln(w)
		sort.SliceStable(r.Findings, func(i, j int) bool { return r.Findings[i].Kind < r.Findings[j].Kind })
		for _, f := range r.Findings {
			fmt.Fprintf(w, "%-17s %s/%d/%d id %q: %s\n", f.Kind, f.Topic, f.Partition, f.Offset, f.MessageID, f.Detail)
		}
	}
}

// printVerdictNotes ends a report with its hints and what was not read.
func printVerdictNotes(w io.Writer, r auditReport) {
	t := r.Total
	for _, h := range r.Hints {
		fmt.Fprintf(w, "HINT: %s\n", h.Text)
	}
	if !r.Complete {
		fmt.Fprintf(w, "INCOMPLETE: %d offsets of the range were not read, and the audit says nothing about them (%s)\n", t.Unread, incompleteReasons(r))
	}
}

// printShareAudit shows a share group's audit: its boundary is each
// partition's share start offset (SHARE START, "-" where the group has no
// state), and the records past it are counted apart (PAST START), never
// missing.
func printShareAudit(w io.Writer, r auditReport) {
	var rows [][]string
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	counts := func(c auditCounts) []string {
		return []string{n(c.Read), n(c.Unread), n(c.Applied), n(c.Duplicates), n(c.DeadLettered), n(c.DiedOnLastDelivery), n(c.Pruned),
			n(c.PastStart), n(c.Unprocessed), n(c.WouldReapply), n(c.Conflicts), n(c.Missing), n(c.Suspects)}
	}
	noStart := 0
	for _, p := range r.Partitions {
		start := "-"
		if p.ShareStart != nil {
			start = n(*p.ShareStart)
		} else {
			noStart++
		}
		rows = append(rows, append([]string{strconv.Itoa(p.Partition), n(p.From) + ".." + n(p.To), start}, counts(p.auditCounts)...))
	}
	t := r.Total
	rows = append(rows, append([]string{"total", "", ""}, counts(t)...))
	table(w, "PARTITION\tRANGE\tSHARE START\tREAD\tUNREAD\tAPPLIED\tDUPLICATES\tDEAD-LETTERED\tDIED ON LAST DELIVERY\tPRUNED\tPAST START\tUNPROCESSED\tWOULD REAPPLY\tCONFLICTS\tMISSING\tSUSPECTS", rows)
	printFindings(w, r)
	fmt.Fprintln(w)
	if noStart > 0 {
		fmt.Fprintf(w, "NOTE: share group %s has no start offset on %d partitions (it has not read them): their records are past start\n", r.Group, noStart)
	}
	if t.PastStart > 0 {
		fmt.Fprintf(w, "past the share start offsets: %d records, in flight or not delivered yet (%d with no claim or letter), none of them missing\n", t.PastStart, t.Unprocessed)
	}
	if t.DiedOnLastDelivery > 0 {
		fmt.Fprintf(w, "died on their last delivery: %d records the broker archived after a last delivery that never finished, set aside by their provisional letters (class crashed), open until redriven or settled: kafkaonce dead-letters lists them\n", t.DiedOnLastDelivery)
	}
	switch {
	case r.OK:
		fmt.Fprintf(w, "OK: every record below the share start offsets was applied, claimed as a duplicate or set aside (%d checked)\n", t.Read-t.PastStart)
	case t.problems() > 0:
		fmt.Fprintf(w, "PROBLEMS: %d would be applied again, %d conflict, %d missing\n", t.WouldReapply, t.Conflicts, t.Missing)
	}
	printVerdictNotes(w, r)
}

// describeGroup says what kind of group the audit took the consumer's
// to be, and why; "" for a consumer group the consumer records, the case
// of every audit before share groups.
func describeGroup(r auditReport) string {
	var kind string
	switch r.GroupType {
	case recorded.ShareGroup:
		kind = "share group " + r.Group + ", boundary its share start offset on each partition"
	default:
		kind = "consumer group, boundary the stored position on each partition"
	}
	switch r.GroupTypeFrom {
	case "--group-type":
		return kind + " (--group-type)"
	case "record":
		if r.GroupType == recorded.ShareGroup {
			return kind + ", as the consumer records"
		}
		return ""
	}
	return kind + ", the default: " + noRecord(r.Consumer) + " (pass --group-type share for a share group)"
}

// describeRule says what the report's ids were derived by, and why.
func describeRule(r auditReport) string {
	switch r.MessageIDRuleFrom {
	case "--id":
		return r.MessageIDRule + " (--id)"
	case "record":
		return r.MessageIDRule + ", as the consumer records"
	}
	return r.MessageIDRule + ", the default: " + noRecord(r.Consumer)
}
