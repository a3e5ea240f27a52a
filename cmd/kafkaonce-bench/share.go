package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
)

// The share cells (-share, run alone): the workload share groups exist
// for, a handler that waits 20 ms on a partner per message, on a topic of
// one partition. A consumer group runs that partition on one member, one
// message after another; a share group hands its records to any number
// of members. kafkaonce's per-message Handler in a consumer group against
// its share mode with 1, 4, 8 and 16 members, interleaved, each run
// checked: every message's effect applied once (the balance sum), and
// every offset of the log claimed once, applied, nothing set aside
// (processed_messages and dead_letters).
var shareModes = []string{"kafkaonce-cg", "kafkaonce-share-1", "kafkaonce-share-4", "kafkaonce-share-8", "kafkaonce-share-16"}

// shareCell is the partner cell: one partition, batches of 10 (what one
// member holds locked at a time, so 16 members hold 160 records).
var shareCell = cell{Partitions: 1, IDs: idUUIDv7, Effect: effectPartner, Size: 100, MaxBatch: 10}

// partnerBacklog is the partner cell's backlog for a mode, given
// -messages: that many for up to 4 members, and N/4 times as many for N
// members, so that every run lasts about as long (20 s for the consumer
// group at the default of 1,000), and the members' joining, which a
// short run of many members would mostly be, weighs about as much in
// each.
func partnerBacklog(mode string, messages int) int {
	var n int
	if _, err := fmt.Sscanf(mode, "kafkaonce-share-%d", &n); err == nil && n > 4 {
		return messages * n / 4
	}
	return messages
}

// grouping runs kafkaonce's per-message Handler in a consumer group,
// counted per message as the share modes are: the share cells' reference.
func grouping(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return applyOne(ctx, tx, c.Effect, m.Key, m.Value)
	})
	return runMembers(ctx, e, c, b, rec, "kafkaonce-cg", 1, &messageProgress{rec: rec}, func(cfg *consumer.Config) { cfg.Handler = h })
}

// sharing runs members consumers of kafkaonce's share mode, one Name and
// one share group, with the cell's effect as a per-message Handler.
func sharing(members int) func(context.Context, *env, cell, backlog, *recorder) error {
	return func(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
		if c.Dups > 0 {
			// messageProgress counts distinct messages; a backlog with
			// re-sends would never reach its total.
			return fmt.Errorf("the share modes run on cells without re-sends")
		}
		mode := fmt.Sprintf("kafkaonce-share-%d", members)
		group := b.topic + "-" + mode + wrapping(ctx).group
		// The backlog is there before the members: the group starts at the
		// log's start, not its end (a share group's default).
		if err := (&devenv.Env{Brokers: e.brokers}).SetShareStart(ctx, group, "earliest"); err != nil {
			return err
		}
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			return applyOne(ctx, tx, c.Effect, m.Key, m.Value)
		})
		return runMembers(ctx, e, c, b, rec, mode, members, &messageProgress{rec: rec}, func(cfg *consumer.Config) {
			cfg.Handler, cfg.GroupType, cfg.KafkaClient = h, consumer.ShareGroup, consumer.FranzGo
		})
	}
}

// messageProgress feeds the recorder from the per-message hooks, which a
// share group member calls as a consumer group's does. A share member runs
// no batches of a partition: it calls neither OnBatchStart nor OnBatchEnd
// (what kafkaonceHooks counts) and commits no offsets. A message counts
// once its effect committed (OnMessageApplied, called after the COMMIT,
// and once per message id: its claim is unique); a record delivered again
// after that (a lost accept, a lock run out) is found claimed
// (OnMessageSkipped) and counted apart, not again. The run's clock starts
// when the first handler call began (OnHandlerEnd, less the call's time),
// not when the members joined: a consumer group's time to join is not
// counted either.
type messageProgress struct{ rec *recorder }

func (p *messageProgress) OnHandlerEnd(_ context.Context, _ *consumer.Message, d time.Duration, _ error) {
	p.rec.earliest(time.Now().Add(-d))
}

