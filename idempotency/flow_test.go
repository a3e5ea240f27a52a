package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// provider is a card provider on loopback that honours its own
// idempotency key: a charge repeated with the same key answers the first
// charge, and is not made again.
type provider struct {
	srv     *httptest.Server
	mu      sync.Mutex
	charges map[string]string // idempotency key -> charge id
	calls   atomic.Int64
	fail    atomic.Int64 // the next calls answered 503
}

func newProvider(t *testing.T) *provider {
	p := &provider{charges: map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.calls.Add(1)
		if p.fail.Add(-1) >= 0 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		p.mu.Lock()
		id, ok := p.charges[key]
		if !ok {
			id = fmt.Sprintf("ch_%d", len(p.charges)+1)
			p.charges[key] = id
		}
		p.mu.Unlock()
		_, _ = io.WriteString(w, id)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// madeCharges counts the charges made, however often they were asked for.
func (p *provider) madeCharges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charges)
}

// charge asks for one charge with key.
func (p *provider) charge(ctx context.Context, key string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+"/charges", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("provider: %s", resp.Status)
	}
	return string(b), nil
}

// phasedPayments is a payments API whose payments are charged at the
// provider: Start records the payment as pending, "charge" calls the
// provider, "record" marks the payment charged and answers 201.
type phasedPayments struct {
	db       *testenv.DB
	provider *provider
	table    string
	starts   atomic.Int64
	// afterCharge, when set, runs after the provider answered and before
	// the phase returns: a test stops the server there.
	afterCharge func()
}

func newPhasedPayments(t *testing.T) *phasedPayments {
	db := testenv.NewDB(t)
	pp := &phasedPayments{db: db, provider: newProvider(t), table: db.Table("payments")}
	db.Exec(t, `CREATE TABLE `+pp.table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL, state text NOT NULL, charge text)`)
	return pp
}

// flow is the payment flow, with lease.
func (pp *phasedPayments) flow(lease time.Duration) idempotency.Flow {
	return idempotency.Flow{
		Name:  "payments",
		Lease: lease,
		Start: func(r *http.Request, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
			pp.starts.Add(1)
			var req struct {
				Amount int64 `json:"amount"`
			}
			if err := json.Unmarshal(run.Body, &req); err != nil || req.Amount <= 0 {
				return idempotency.Respond(http.StatusBadRequest, nil, []byte(`{"error":"bad payment"}`)), nil
			}
			var id int64
			err := tx.QueryRow(r.Context(), `INSERT INTO `+pp.table+` (amount, state) VALUES ($1, 'pending') RETURNING id`, req.Amount).Scan(&id)
			return idempotency.Continue("charge", []byte(fmt.Sprint(id))), err
		},
		Phases: []idempotency.Phase{
			{From: "charge", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				charge, err := pp.provider.charge(ctx, run.DerivedKey("charge"))
				if err != nil {
					return idempotency.Step{}, err
				}
				if pp.afterCharge != nil {
					pp.afterCharge()
				}
				return idempotency.Continue("record", []byte(string(run.State)+" "+charge)), nil
			}},
			{From: "record", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				id, charge, _ := strings.Cut(string(run.State), " ")
				if _, err := tx.Exec(ctx, `UPDATE `+pp.table+` SET state = 'charged', charge = $2 WHERE id = $1`, id, charge); err != nil {
					return idempotency.Step{}, err
				}
				body := fmt.Sprintf(`{"id":%s,"charge":%q,"at":%q}`, id, charge, time.Now().Format(time.RFC3339Nano))
				return idempotency.Respond(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, []byte(body)), nil
			}},
		},
	}
}

// serve starts a server of the flow on pool: one process of the API.
func (pp *phasedPayments) serve(t *testing.T, pool *pgxpool.Pool, f idempotency.Flow) (*idempotency.Phased, string) {
	s, err := idempotency.New(pool, &idempotency.Config{Schema: pp.db.Schema,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }})
	require.NoError(t, err)
	ph, err := s.Phased(f)
	require.NoError(t, err)
	srv := httptest.NewServer(ph)
	t.Cleanup(srv.Close)
	return ph, srv.URL + "/v1/payments"
}

// payments lists the payments as "state charge" strings.
func (pp *phasedPayments) payments(t *testing.T) []string {
	rows, err := pp.db.Pool.Query(context.Background(), `SELECT state || ' ' || coalesce(charge, '-') FROM `+pp.table+` ORDER BY id`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

func TestAPhasedRequestChargesOnceAndIsReplayed(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))

	resp, first, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, first)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))

	resp, again, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, first, again, "the replay is byte for byte the first response")

	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":6}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, body)

	resp, body, err = postTo(t, http.DefaultClient, url, "", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "a phased request needs a key: %s", body)

	resp, body, err = postTo(t, http.DefaultClient, url, "k-bad", `{"amount":-1}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "Start refused it")
	resp, again, err = postTo(t, http.DefaultClient, url, "k-bad", `{"amount":-1}`)
	require.NoError(t, err)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), "a refusal is stored too")
	require.Equal(t, body, again)

	require.Equal(t, 1, pp.provider.madeCharges())
	require.EqualValues(t, 1, pp.provider.calls.Load())
	require.EqualValues(t, 2, pp.starts.Load(), "k-1 and k-bad started once each")
}

