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
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
)

// The share cells (-share, run alone). First the workload share groups
// exist for: a handler that waits 20 ms on a partner per message, on a
// topic of one partition. A consumer group runs that partition on one
// member, one message after another; a share group hands its records to
// any number of members. kafkaonce's per-message Handler in a consumer
// group against its share mode with 1, 4, 8 and 16 members. Then the base
// cells (update and no-op handlers, 12 partitions, batches of 1,000): the
// consumer group against a share group of one member, which shows what
// share mode costs where it brings nothing. Modes interleaved, each run
// checked: every message's effect applied once (the balance sum, for
// the effects that change it), and every offset of the log claimed once,
// applied, nothing set aside (processed_messages and dead_letters).
var (
	shareModes     = []string{"kafkaonce-cg", "kafkaonce-share-1", "kafkaonce-share-4", "kafkaonce-share-8", "kafkaonce-share-16"}
	shareBaseModes = []string{"kafkaonce-cg", "kafkaonce-share-1"}
)

// shareCell is the partner cell: one partition, batches of 10 (what one
// member holds locked at a time, so 16 members hold 160 records).
var shareCell = cell{Partitions: 1, IDs: idUUIDv7, Effect: effectPartner, Size: 100, MaxBatch: 10}

// shareBaseMessages is the backlog of each base cell: several seconds of
// the slower mode.
const shareBaseMessages = 100_000

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

// shareSection and shareKafkaSection are the parts of BENCHMARKS.md the
// share cells write: on kfake, and against a real broker (KAFKA_BROKERS).
const (
	shareSection      = "kafkaonce-bench-share"
	shareKafkaSection = "kafkaonce-bench-share-kafka"
)

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
	noop := base
	noop.Effect = effectNoop
	cells := []shareRun{{c: shareCell, modes: shareModes, msgs: o.messages}}
	if o.shareBase {
		cells = append(cells, shareRun{c: base, modes: shareBaseModes, msgs: shareBaseMessages}, shareRun{c: noop, modes: shareBaseModes, msgs: shareBaseMessages})
	}
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
	where := whereShare(ctx, e)
	md, ratios := shareMarkdown(results, o, where)
	fmt.Print(md)
	fmt.Println(ratios)
	if o.markdown == "" {
		return nil
	}
	section := shareSection
	if where.brokers != "" {
		section = shareKafkaSection
	}
	return benchdoc.Write(o.markdown, section, md)
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

// brokerVersion is the release of the broker at brokers, as franz-go
// guesses it from the API versions it answers with.
func brokerVersion(ctx context.Context, brokers []string) string {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return "(version unknown)"
	}
	defer cl.Close()
	vs, err := kadm.NewClient(cl).ApiVersions(ctx)
	if err != nil {
		return "(version unknown)"
	}
	for _, v := range vs.Sorted() {
		if v.Err == nil {
			return strings.TrimPrefix(v.VersionGuess(), "v")
		}
	}
	return "(version unknown)"
}

// shareMarkdown is the share cells' section: per mode of the partner
// cell, the median throughput (whole runs, and their second halves), the
// median and range of its ratio to the consumer group's taken round by
// round, and that ratio over N; then the base cells' ratio of a share
// member to the consumer group; ratios is the last line of stdout.
func shareMarkdown(results []result, o options, where shareWhere) (md, ratios string) {
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
	cmd := "go run ./cmd/kafkaonce-bench -share"
	if !o.shareBase {
		cmd += " -share-base=false"
	}
	cmd += fmt.Sprintf(" -rounds %d -messages %d -markdown BENCHMARKS.md", o.rounds, o.messages)
	if where.brokers != "" {
		cmd = "KAFKA_BROKERS=" + where.brokers + " " + cmd
		fmt.Fprintf(&sb, "### On %s\n\nGenerated by `kafkaonce-bench -share` on %s, against %s (one broker, `scripts/kafka-broker.sh`):\n\n    %s\n\n", where.broker, when, where.broker, cmd)
	} else {
		sb.WriteString(shareIntro)
		fmt.Fprintf(&sb, "### On kfake\n\nGenerated by `kafkaonce-bench -share` on %s:\n\n    %s\n\n", when, cmd)
	}
	fmt.Fprintf(&sb, "**Machine:** %s. Postgres: %s.\n\n", where.machine, where.postgres)
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
	if o.shareBase {
		noop := base
		noop.Effect = effectNoop
		fmt.Fprintf(&sb, "\nBase cells (%d,%03d messages each):\n\n", shareBaseMessages/1000, shareBaseMessages%1000)
		sb.WriteString("| cell | consumer group (msgs/s) | share group, 1 member (msgs/s) | share / consumer group | range | DB round trips per message, consumer group / share | check |\n|---|---|---|---|---|---|---|\n")
		for _, c := range []cell{base, noop} {
			g, s := of(c, "kafkaonce-cg"), of(c, "kafkaonce-share-1")
			if len(g) == 0 || len(s) == 0 {
				continue
			}
			r, lo, hi := paired(s, g, whole)
			rt := func(r result) float64 { return r.RoundTripsPerMsg }
			fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.2f | %.2f–%.2f | %.2f / %.2f | %s |\n", c, median(g, whole), median(s, whole), r, lo, hi,
				median(g, rt), median(s, rt), checks(s))
			parts = append(parts, fmt.Sprintf("%q: %.2f", string(c.Effect)+" share-1/consumer-group", r))
		}
	}
	return sb.String(), "{" + strings.Join(parts, ", ") + "}"
}