func (p *messageProgress) OnMessageApplied(_ context.Context, m *consumer.Message) {
	now := time.Now()
	p.rec.add(m.Partition, 1, now)
	if sent, ok := sentAt(m.Headers); ok {
		p.rec.observe(sent, now)
	}
}

func (p *messageProgress) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	p.rec.foundClaimed.Add(1)
}

func (p *messageProgress) OnMessageDeadLettered(context.Context, *consumer.Message, consumer.DeadLettered) {
	p.rec.setAside.Add(1)
}

// shareRun is one cell of the share cells with the modes it runs.
type shareRun struct {
	c     cell
	modes []string
	msgs  int
}

func runShareCells(ctx context.Context, log *slog.Logger, o options) error {
	e, err := openEnv(ctx, log, o, 40)
	if err != nil {
		return err
	}
	defer e.close()
	log.Info("environment", "kafka", e.brokerDesc, "postgres", e.pgDesc)
	cells := []shareRun{{c: shareCell, modes: shareModes, msgs: o.messages}}
	var results []result
	for round := 1; round <= o.rounds; round++ {
		for ci, sc := range cells {
			order := slices.Clone(sc.modes)
			for range round - 1 { // rotate: no mode always runs first
				order = append(order[1:], order[0])
			}
			for _, name := range order {
				msgs := sc.msgs
				if sc.c == shareCell {
					msgs = partnerBacklog(name, msgs)
				}
				r, err := runShareOne(ctx, e, sc.c, name, msgs, round, uint64(round*100+ci), o)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", name, sc.c, err)
				}
				log.Info("share run", "round", round, "cell", sc.c.String(), "mode", name, "msgs/s", int(r.MsgsPerSec),
					"2nd half msgs/s", int(r.SteadyMsgsPerSec), "db rt/msg", fmt.Sprintf("%.2f", r.RoundTripsPerMsg),
					"found claimed", r.FoundClaimed, "check", r.Correct)
				results = append(results, r)
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		}
	}
	md, ratios := shareMarkdown(results, o, (&report{env: e}).machine())
	fmt.Print(md)
	fmt.Println(ratios)
	return nil
}

// runShareOne runs one mode on a topic of its own (each group drains the
// whole backlog), then checks the claims and letters it left.
func runShareOne(ctx context.Context, e *env, c cell, name string, msgs, round int, seed uint64, o options) (result, error) {
	topic := fmt.Sprintf("bench-share-r%d-%d", round, time.Now().UnixNano())
	if err := createTopic(ctx, e, topic, c.Partitions); err != nil {
		return result{}, err
	}
	defer func() { _ = deleteTopic(context.WithoutCancel(ctx), e, topic) }()
	b, err := produce(ctx, e.brokers, topic, c, msgs, seed)
	if err != nil {
		return result{}, err
	}
	// No stalls followed: a lock taken per message, in every member, would
	// weigh on the modes that count per message here.
	b.perPartition = nil
	r, err := runOne(ctx, e, modeNamed(name), c, b, round, o)
	if err != nil {
		return r, err
	}
	if r.Messages < int64(b.total) {
		return r, fmt.Errorf("%d of %d messages applied before the time budget ran out", r.Messages, b.total)
	}
	if err := claimedOnce(ctx, e.db, b); err != nil {
		return r, err
	}
	if r.Correct == "complete" {
		r.Correct = "claimed once each" // the no-op effect leaves nothing else to count
	}
	return r, nil
}

// claimedOnce checks, in the schema a kafkaonce run used (made afresh for
// it), that every offset of the backlog was claimed once and applied, and
// nothing set aside: with check's balance sum, that each message was
// applied once, neither lost nor doubled by a record delivered twice.
func claimedOnce(ctx context.Context, db *pgxpool.Pool, b backlog) error {
	var rows, applied, offsets, letters int64
	err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'applied'), count(DISTINCT (partition, kafka_offset)),
	(SELECT count(*) FROM `+emptySchema+`.dead_letters)
