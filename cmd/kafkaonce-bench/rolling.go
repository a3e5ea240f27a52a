package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// rollingSection is the part of BENCHMARKS.md the rolling restart (-rolling)
// writes.
const rollingSection = "kafkaonce-bench-rolling"

// A rolling restart (-rolling): three members of one group consume twelve
// partitions while a producer writes to all of them at a steady rate; each
// member in turn is stopped, stays down rollingDown (a process restarting),
// and starts again. Per restart it measures how long partitions go without
// a commit: those of the members that were not restarted (what a rebalance
// costs bystanders), and the restarted member's own. Five groupings, on two
// group protocols. The classic protocol: eager rebalancing (kafka-go: every
// rebalance stops every partition), cooperative (franz-go: only the
// partitions that change owner move), and cooperative with static members
// (franz-go with InstanceID: a member back within its session gets its
// partitions back without a rebalance). The consumer protocol (KIP-848,
// franz-go): the broker assigns, with dynamic members and with static ones.
// A broker that does not serve the consumer protocol gets the classic three
// alone, and the section says why.
const (
	rollingPartitions = 12
	rollingMembers    = 3
	rollingRate       = 1200 // messages per second, over all partitions
	rollingDown       = 2 * time.Second
	// rollingSettle is how long every partition must have kept committing
	// before the next restart.
	rollingSettle = 5 * time.Second
	// rollingSession and rollingHeartbeat are every variant's: a classic
	// member's own SessionTimeout and HeartbeatInterval, and under the
	// consumer protocol (where the broker keeps them, and a member may not
	// set them) the group's consumer.session.timeout.ms and
	// consumer.heartbeat.interval.ms, so that the protocols are compared
	// on the same session.
	rollingSession   = 10 * time.Second
	rollingHeartbeat = time.Second
)

type rollingVariant struct {
	protocol consumer.GroupProtocol
	name     string // the grouping, within its protocol
	client   consumer.KafkaClient
	static   bool
}

// key names the variant among all of them.
func (v rollingVariant) key() string { return v.protocol.String() + ": " + v.name }

// protocolName is the variant's protocol, as the table shows it.
func (v rollingVariant) protocolName() string {
	if v.protocol == consumer.ConsumerProtocol {
		return "consumer (KIP-848)"
	}
	return "classic"
}

var rollingVariants = []rollingVariant{
	{consumer.ClassicProtocol, "eager (kafka-go)", consumer.KafkaGo, false},
	{consumer.ClassicProtocol, "cooperative (franz-go)", consumer.FranzGo, false},
	{consumer.ClassicProtocol, "cooperative, static members (franz-go, InstanceID)", consumer.FranzGo, true},
	{consumer.ConsumerProtocol, "the broker assigns (franz-go)", consumer.FranzGo, false},
	{consumer.ConsumerProtocol, "the broker assigns, static members (franz-go, InstanceID)", consumer.FranzGo, true},
}

// rollingPlan is what a run measures on its broker.
type rollingPlan struct {
	variants []rollingVariant
	// skipped says which variants were left out, and why; "" when none
	// were.
	skipped string
}

// planRolling picks the variants from served, what
// franz.CheckConsumerProtocolServed said of the broker: every variant when
// it serves the consumer protocol (nil), the classic ones alone when it
// does not.
func planRolling(served error) rollingPlan {
	if served == nil {
		return rollingPlan{variants: rollingVariants}
	}
	var p rollingPlan
	for _, v := range rollingVariants {
		if v.protocol == consumer.ClassicProtocol {
			p.variants = append(p.variants, v)
		}
	}
	p.skipped = fmt.Sprintf("The consumer protocol's rows are left out: the broker does not serve it (%v).", served)
	return p
}

