// Command ledger is a double-entry ledger fed by Kafka, run end to end with
// every way a message can arrive twice:
//
//	go run ./examples/ledger
//
// With no setup it uses an in-process Kafka broker and Postgres from
// DATABASE_URL, else a throwaway cluster from the local PostgreSQL binaries
// (or run it under kafkaonce dev). It migrates, produces transfers (with producer
// duplicates and later re-sends of the same ids), runs two workers in one
// consumer group, forces a rebalance mid-run (one worker leaves, another
// joins), then rewinds the group and replays the whole topic — with the
// stored positions removed, so every message must be recognised by its
// claim. Finally it checks the ledger: every transfer posted exactly once,
// debits equal credits, and each balance equals a recomputation from the
// transfers produced.
//
// Progress goes to stderr; the last line on stdout is a JSON summary. The
// exit code is 0 only when the invariants hold.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// Transfer moves Amount cents from one account to another.
type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

type summary struct {
	Postgres          string `json:"postgres"`
	Kafka             string `json:"kafka"`
	Produced          int    `json:"produced"`
	Unique            int    `json:"unique"`
	Applied           int64  `json:"applied"`
	DuplicatesSkipped int64  `json:"duplicates_skipped"`
	Rebalances        int    `json:"rebalances"`
	// TxRetried counts batch transactions that failed and ran again:
	// deadlocks between partitions updating the same balances, mostly.
	TxRetried         int64 `json:"transactions_retried"`
	Replayed          int64 `json:"replayed"`
	AppliedOnReplay   int64 `json:"applied_on_replay"`
	DoubleApplied     int64 `json:"double_applied"`
	Missing           int64 `json:"missing"`
	DebitsEqualCredit bool  `json:"debits_equal_credits"`
	BalancesMatch     bool  `json:"balances_match"`
	InvariantsOK      bool  `json:"invariants_ok"`
}

const schemaName = "ledger_example"

func main() {
	transfers := flag.Int("transfers", 5000, "unique transfers to produce")
	accounts := flag.Int("accounts", 50, "accounts")
	partitions := flag.Int("partitions", 4, "partitions of the transfers topic")
	dupEvery := flag.Int("duplicate-every", 10, "send every Nth transfer twice in a row (a retrying producer)")
	resendEvery := flag.Int("resend-every", 25, "re-send every Nth transfer again after the first pass (a producer replaying its log)")
	applyEnv := devenv.RegisterFlags(flag.CommandLine)
	flag.Parse()
	applyEnv()
	log.SetFlags(0)
	log.SetPrefix("[ledger] ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, *transfers, *accounts, *partitions, *dupEvery, *resendEvery)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if !s.InvariantsOK {
		os.Exit(1)
	}
}