FROM `+emptySchema+`.processed_messages`).Scan(&rows, &applied, &offsets, &letters)
	if err != nil {
		return err
	}
	if rows != int64(b.total) || applied != rows || offsets != rows || letters != 0 {
		return fmt.Errorf("%d messages produced; processed_messages holds %d claims, %d applied, of %d distinct offsets; dead_letters holds %d",
			b.total, rows, applied, offsets, letters)
	}
	return nil
}

// shareMarkdown is the share cells' table: per mode, the median
// throughput (whole runs, and their second halves), the median and range
// of its ratio to the consumer group's taken round by round, and that
// ratio over N; ratios is the last line of stdout.
func shareMarkdown(results []result, o options, machine string) (md, ratios string) {
	of := func(c cell, mode string) map[int]result {
		out := map[int]result{}
		for _, r := range results {
			if r.Mode == mode && r.Cell == c {
				out[r.Round] = r
			}
		}
		return out
	}
	median := func(runs map[int]result, f func(result) float64) float64 {
		var v []float64
		for _, r := range runs {
			v = append(v, f(r))
		}
		return medianOf(v)
	}
	whole := func(r result) float64 { return r.MsgsPerSec }
	steady := func(r result) float64 { return r.SteadyMsgsPerSec }
	// paired is the median, least and greatest of f(a)/f(b) round by
	// round: the runs of a round are close in time, so their ratio is
	// steadier than the ratio of the medians.
	paired := func(a, b map[int]result, f func(result) float64) (med, lo, hi float64) {
		var v []float64
		for round, x := range a {
			if y, ok := b[round]; ok && f(y) > 0 {
				v = append(v, f(x)/f(y))
			}
		}
		if len(v) == 0 {
			return 0, 0, 0
		}
		return medianOf(v), slices.Min(v), slices.Max(v)
	}
	found := func(runs map[int]result) (n int64) {
		for _, r := range runs {
			n += r.FoundClaimed
		}
		return n
	}
	checks := func(runs map[int]result) string {
		var cs []string
		for _, r := range runs {
			if !slices.Contains(cs, r.Correct) {
				cs = append(cs, r.Correct)
			}
		}
		slices.Sort(cs)
		return strings.Join(cs, ", ")
	}
	var sb strings.Builder
	when := time.Now().UTC().Format("2006-01-02 15:04 UTC")
	fmt.Fprintf(&sb, "## Share groups\n\nGenerated by `kafkaonce-bench -share` on %s:\n\n    go run ./cmd/kafkaonce-bench -share -rounds %d -messages %d\n\n", when, o.rounds, o.messages)
	fmt.Fprintf(&sb, "**Machine:** %s. Cell: %s; per-message Handler; the backlog %d messages, N/4 times as many for N > 4 members. Modes interleaved, median of the rounds.\n\n", machine, shareCell, o.messages)
	sb.WriteString("| mode | members | msgs/s | 2nd half msgs/s | × consumer group | range | 2nd half × consumer group | × consumer group / members | found claimed | check |\n|---|---|---|---|---|---|---|---|---|---|\n")
	cg := of(shareCell, "kafkaonce-cg")
	var parts []string
	for _, m := range shareModes {
		runs := of(shareCell, m)
		if len(runs) == 0 {
			continue
		}
		members, label := 1, "consumer group"
		if _, err := fmt.Sscanf(m, "kafkaonce-share-%d", &members); err == nil {
			label = "share group"
		}
		r, lo, hi := paired(runs, cg, whole)
		rs, _, _ := paired(runs, cg, steady)
		fmt.Fprintf(&sb, "| %s | %d | %.0f | %.0f | %.2f | %.2f–%.2f | %.2f | %.2f | %d | %s |\n", label, members, median(runs, whole),
			median(runs, steady), r, lo, hi, rs, r/float64(members), found(runs), checks(runs))
		if label == "share group" {
			parts = append(parts, fmt.Sprintf("%q: %.2f", fmt.Sprintf("share-%d/consumer-group", members), r))
		}
	}
	return sb.String(), "{" + strings.Join(parts, ", ") + "}"
}
