// Command payments runs the whole flow of an idempotent payment, from the
// HTTP request to the ledger posting, under faults:
//
//	go run ./examples/payments
//
// With no setup it uses an in-process Kafka broker and Postgres from
// DATABASE_URL, else a throwaway cluster from the local PostgreSQL
// binaries.
//
//   - A payments API (a process of its own) serves POST /v1/payments with
//     an Idempotency-Key, as a phased request of package idempotency: the
//     payment is recorded as pending, charged at a card provider under a
//     provider key derived from ours, then marked charged with its event in
//     the outbox and the response stored, in one transaction.
//   - The card provider is fake, and behaves like a real one: it honours its
//     own idempotency key, fails now and then, and sometimes charges but
//     answers too late.
//   - Clients send payments through idempotency.Transport with a timeout
//     shorter than the server's slowest work (successes they never hear
//     of), some twice at once, and some keys again for another amount.
//   - The API process is killed with SIGKILL twice in the middle of
//     requests and started again; runs it left half way are resumed by
//     the clients' retries or by its recovery sweep.
//   - Its outbox relay publishes the payment events to Kafka, and a
//     kafkaonce consumer posts them to a ledger.
//
// Progress goes to stderr; the last line on stdout is a JSON summary. The
// exit code is 0 only when every payment was created once, charged once at
// the provider and posted once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/idempotency"
)

const schemaName = "payments_example"

// apiEnv carries the API process's configuration, as JSON: set, this
// program is the API.
const apiEnv = "PAYMENTS_EXAMPLE_API"

type summary struct {
	Postgres   string `json:"postgres"`
	Kafka      string `json:"kafka"`
	Operations int    `json:"operations"`
	// Requests counts the HTTP requests the clients sent; ClientRetries
	// those beyond one per operation and duplicate.
	Requests      int64 `json:"requests"`
	ClientRetries int64 `json:"client_retries"`
	Replayed      int64 `json:"replayed"`
	Conflicts409  int64 `json:"conflicts_409"`
	Mismatches422 int64 `json:"mismatches_422"`
	ServerKills   int   `json:"server_kills"`
	// RunsResumed counts payments whose run a retry or the recovery sweep
	// took over after its server died or its phase failed.
	RunsResumed     int64 `json:"runs_resumed"`
	PaymentsCreated int64 `json:"payments_created"`
	ProviderCalls   int   `json:"provider_calls"`
	ProviderCharges int   `json:"provider_charges"`
	LedgerPostings  int64 `json:"ledger_postings"`
	CreatedTwice    int64 `json:"created_twice"`
	DoubleCharged   int   `json:"double_charged"`
	PostedTwice     int64 `json:"posted_twice"`
	InvariantsOK    bool  `json:"invariants_ok"`
}

func main() {
	log.SetFlags(0)
	if raw := os.Getenv(apiEnv); raw != "" {
		var cfg apiConfig
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			log.Fatalf("%s: %v", apiEnv, err)
		}
		if err := serveAPI(cfg); err != nil {
			log.Fatal(err)
		}
		return
	}
	n := flag.Int("payments", 300, "payments to make")
	workers := flag.Int("clients", 8, "clients making payments at once")
	kills := flag.Int("kills", 2, "times the API process is killed with SIGKILL mid-run")
	lease := flag.Duration("lease", 2*time.Second, "the payment flow's lease: how long a dead server's runs wait to be resumed")
	applyEnv := devenv.RegisterFlags(flag.CommandLine)
	flag.Parse()
	applyEnv()
	log.SetPrefix("[payments] ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, *n, *workers, *kills, *lease)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if !s.InvariantsOK {
		os.Exit(1)
	}
}