// A server stops for good between the provider's charge and the recovery
// point after it (a kill -9, a machine lost): its client times out, and
// its retry, sent to another server once the lease ran out, resumes the
// run from "charge". The provider is asked again with the same derived
// key and charges nothing new; the payment is created once. When the
// stopped server comes back to life, its lease is gone and it changes
// nothing.
func TestACrashBetweenPhasesResumesFromTheRecoveryPointWithOneCharge(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	const lease = time.Second
	frozen, thaw := make(chan struct{}), make(chan struct{})
	crashing := pp.flow(lease)
	charge := crashing.Phases[0].External
	crashing.Phases[0].External = func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
		step, err := charge(ctx, run)
		close(frozen)
		<-thaw // the process is stopped: not even its context wakes it
		return step, err
	}
	_, deadURL := pp.serve(t, pp.db.Pool, crashing)
	_, liveURL := pp.serve(t, pp.db.PoolVia(t, pp.db.ServerAddr(t)), pp.flow(lease))

	zombie := make(chan answer, 1)
	go func() {
		resp, body, err := postTo(t, http.DefaultClient, deadURL, "k-1", `{"amount":5}`)
		if err != nil {
			zombie <- answer{0, err.Error()}
			return
		}
		zombie <- answer{resp.StatusCode, body}
	}()
	<-frozen
	require.Equal(t, 1, pp.provider.madeCharges(), "charged before the crash")
	require.Equal(t, []string{"pending -"}, pp.payments(t))

	resp, body, err := postTo(t, http.DefaultClient, liveURL, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode, "during the lease the run is its server's: %s", body)
	after, convErr := time.ParseDuration(resp.Header.Get("Retry-After") + "s")
	require.NoError(t, convErr)
	require.GreaterOrEqual(t, after, time.Second)

	time.Sleep(lease)
	resp, first, err := postTo(t, http.DefaultClient, liveURL, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, first)
	require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader), "the response's first delivery")
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.Equal(t, 1, pp.provider.madeCharges(), "one charge")
	require.EqualValues(t, 2, pp.provider.calls.Load(), "asked again, with the same key")
	require.EqualValues(t, 1, pp.starts.Load(), "resumed, not started over")

	close(thaw)
	z := <-zombie
	require.Equal(t, http.StatusConflict, z.status, "the stopped server lost its lease: %s", z.body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))

	resp, again, err := postTo(t, http.DefaultClient, liveURL, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.Equal(t, first, again)

	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	counts, err := store.Count(context.Background(), pp.db.Pool)
	require.NoError(t, err)
	require.Equal(t, idempotency.Counts{Total: 1}, counts)
}