func run(ctx context.Context, nTransfers, nAccounts, partitions, dupEvery, resendEvery int) (summary, error) {
	var s summary
	env, err := devenv.Start(ctx)
	if err != nil {
		return s, err
	}
	defer env.Close()
	env.Own(schemaName) // dropped when the example ends, unless -keep
	log.Print(env)
	pool := env.Pool
	s.Postgres, s.Kafka = env.PostgresSource, env.KafkaSource
	if err := setUpSchema(ctx, pool, nAccounts); err != nil {
		return s, err
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "transfers-" + runID
	if err := env.CreateTopic(ctx, topic, partitions); err != nil {
		return s, err
	}

	// The transfer log: what the ledger must end up reflecting.
	rng := rand.New(rand.NewPCG(1, 2))
	log1 := make([]Transfer, nTransfers)
	for i := range log1 {
		from := rng.IntN(nAccounts)
		to := (from + 1 + rng.IntN(nAccounts-1)) % nAccounts
		log1[i] = Transfer{ID: fmt.Sprintf("tr-%s-%06d", runID, i), From: acct(from), To: acct(to), Amount: 1 + rng.Int64N(10000)}
	}
	w := &kafka.Writer{Addr: kafka.TCP(env.Brokers...), Topic: topic, Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll, Transport: &kafka.Transport{}}
	defer w.Close()
	var first []kafka.Message
	for i, t := range log1 {
		first = append(first, message(t))
		if dupEvery > 0 && i%dupEvery == 0 {
			first = append(first, message(t)) // the producer retried after a timeout
		}
	}
	if err := w.WriteMessages(ctx, first...); err != nil {
		return s, err
	}
	s.Produced, s.Unique = len(first), nTransfers
	log.Printf("produced %d messages for %d transfers on %s (%d partitions)", len(first), nTransfers, topic, partitions)

	counts := &counter{}
	cfg := consumer.Config{
		Name:      "ledger",
		GroupID:   "ledger-" + runID,
		Brokers:   env.Brokers,
		Topics:    []string{topic},
		Schema:    schemaName,
		MessageID: consumer.IDFromJSONField("id"),
		Handler:   consumer.HandlerFunc(post),
		Hooks:     []consumer.Hook{counts},
		// Deadlocks between partitions that update the same balances are
		// retried by kafkaonce (they do not count as attempts); they are
		// counted in the summary rather than logged one by one.
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
	}

	// Two workers in one group; a rebalance halfway through.
	w1, w2 := start(ctx, pool, cfg), start(ctx, pool, cfg)
	progress := startProgress(counts, int64(nTransfers))
	defer progress.stop()
	waitUntil(ctx, func() bool { return counts.applied.Load() >= int64(nTransfers)/2 })
	progress.phase("rebalance: worker 2 leaves, worker 3 joins")
	if err := w2.stop(); err != nil {
		return s, err
	}
	w3 := start(ctx, pool, cfg)
	s.Rebalances = 2

	// The producer re-sends part of its log later, with the same ids.
	var again []kafka.Message
	for i, t := range log1 {
		if resendEvery > 0 && i%resendEvery == 0 {
			again = append(again, message(t))
		}
	}
	if err := w.WriteMessages(ctx, again...); err != nil {
		return s, err
	}
	s.Produced += len(again)
	progress.phase("re-sent " + strconv.Itoa(len(again)) + " transfers")
	total := int64(s.Produced)
	waitUntil(ctx, func() bool { return counts.applied.Load()+counts.skipped.Load() >= total })
	if err := errors.Join(w1.stop(), w3.stop()); err != nil {
		return s, err
	}
	s.Applied, s.DuplicatesSkipped, s.TxRetried = counts.applied.Load(), counts.skipped.Load(), counts.retried.Load()

	// Replay the whole topic: rewind the group, and drop the stored
	// positions so every message meets its claim.
	progress.phase("replay from the earliest offset")
	if err := env.Rewind(ctx, cfg.GroupID, topic); err != nil {
		return s, err
	}
	positions, err := offsets.NewStore(schemaName)
	if err != nil {
		return s, err
	}
	if _, err := positions.Forget(ctx, pool, cfg.Name, topic); err != nil {
		return s, err
	}
	appliedBefore, skippedBefore := counts.applied.Load(), counts.skipped.Load()
	r1, r2 := start(ctx, pool, cfg), start(ctx, pool, cfg)
	waitUntil(ctx, func() bool { return counts.skipped.Load()-skippedBefore+counts.applied.Load()-appliedBefore >= total })
	if err := errors.Join(r1.stop(), r2.stop()); err != nil {
		return s, err
	}
	progress.stop()
	s.Replayed = counts.skipped.Load() - skippedBefore + counts.applied.Load() - appliedBefore
	s.AppliedOnReplay = counts.applied.Load() - appliedBefore

	return check(ctx, pool, s, log1, nAccounts)
}

func acct(i int) string { return fmt.Sprintf("acct-%03d", i) }

func message(t Transfer) kafka.Message {
	v, _ := json.Marshal(t)
	return kafka.Message{Key: []byte(t.From), Value: v}
}

const initialBalance = 1_000_000

func setUpSchema(ctx context.Context, pool *pgxpool.Pool, nAccounts int) error {
	// The example owns this schema and starts it afresh on every run.
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schemaName+` CASCADE`); err != nil {
		return err
	}
	if _, err := consumer.Migrate(ctx, pool, schemaName); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `
CREATE TABLE ledger_example.accounts (id text PRIMARY KEY, balance bigint NOT NULL);
-- No unique key on postings: only kafkaonce stands between a redelivery and
-- a second posting.
CREATE TABLE ledger_example.postings (transfer_id text NOT NULL, account_id text NOT NULL, amount bigint NOT NULL);
INSERT INTO ledger_example.accounts SELECT 'acct-' || lpad(i::text, 3, '0'), `+strconv.Itoa(initialBalance)+` FROM generate_series(0, `+strconv.Itoa(nAccounts-1)+`) i;`)
	return err
}