func run(ctx context.Context, n, workers, kills int, lease time.Duration) (summary, error) {
	s := summary{Operations: n}
	env, err := devenv.Start(ctx)
	if err != nil {
		return s, err
	}
	defer env.Close()
	env.Own(schemaName) // dropped when the example ends, unless -keep
	log.Print(env)
	pool := env.Pool
	s.Postgres, s.Kafka = env.PostgresSource, env.KafkaSource
	if err := setUpSchema(ctx, pool); err != nil {
		return s, err
	}
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "payments-" + runID
	if err := env.CreateTopic(ctx, topic, 4); err != nil {
		return s, err
	}
	card := startProvider(0.08, 0.08)
	defer card.close()
	addr, err := freeAddr()
	if err != nil {
		return s, err
	}
	api := &apiProcess{cfg: apiConfig{Addr: addr, DatabaseURL: env.DatabaseURL, Brokers: env.Brokers, Topic: topic,
		ProviderURL: card.srv.URL, Lease: lease.String()}}
	if err := api.start(ctx); err != nil {
		return s, err
	}
	defer api.stop()

	// The ledger: a kafkaonce consumer posting every payment event.
	ledger, err := consumer.New(pool, &consumer.Config{
		Name:    "ledger",
		GroupID: "ledger-" + runID,
		Brokers: env.Brokers,
		Topics:  []string{topic},
		Schema:  schemaName,
		Handler: consumer.HandlerFunc(post),
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return s, err
	}
	ledgerCtx, cancelLedger := context.WithCancel(ctx)
	ledgerDone := make(chan error, 1)
	go func() { ledgerDone <- ledger.Run(ledgerCtx) }()
	stopLedger := sync.OnceValue(func() error { cancelLedger(); return <-ledgerDone })
	defer stopLedger()

	// The clients, and the kills meanwhile.
	ops := operations(n, runID)
	cl := newClients("http://"+addr, 150*time.Millisecond)
	clientsDone := make(chan struct{})
	go func() { defer close(clientsDone); cl.run(ctx, ops, workers) }()
	for k := 1; k <= kills; k++ {
		at := int64(n * k / (kills + 1))
		if !waitFor(ctx, clientsDone, func() bool { return cl.stats.done.Load() >= at }) {
			break
		}
		log.Printf("%d of %d payments made: killing the API with SIGKILL", cl.stats.done.Load(), n)
		if err := api.kill(); err != nil {
			return s, err
		}
		s.ServerKills++
		time.Sleep(300 * time.Millisecond)
		if err := api.start(ctx); err != nil {
			return s, err
		}
	}
	<-clientsDone
	if ctx.Err() != nil {
		return s, ctx.Err()
	}
	log.Printf("all %d payments answered 201; waiting for the ledger", n)
	deadline := time.Now().Add(time.Minute)
	for {
		var charged, posted int64
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+schemaName+`.payments WHERE state = 'charged'),
			(SELECT count(DISTINCT payment_id) FROM `+schemaName+`.postings)`).Scan(&charged, &posted)
		if err != nil {
			return s, err
		}
		if posted >= charged || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := stopLedger(); err != nil && !errors.Is(err, context.Canceled) {
		return s, err
	}
	return check(ctx, pool, s, cl.stats, card)
}

func setUpSchema(ctx context.Context, pool *pgxpool.Pool) error {
	// The example owns this schema and starts it afresh on every run.
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schemaName+` CASCADE`); err != nil {
		return err
	}
	if _, err := consumer.Migrate(ctx, pool, schemaName); err != nil {
		return err
	}
	// No unique keys on (scope, idem_key) or on postings' payment_id: only
	// kafkaonce stands between a retry and a second payment or posting.
	_, err := pool.Exec(ctx, `
CREATE TABLE `+schemaName+`.payments (id bigserial PRIMARY KEY, scope text NOT NULL, idem_key text NOT NULL,
	account text NOT NULL, amount bigint NOT NULL, state text NOT NULL, charge text);
CREATE TABLE `+schemaName+`.postings (payment_id bigint NOT NULL, account text NOT NULL, amount bigint NOT NULL, charge text NOT NULL);`)
	return err
}

// post is the ledger's handler: one posting per payment event, in the
// transaction of kafkaonce's claim.
func post(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	var p Payment
	if err := json.Unmarshal(m.Value, &p); err != nil {
		return consumer.Permanent(err)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+schemaName+`.postings (payment_id, account, amount, charge) VALUES ($1, $2, $3, $4)`,
		p.ID, p.Account, p.Amount, p.Charge)
	return err
}