// A server dies after Start committed; its client never retries. The
// recovery sweep finds the run once its lease ran out and completes it,
// and a late retry gets the response the sweep stored.
func TestTheRecoverySweepCompletesARunWhoseClientGaveUp(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	const lease = time.Second
	frozen, thaw := make(chan struct{}), make(chan struct{})
	crashing := pp.flow(lease)
	crashing.Phases[0].External = func(context.Context, *idempotency.Run) (idempotency.Step, error) {
		close(frozen)
		<-thaw
		return idempotency.Step{}, context.Canceled
	}
	_, deadURL := pp.serve(t, pp.db.Pool, crashing)
	live, liveURL := pp.serve(t, pp.db.PoolVia(t, pp.db.ServerAddr(t)), pp.flow(lease))

	gaveUp := &http.Client{Timeout: 200 * time.Millisecond}
	go func() { _, _, _ = postTo(t, gaveUp, deadURL, "k-1", `{"amount":5}`) }()
	<-frozen
	ctx := testenv.Context(t, 30*time.Second)
	n, err := live.Recover(ctx, 10)
	require.NoError(t, err)
	require.Zero(t, n, "the lease still runs")

	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	k, err := store.Get(ctx, pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.NotNil(t, k.Run)
	require.Equal(t, "charge", k.Run.RecoveryPoint)
	require.Equal(t, 1, k.Phased.Taken)

	time.Sleep(lease)
	counts, err := store.Count(ctx, pp.db.Pool)
	require.NoError(t, err)
	require.Equal(t, idempotency.Counts{Total: 1, Running: 1, Stalled: 1}, counts)
	n, err = live.Recover(ctx, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.Equal(t, 1, pp.provider.madeCharges())

	resp, body, err := postTo(t, http.DefaultClient, liveURL, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	close(thaw)
}

// A phase that fails (the provider answers 503) leaves the run at its
// recovery point with its lease released: the client's retry, at once,
// resumes it, without running Start again.
func TestAFailedPhaseIsResumedByTheRetryAtOnce(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	pp.provider.fail.Store(1)

	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	require.Equal(t, []string{"pending -"}, pp.payments(t))

	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	k, err := store.Get(context.Background(), pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.NotNil(t, k.Run)
	require.Contains(t, k.Phased.LastError, "503")
	require.False(t, k.Run.LeaseUntil.After(time.Now()), "released")

	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.EqualValues(t, 1, pp.starts.Load())
	k, err = store.Get(context.Background(), pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.Nil(t, k.Run)
	require.Equal(t, http.StatusCreated, k.Status)
}

// An Atomic phase whose transaction is refused at COMMIT, by a constraint
// of its tables deferred there, failed (500), like a phase that returned
// the error: the run stays at its recovery point with the error in its
// history and its lease released, and the retry resumes it there, with no
// second charge.
func TestAnAtomicPhaseRefusedAtCommitFailsAndIsResumed(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	pp.db.Exec(t, `ALTER TABLE `+pp.table+` ADD CONSTRAINT one_per_charge UNIQUE (charge) DEFERRABLE INITIALLY DEFERRED`)
	pp.db.Exec(t, `INSERT INTO `+pp.table+` (amount, state, charge) VALUES (1, 'imported', 'ch_1')`)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))

	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	require.Contains(t, body, "failed part way")
	require.Equal(t, []string{"imported ch_1", "pending -"}, pp.payments(t))
	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	k, err := store.Get(context.Background(), pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.NotNil(t, k.Run)
	require.Equal(t, "record", k.Run.RecoveryPoint)
	require.Contains(t, k.Phased.LastError, "refused at COMMIT")
	require.Contains(t, k.Phased.LastError, "23505")
	require.False(t, k.Run.LeaseUntil.After(time.Now()), "released")

	pp.db.Exec(t, `DELETE FROM `+pp.table+` WHERE state = 'imported'`)
	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.Equal(t, 1, pp.provider.madeCharges())
}

// Fifty identical requests at once: one run, one charge; every other one
// is told to retry (409) or gets the stored response.
func TestFiftyIdenticalPhasedRequestsChargeOnce(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	const n = 50
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
			if err != nil {
				statuses <- 0
				return
			}
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s)
	}
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.Equal(t, 1, pp.provider.madeCharges())
	require.EqualValues(t, 1, pp.provider.calls.Load())
	require.EqualValues(t, 1, pp.starts.Load())
}

// A run in progress is never pruned, however old: its recovery point is
// all that says the provider may have charged.
func TestARunInProgressIsNeverPruned(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	pp.provider.fail.Store(1)
	resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	pp.db.Exec(t, `UPDATE `+pp.db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 day'`)
	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	n, err := store.Prune(context.Background(), pp.db.Pool, 100)
	require.NoError(t, err)
	require.Zero(t, n)

	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t), "resumed, not started afresh")
}

// A plain handler on the same schema sees a phased run's key as in
// progress, or as another request's.
func TestAPlainHandlerRespectsARunInProgress(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	pp.provider.fail.Store(1)
	resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)

	s, err := idempotency.New(pp.db.Pool, &idempotency.Config{Schema: pp.db.Schema,
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }})
	require.NoError(t, err)
	var calls atomic.Int64
	plain := httptest.NewServer(s.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		calls.Add(1)
		return nil
	}))
	t.Cleanup(plain.Close)
	resp, body, err := postTo(t, http.DefaultClient, plain.URL+"/v1/payments", "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	resp, body, err = postTo(t, http.DefaultClient, plain.URL+"/v1/refunds", "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode, body)
	require.Zero(t, calls.Load())
}