// rollingResult is one restart's longest gaps between commits.
type rollingResult struct {
	Variant    string        `json:"variant"`
	Restarted  int           `json:"restarted"`
	Bystanders time.Duration `json:"bystanders_longest_gap"`
	Own        time.Duration `json:"restarted_member_longest_gap"`
	// Assigned counts the partition assignments the restart caused: a
	// partition that moves, or is handed back, counts once per member that
	// receives it.
	Assigned int `json:"partitions_assigned"`
}

// commitLog records when each partition committed, which member holds it,
// and how many assignments the group has handed out.
type commitLog struct {
	mu          sync.Mutex
	commits     map[int][]time.Time
	owner       map[int]int
	assignments int
}

func (l *commitLog) committed(p int, at time.Time) {
	l.mu.Lock()
	l.commits[p] = append(l.commits[p], at)
	l.mu.Unlock()
}

func (l *commitLog) assigned(p, member int) {
	l.mu.Lock()
	l.owner[p] = member
	l.assignments++
	l.mu.Unlock()
}

// assignedSoFar is the number of assignments handed out since the start.
func (l *commitLog) assignedSoFar() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.assignments
}

// owners returns each partition's holder now.
func (l *commitLog) owners() map[int]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int]int, len(l.owner))
	for p, m := range l.owner {
		out[p] = m
	}
	return out
}

// longestGap is the longest time partition p went without a commit between
// from and to (counting from the last commit before from).
func (l *commitLog) longestGap(p int, from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := from
	var longest time.Duration
	for _, at := range l.commits[p] {
		if at.Before(from) {
			last = at
			continue
		}
		if at.After(to) {
			break
		}
		longest = max(longest, at.Sub(last))
		last = at
	}
	return max(longest, to.Sub(last))
}

// settled reports whether every partition committed within the last
// second.
func (l *commitLog) settled(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for p := range rollingPartitions {
		c := l.commits[p]
		if len(c) == 0 || now.Sub(c[len(c)-1]) > time.Second {
			return false
		}
	}
	return true
}

// rollingHooks feed a commitLog from one member's hooks.
type rollingHooks struct {
	log    *commitLog
	member int
}

func (h *rollingHooks) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	if r.Committed > 0 {
		h.log.committed(b.Partition, time.Now())
	}
}

func (h *rollingHooks) OnPartitionAssigned(_ context.Context, a consumer.PartitionAssignment) {
	h.log.assigned(a.Partition, h.member)
}

func runRollingRestart(ctx context.Context, log *slog.Logger, o options) error {
	if os.Getenv("KAFKA_BROKERS") == "" {
		return errors.New("-rolling measures group protocols: run it against a real broker (KAFKA_BROKERS), e.g. Apache Kafka 4.3.0 from scripts/kafka-broker.sh")
	}
	e, err := openEnv(ctx, log, o, 60)
	if err != nil {
		return err
	}
	defer e.close()
	admin, err := kgo.NewClient(kgo.SeedBrokers(e.brokers...))
	if err != nil {
		return err
	}
	defer admin.Close()
	served := franz.CheckConsumerProtocolServed(ctx, admin)
	if served != nil && !errors.Is(served, franz.ErrConsumerProtocolUnavailable) {
		return served
	}
	plan := planRolling(served)
	if plan.skipped != "" {
		log.Warn(plan.skipped)
	}
	version := brokerVersion(ctx, e.brokers)
	var results []rollingResult
	for round := 1; round <= o.rounds; round++ {
		for _, v := range plan.variants {
			rs, err := rollingRun(ctx, e, admin, log, v, round)
			if err != nil {
				return fmt.Errorf("%s: %w", v.key(), err)
			}
			results = append(results, rs...)
		}
	}
	md := rollingMarkdown(results, plan, version, o, e)
	fmt.Print(md)
	if o.markdown == "" {
		return nil
	}
	return benchdoc.Write(o.markdown, rollingSection, md)
}