// post is the handler: one debit and one credit, balances updated in the
// same transaction as kafkaonce's claim.
func post(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var t Transfer
	if err := json.Unmarshal(m.Value, &t); err != nil {
		return consumer.Permanent(err)
	}
	if t.Amount <= 0 || t.From == t.To {
		return consumer.Permanent(fmt.Errorf("transfer %s: invalid", t.ID))
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO ledger_example.postings VALUES ($1, $2, $3), ($1, $4, $5)`, t.ID, t.From, -t.Amount, t.To, t.Amount)
	// Lock accounts in a fixed order, so two transfers between the same
	// accounts in opposite directions cannot deadlock.
	first, second := t.From, t.To
	d1, d2 := -t.Amount, t.Amount
	if second < first {
		first, second, d1, d2 = second, first, d2, d1
	}
	b.Queue(`UPDATE ledger_example.accounts SET balance = balance + $2 WHERE id = $1`, first, d1)
	b.Queue(`UPDATE ledger_example.accounts SET balance = balance + $2 WHERE id = $1`, second, d2)
	return tx.SendBatch(ctx, b).Close()
}

// check verifies the ledger against the transfer log.
func check(ctx context.Context, pool *pgxpool.Pool, s summary, transfers []Transfer, nAccounts int) (summary, error) {
	var postings int64
	var sum int64
	err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM ledger_example.postings`).Scan(&postings, &sum)
	if err != nil {
		return s, err
	}
	var posted int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT transfer_id FROM ledger_example.postings GROUP BY 1 HAVING count(*) = 2) x`).Scan(&posted); err != nil {
		return s, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT transfer_id FROM ledger_example.postings GROUP BY 1 HAVING count(*) > 2) x`).Scan(&s.DoubleApplied); err != nil {
		return s, err
	}
	s.Missing = int64(len(transfers)) - posted - s.DoubleApplied
	s.DebitsEqualCredit = sum == 0

	want := map[string]int64{}
	for i := range nAccounts {
		want[acct(i)] = initialBalance
	}
	for _, t := range transfers {
		want[t.From] -= t.Amount
		want[t.To] += t.Amount
	}
	rows, err := pool.Query(ctx, `SELECT id, balance FROM ledger_example.accounts`)
	if err != nil {
		return s, err
	}
	got := map[string]int64{}
	var id string
	var bal int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &bal}, func() error { got[id] = bal; return nil }); err != nil {
		return s, err
	}
	s.BalancesMatch = len(got) == len(want)
	for k, v := range want {
		if got[k] != v {
			s.BalancesMatch = false
			log.Printf("balance of %s is %d, the transfer log says %d", k, got[k], v)
		}
	}
	s.InvariantsOK = s.DoubleApplied == 0 && s.Missing == 0 && s.DebitsEqualCredit && s.BalancesMatch && s.AppliedOnReplay == 0
	log.Printf("postings %d for %d transfers; sum of postings %d; double-applied %d; missing %d; balances match: %v",
		postings, len(transfers), sum, s.DoubleApplied, s.Missing, s.BalancesMatch)
	return s, nil
}

// worker is a consumer running in the background.
type worker struct {
	cancel context.CancelFunc
	done   chan error
}

func start(ctx context.Context, pool *pgxpool.Pool, cfg consumer.Config) *worker {
	c, err := consumer.New(pool, &cfg)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &worker{cancel: cancel, done: make(chan error, 1)}
	go func() { w.done <- c.Run(ctx) }()
	return w
}

func (w *worker) stop() error {
	w.cancel()
	return <-w.done
}

func waitUntil(ctx context.Context, cond func() bool) {
	deadline := time.Now().Add(5 * time.Minute)
	for !cond() && ctx.Err() == nil {
		if time.Now().After(deadline) {
			log.Fatal("timed out; is the consumer stuck? run with a smaller -transfers, or look at the warnings above")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counter is a hook counting applied and skipped messages, and failed
// transactions.
type counter struct{ applied, skipped, retried atomic.Int64 }

func (c *counter) OnBatchEnd(_ context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err != nil {
		c.retried.Add(1)
	}
}

func (c *counter) OnMessageApplied(context.Context, *consumer.Message) { c.applied.Add(1) }
func (c *counter) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.skipped.Add(1)
}

// progress prints a line a second while the example runs.
type progressPrinter struct {
	stopCh chan struct{}
	once   atomic.Bool
	label  atomic.Value
}

func startProgress(c *counter, unique int64) *progressPrinter {
	p := &progressPrinter{stopCh: make(chan struct{})}
	p.label.Store("two workers consuming")
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stopCh:
				return
			case <-t.C:
				log.Printf("%-45s applied %d/%d transfers, %d duplicates skipped", p.label.Load(), c.applied.Load(), unique, c.skipped.Load())
			}
		}
	}()
	return p
}

func (p *progressPrinter) phase(s string) {
	p.label.Store(s)
	log.Print(s)
}

func (p *progressPrinter) stop() {
	if p.once.CompareAndSwap(false, true) {
		close(p.stopCh)
	}
}