// check counts what happened and whether every payment was created once,
// charged once and posted once.
func check(ctx context.Context, pool *pgxpool.Pool, s summary, stats *clientStats, card *provider) (summary, error) {
	var pending int64
	err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM `+schemaName+`.payments),
			(SELECT count(*) FROM `+schemaName+`.payments WHERE state <> 'charged'),
			(SELECT count(*) FROM (SELECT 1 FROM `+schemaName+`.payments GROUP BY scope, idem_key HAVING count(*) > 1) x),
			(SELECT count(*) FROM `+schemaName+`.postings),
			(SELECT count(*) FROM (SELECT 1 FROM `+schemaName+`.postings GROUP BY payment_id HAVING count(*) > 1) x),
			(SELECT count(*) FROM `+schemaName+`.idempotency_keys WHERE taken > 1)`).
		Scan(&s.PaymentsCreated, &pending, &s.CreatedTwice, &s.LedgerPostings, &s.PostedTwice, &s.RunsResumed)
	if err != nil {
		return s, err
	}
	keys, err := idempotency.NewStore(schemaName)
	if err != nil {
		return s, err
	}
	counts, err := keys.Count(ctx, pool)
	if err != nil {
		return s, err
	}
	s.ProviderCharges, s.ProviderCalls, s.DoubleCharged = card.tally()
	s.Requests, s.Replayed = stats.requests.Load(), stats.replayed.Load()
	s.Conflicts409, s.Mismatches422 = stats.conflicts.Load(), stats.mismatches.Load()

	stats.mu.Lock()
	defer stats.mu.Unlock()
	sent := stats.mismatchesSent.Load()
	for _, bodies := range stats.responses {
		sent += int64(len(bodies)) // at least one request per operation and duplicate
	}
	s.ClientRetries = s.Requests - sent
	inconsistent := 0
	for key, bodies := range stats.responses {
		if len(bodies) > 1 {
			inconsistent++
			log.Printf("%s got %d different 201 bodies", key, len(bodies))
		}
	}
	for _, f := range stats.failures {
		log.Print(f)
	}
	n := int64(s.Operations)
	s.InvariantsOK = len(stats.failures) == 0 && inconsistent == 0 && len(stats.responses) == s.Operations &&
		s.PaymentsCreated == n && s.CreatedTwice == 0 && pending == 0 && counts.Running == 0 &&
		int64(s.ProviderCharges) == n && s.DoubleCharged == 0 &&
		s.LedgerPostings == n && s.PostedTwice == 0 && s.Mismatches422 == stats.mismatchesSent.Load()
	log.Printf("payments %d (%d not charged, %d created twice), provider charges %d (%d payments charged twice), postings %d (%d posted twice), runs in progress %d",
		s.PaymentsCreated, pending, s.CreatedTwice, s.ProviderCharges, s.DoubleCharged, s.LedgerPostings, s.PostedTwice, counts.Running)
	return s, nil
}

// apiProcess is the payments API, a process of its own, so that it can be
// killed as a real one is.
type apiProcess struct {
	cfg apiConfig
	cmd *exec.Cmd
}

// start starts the API process and waits until it serves.
func (a *apiProcess) start(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	raw, _ := json.Marshal(a.cfg)
	a.cmd = exec.Command(exe)
	a.cmd.Env = append(os.Environ(), apiEnv+"="+string(raw))
	a.cmd.Stderr = os.Stderr
	if err := a.cmd.Start(); err != nil {
		return fmt.Errorf("start the API process: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + a.cfg.Addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the API process did not serve on %s within 30s: %v", a.cfg.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill kills the API process with SIGKILL: no deferred call, no shutdown,
// transactions and runs left where they were.
func (a *apiProcess) kill() error {
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	_ = a.cmd.Wait()
	return nil
}

// stop stops the API process gracefully.
func (a *apiProcess) stop() {
	if a.cmd == nil || a.cmd.ProcessState != nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	_ = a.cmd.Wait()
}

// freeAddr is a loopback address no one listens on, for the API: the same
// across its restarts.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitFor waits until cond holds, and says whether it did before done
// closed or ctx ended.
func waitFor(ctx context.Context, done <-chan struct{}, cond func() bool) bool {
	for !cond() {
		select {
		case <-done:
			return false
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
	return true
}