// shareWhere is where the share cells ran.
type shareWhere struct {
	machine  string
	postgres string // the server's durability settings
	broker   string // "kfake", or "Kafka 4.3"
	brokers  string // KAFKA_BROKERS, "" on kfake
}

// whereShare describes e for the share cells' section.
func whereShare(ctx context.Context, e *env) shareWhere {
	w := shareWhere{machine: (&report{env: e}).machine(), broker: "kfake"}
	if !strings.HasPrefix(e.brokerDesc, "kfake") {
		w.brokers = strings.Join(e.brokers, ",")
		w.broker = "Kafka " + brokerVersion(ctx, e.brokers)
	}
	// Per-poll commits pay for durability: say what the server's is.
	var fsync, sync string
	if err := e.db.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&fsync, &sync); err == nil {
		w.postgres = "fsync " + fsync + ", synchronous_commit " + sync
	}
	return w
}

// shareIntro heads the share cells' section (written with the kfake
// figures): what is measured, how to read it, and why the scaling falls
// short of N×.
const shareIntro = `## Share groups

A share group (KIP-932, ` + "`GroupType: consumer.ShareGroup`" + `) lets any number of members take the records of one partition; a consumer group gives a partition to one member. The workload share groups exist for is a handler that waits on a partner. In the partner cell each message waits 20 ms, then records the answer (a one-row UPDATE of an account of its own), on a topic of **one partition**, with a per-message ` + "`Handler`" + ` and ` + "`MaxBatch`" + ` 10. The consumer group runs the partition on one member, ten messages to a transaction, one after another: under 1 / 20 ms = 50 msgs/s. A share group of N members runs up to N such transactions at once, and can approach N × the consumer group's rate. The base cells (12 partitions, batches of 1,000, the update and the no-op handler) put a share group of one member against the consumer group, where a share group brings nothing: what share mode costs.

How the figures are taken. Modes interleaved, their order rotating from round to round, each run on a topic and a backlog of its own: ` + "`-messages`" + ` (1,000 by default) in the partner cell, N/4 times as many for N > 4 members, so that every run lasts about as long; 100,000 in the base cells. A run's clock starts at its first handler call and stops at the commit of its last message, so joining is not counted, but members that start after the first do lose time; "2nd half" figures count only the second half of the messages. A message counts once its effect committed, as the consumer reports it (` + "`OnMessageApplied`" + `, in every mode, so that the modes count alike); "found claimed" counts records delivered again after they were applied (` + "`OnMessageSkipped`" + `: an accept lost, a lock run out), over all rounds. Every run is checked against the database, and the program stops with an error if a check fails: the balance sum grew by one per message ("once each"; the no-op effect leaves none to count: "claimed once each"), ` + "`processed_messages`" + ` holds one applied claim for every offset of the log, and ` + "`dead_letters`" + ` is empty. On a real broker: ` + "`scripts/kafka-broker.sh start 4.3.0 19444 DIR`" + `, then the command with ` + "`KAFKA_BROKERS=127.0.0.1:19444`" + `.

How to read them: the ratios, not the msgs/s, which on a shared 2-core machine move from run to run. "× consumer group" is the median over the rounds of each round's share-group msgs/s over the consumer group's, with the least and the greatest as the range; "× consumer group / members" is the part of N× reached (1.00: all of it).

Where share mode falls short of N×, and what it costs:

- **Savepoints only after a failure.** A share member, like the consumer group, runs a transaction's handler calls without savepoints until one fails, then with one per call: the round trips per message in the base cells' tables are the same in both modes while nothing fails.
- **A transaction and a poll in turn.** A member claims, applies and commits its up-to-10 records in one transaction, accepts them, flushes the acknowledgements, and only then fetches again (for a poll only, so that no lock runs down in a buffer): per 10 records a durable COMMIT, an acknowledgement round trip and a share fetch, where a consumer group fetches while its transactions run. That holds one member below the consumer group; in the base cells a member also applies a poll's partitions one after another, where the consumer group runs a worker per partition side by side.
- **Joining.** Members join one after another, and each takes records only once the group coordinator has assigned it the partition, after a heartbeat or two: the first starts on the backlog alone, the last later, the more members the later. The whole-run ratio counts that against the share group; the 2nd half ratio leaves most of it out.
- **Two cores.** Sixteen members, their Postgres sessions and the broker share them with whatever else runs.
- **Not a bound here: records in flight.** A share-partition hands out at most ` + "`group.share.partition.max.record.locks`" + ` records at a time (2,000 by default on Kafka 4.3, and on kfake); 16 members of 10 records hold 160. More members, or members polling more, would meet it. Lock renewals (at half the acquisition lock, 30 s by default) do not happen in transactions of 200 ms.

`