// rollingRun restarts each member of one group once, in turn.
func rollingRun(ctx context.Context, e *env, admin *kgo.Client, log *slog.Logger, v rollingVariant, round int) ([]rollingResult, error) {
	topic := fmt.Sprintf("bench-rolling-r%d-%d", round, time.Now().UnixNano())
	if err := createTopic(ctx, e, topic, rollingPartitions); err != nil {
		return nil, err
	}
	defer func() { _ = deleteTopic(context.WithoutCancel(ctx), e, topic) }()
	schema, err := kafkaonceSchema(ctx, e.db, false)
	if err != nil {
		return nil, err
	}
	clog := &commitLog{commits: map[int][]time.Time{}, owner: map[int]int{}}
	name, group := nextConsumerName(), topic+"-group"
	if v.protocol == consumer.ConsumerProtocol {
		if err := franz.SetGroupConfigs(ctx, admin, group, map[string]string{
			"consumer.session.timeout.ms":    strconv.FormatInt(rollingSession.Milliseconds(), 10),
			"consumer.heartbeat.interval.ms": strconv.FormatInt(rollingHeartbeat.Milliseconds(), 10),
		}); err != nil {
			return nil, err
		}
	}
	start := func(member int) (stop func() error, err error) {
		cfg := &consumer.Config{Name: name, GroupID: group, Brokers: e.brokers, Topics: []string{topic}, Schema: schema,
			KafkaClient: v.client, GroupProtocol: v.protocol, RebalanceTimeout: 20 * time.Second,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Hooks: []consumer.Hook{&rollingHooks{log: clog, member: member}},
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				return applyOne(ctx, tx, effectUpdate, m.Key, m.Value)
			})}
		if v.protocol == consumer.ClassicProtocol {
			cfg.SessionTimeout, cfg.HeartbeatInterval = rollingSession, rollingHeartbeat
		}
		if v.static {
			cfg.InstanceID = "member-" + strconv.Itoa(member)
		}
		c, err := consumer.New(e.db, cfg)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(rctx) }()
		return func() error { cancel(); return <-done }, nil
	}
	stops := make([]func() error, rollingMembers)
	defer func() {
		for _, s := range stops {
			if s != nil {
				_ = s()
			}
		}
	}()
	for m := range stops {
		if stops[m], err = start(m); err != nil {
			return nil, err
		}
	}
	pctx, stopProducing := context.WithCancel(ctx)
	produced := make(chan error, 1)
	go func() { produced <- produceSteadily(pctx, e.brokers, topic) }()
	defer func() { stopProducing(); <-produced }()

	waitSettled := func() error {
		since := time.Time{}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			now := time.Now()
			switch {
			case !clog.settled(now):
				since = time.Time{}
			case since.IsZero():
				since = now
			case now.Sub(since) >= rollingSettle:
				return nil
			}
			if now.After(deadline) {
				return errors.New("the group did not settle within 2 minutes")
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := waitSettled(); err != nil {
		return nil, err
	}
	var out []rollingResult
	for m := range rollingMembers {
		owners, assignedBefore := clog.owners(), clog.assignedSoFar()
		from := time.Now()
		if err := stops[m](); err != nil {
			return nil, err
		}
		stops[m] = nil
		time.Sleep(rollingDown)
		if stops[m], err = start(m); err != nil {
			return nil, err
		}
		if err := waitSettled(); err != nil {
			return nil, err
		}
		to := time.Now().Add(-rollingSettle)
		r := rollingResult{Variant: v.key(), Restarted: m, Assigned: clog.assignedSoFar() - assignedBefore}
		for p := range rollingPartitions {
			gap := clog.longestGap(p, from, to)
			if owners[p] == m {
				r.Own = max(r.Own, gap)
			} else {
				r.Bystanders = max(r.Bystanders, gap)
			}
		}
		log.Info("rolling restart", "variant", v.key(), "round", round, "member", m, "bystanders' longest gap", r.Bystanders, "restarted member's longest gap", r.Own, "partitions assigned", r.Assigned)
		out = append(out, r)
	}
	return out, nil
}

// produceSteadily writes rollingRate messages a second, spread over the
// partitions, until ctx is done.
func produceSteadily(ctx context.Context, brokers []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	const tick = 10 * time.Millisecond
	per := rollingRate * int(tick) / int(time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for i := 0; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for range per {
			id := "r-" + strconv.Itoa(i)
			cl.Produce(ctx, &kgo.Record{Partition: int32(i % rollingPartitions), Key: []byte("acct-" + strconv.Itoa(i%1000)), Value: []byte("v"),
				Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}, nil)
			i++
		}
	}
}

func rollingMarkdown(results []rollingResult, plan rollingPlan, version string, o options, e *env) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "## Rolling restart\n\nGenerated by `kafkaonce-bench -rolling` on %s, against %s (Kafka %s, as its API versions say):\n\n    KAFKA_BROKERS=... go run ./cmd/kafkaonce-bench -rolling -rounds %d -markdown BENCHMARKS.md\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), e.brokerDesc, version, o.rounds)
	fmt.Fprintf(&sb, "**Machine:** %s. %d members, %d partitions, %d msgs/s produced steadily; each member in turn stopped, down %v, started again. Every variant has the same session, %v, and heartbeat, %v: a classic member's own SessionTimeout and HeartbeatInterval; under the consumer protocol, where the broker keeps them and a member may not set them, the group's `consumer.session.timeout.ms` and `consumer.heartbeat.interval.ms`, set on the group (IncrementalAlterConfigs) before its members start. Per variant, over the %d restarts of each round: the longest time a partition went without a commit, among the partitions of the members **not** restarted, and among the restarted member's own (median, and the worst).\n\n",
		(&report{env: e}).machine(), rollingMembers, rollingPartitions, rollingRate, rollingDown, rollingSession, rollingHeartbeat, rollingMembers)
	sb.WriteString("| protocol | grouping | partitions assigned per restart, median | bystanders' longest gap, median (s) | worst (s) | restarted member's longest gap, median (s) | worst (s) |\n|---|---|---|---|---|---|---|\n")
	for _, v := range plan.variants {
		var by, own, assigned []float64
		for _, r := range results {
			if r.Variant == v.key() {
				by, own = append(by, r.Bystanders.Seconds()), append(own, r.Own.Seconds())
				assigned = append(assigned, float64(r.Assigned))
			}
		}
		fmt.Fprintf(&sb, "| %s | %s | %.0f | %.2f | %.2f | %.2f | %.2f |\n", v.protocolName(), v.name, medianOf(assigned), medianOf(by), slices.Max(append(by, 0)), medianOf(own), slices.Max(append(own, 0)))
	}
	if plan.skipped != "" {
		sb.WriteString("\n" + plan.skipped + "\n")
	}
	sb.WriteString(rollingReading)
	return sb.String()
}

// rollingReading says how to read the table.
const rollingReading = "\nEager rebalancing hands every partition out again twice per restart (the member leaving, and coming back), and a bystander's gap is those two rebalances; cooperative rebalancing moves only the restarted member's partitions, away and back, and only they pause. A static member that comes back within its session timeout sets off no rebalance at all: its own partitions wait for it (the down time and its start), and none moves: the assignments counted are its own partitions handed back to it. " +
	"Under the consumer protocol the broker assigns, and a member's partitions move as under cooperative rebalancing: the leaving member's to the others, and a share of them back when it returns, each taken from its holder before it is handed on; no member stops the partitions it keeps. " +
	"A static member comes back to its own partitions there too: it leaves at epoch -2 naming its instance id (kafkaonce sends that leave itself, since franz-go's omits the id and Kafka refuses it), and the broker keeps its partitions for it until it returns. " +
	"A bystander's gap that no assignment explains is the machine: the restarted member catching up on two cores shared with the others and Postgres.\n"