// A response a phase gives that the storing rule does not keep is sent,
// and leaves the run where it was, for the retry.
func TestAnUnstoredResponseOfAPhaseLeavesTheRunToResume(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	f := pp.flow(time.Minute)
	record := f.Phases[1].Atomic
	var once atomic.Bool
	f.Phases[1].Atomic = func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
		if once.CompareAndSwap(false, true) {
			_, err := tx.Exec(ctx, `UPDATE `+pp.table+` SET state = 'rolled back'`)
			return idempotency.Respond(http.StatusServiceUnavailable, nil, []byte("busy")), err
		}
		return record(ctx, tx, run)
	}
	_, url := pp.serve(t, pp.db.Pool, f)
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "busy", body)
	require.Equal(t, []string{"pending -"}, pp.payments(t), "the phase's writes rolled back")

	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.EqualValues(t, 1, pp.provider.calls.Load(), "the charge's recovery point held")
}

func TestPhasedRejectsBadFlowsNamingTheField(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	step := func(context.Context, *idempotency.Run) (idempotency.Step, error) { return idempotency.Step{}, nil }
	_, err = s.Phased(idempotency.Flow{Name: "a b", Lease: time.Millisecond, MaxTakes: -1, SweepBackoff: -time.Second,
		Phases: []idempotency.Phase{{From: "x"}, {From: "x", External: step}, {External: step}}})
	require.Error(t, err)
	for _, want := range []string{"Flow.Name", "Flow.Lease", "Flow.Start", "Phases[0] (From \"x\") must set exactly one",
		"Phases[1]: two phases continue from \"x\"", "Phases[2].From", "Flow.MaxTakes must be at least 1 (got -1)",
		"Flow.SweepBackoff must be positive (got -1s)"} {
		require.ErrorContains(t, err, want)
	}
}

// A phase that continues to a point no phase starts from fails, naming it,
// and the run stays where it was.
func TestAContinueToAnUnknownPointFails(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	f := pp.flow(time.Minute)
	f.Phases[0].External = func(context.Context, *idempotency.Run) (idempotency.Step, error) {
		return idempotency.Continue("refund", nil), nil
	}
	_, url := pp.serve(t, pp.db.Pool, f)
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	k, err := store.Get(context.Background(), pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.Equal(t, "charge", k.Run.RecoveryPoint)
	require.Contains(t, k.Phased.LastError, `Continue("refund"): no phase of flow "payments" continues from it`)
}
