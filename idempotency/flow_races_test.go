package idempotency_test

// Races of phased requests (Server.Phased, Flow, Recover) between
// servers, sweeps and retries: each test says which promise it checks and
// by what interleaving.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// servePhased serves f on pool with cfg (its Schema and Scope filled in).
func servePhased(t *testing.T, pool *pgxpool.Pool, schema string, cfg idempotency.Config, f idempotency.Flow) (*idempotency.Phased, string) {
	t.Helper()
	cfg.Schema = schema
	cfg.Scope = func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }
	s, err := idempotency.New(pool, &cfg)
	require.NoError(t, err)
	ph, err := s.Phased(f)
	require.NoError(t, err)
	srv := httptest.NewServer(ph)
	t.Cleanup(srv.Close)
	return ph, srv.URL + "/v1/things"
}

// counter counts calls per key.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) inc(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return c.n[key]
}

func retryAfter(t *testing.T, resp *http.Response) int {
	t.Helper()
	n, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", resp.Header.Get("Retry-After"))
	return n
}

// Covers promise 1 (an Atomic phase commits exactly once per
// run) and 2 (a run is resumed from its LAST committed recovery point).
//
// Interleaving: Recover lists the stalled runs in one query, then takes
// them over one after the other; it used to resume each from the point and
// state it listed, guarded only by "same token and lease ran out". Run k-2 is listed at recovery point "a"
// while its own server X is still in the Atomic phase "a" past its lease
// (holding the row lock; the listing is a plain SELECT and is not
// blocked). While the sweep is busy with k-1, X commits "a" -> "b" (same
// token, new lease), fails in "b" and releases its lease (lease_until =
// now, token unchanged). The sweep then reaches k-2: the token still
// matches and the lease ran out, so the takeover succeeds, and the sweep
// resumes k-2 from the stale point "a" with the stale state: the Atomic
// phase "a" commits its writes a second time.
//
// Phase "a" of k-2 must commit once (the sweep resumes from "b"); it
// committed twice.
func TestTheSweepResumesFromThePointItTakesOverNotTheOneItListed(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	effects := db.Table("effects")
	db.Exec(t, `CREATE TABLE `+effects+` (key text NOT NULL, phase text NOT NULL)`)
	const lease = time.Second
	var aCalls, bCalls counter
	inSweep, gate := make(chan struct{}, 1), make(chan struct{})
	f := idempotency.Flow{
		Name:  "races",
		Lease: lease,
		Start: func(r *http.Request, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
			return idempotency.Continue("a", []byte("from start")), nil
		},
		Phases: []idempotency.Phase{
			{From: "a", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				if _, err := tx.Exec(ctx, `INSERT INTO `+effects+` VALUES ($1, 'a')`, run.Key); err != nil {
					return idempotency.Step{}, err
				}
				if run.Key == "k-2" && aCalls.inc(run.Key) == 1 {
					time.Sleep(2 * lease) // X outlives its lease, holding the row's lock
				}
				return idempotency.Continue("b", []byte("from a")), nil
			}},
			{From: "b", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				n := bCalls.inc(run.Key)
				switch {
				case n == 1:
					return idempotency.Step{}, errors.New("provider down") // fails and releases the lease
				case run.Key == "k-1":
					inSweep <- struct{}{}
					<-gate // the sweep is busy with k-1
				}
				return idempotency.Respond(http.StatusCreated, nil, []byte("done "+run.Key)), nil
			}},
		},
	}
	ph, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, f)

	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body) // k-1 stalled at "b", released

	x := make(chan int, 1)
	go func() {
		resp, _, err := postTo(t, http.DefaultClient, url, "k-2", `{}`)
		if err != nil {
			x <- 0
			return
		}
		x <- resp.StatusCode
	}()
	time.Sleep(lease + 300*time.Millisecond) // k-2's lease ran out; X is still in "a"

	ctx := testenv.Context(t, 30*time.Second)
	swept := make(chan error, 1)
	go func() { _, err := ph.Recover(ctx, 10); swept <- err }()
	<-inSweep // the sweep listed k-1 and k-2, and is in k-1's phase "b"

	require.Equal(t, http.StatusInternalServerError, <-x, "X committed a->b, then failed in b")
	store, err := idempotency.NewStore(db.Schema)
	require.NoError(t, err)
	k, err := store.Get(ctx, db.Pool, "alice", "k-2")
	require.NoError(t, err)
	require.NotNil(t, k.Run)
	require.Equal(t, "b", k.Run.RecoveryPoint, "k-2's last recovery point is b")

	close(gate)
	require.NoError(t, <-swept)
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+effects+` WHERE key = 'k-2' AND phase = 'a'`),
		"the Atomic phase a of k-2 committed its writes more than once: the sweep resumed k-2 from the stale point it listed")
}

// Covers promise 3 (and Run.DerivedKey's doc: "the same on
// every attempt and every resume of the run, different for every other
// request").
//
// Interleaving: a key completes, its retention ends (Config.Retention:
// "after it the key is free again"), and a new request with the same key
// (here even another amount) runs afresh. DerivedKey hashed only scope,
// key and purpose, so the new run sent the provider the key of the old
// run's charge: a provider honouring its key (for longer than Retention,
// or the row was pruned early) answered the old charge, and the new
// payment was never charged. It now hashes the run's own id too.
func TestAKeyUsedAgainAfterItExpiredDerivesNewProviderKeys(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)

	pp.db.Exec(t, `UPDATE `+pp.db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 second'`)
	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":7}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the expired key is free again: a new request runs: %s", body)
	require.EqualValues(t, 2, pp.starts.Load())
	require.Equal(t, 2, pp.provider.madeCharges(),
		"the second payment reused the first one's derived key: the provider answered the old charge (payments %v)", pp.payments(t))
}

// Covers promise 4 (a retry during a live lease gets 409 with a
// Retry-After covering the lease).
//
// Interleaving: server X is in an Atomic phase past its lease, holding the
// row's lock. A retry reads the row (lease ran out) and tries to take the
// run over; its UPDATE waits for X's row lock. X commits its recovery
// point with a new lease (3s) and goes on into the next phase. The
// takeover changes nothing (lease live); the retry was answered with the
// row it read before waiting (Retry-After 1s, Config.RetryAfter), and is
// now answered with the row as it is after the wait (~3s).
func TestARetryThatFindsTheRunRenewedWaitsForTheNewLease(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	const lease = 3 * time.Second
	var aCalls atomic.Int64
	inB, gate := make(chan struct{}, 1), make(chan struct{})
	f := idempotency.Flow{
		Name:  "races",
		Lease: lease,
		Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
			return idempotency.Continue("a", nil), nil
		},
		Phases: []idempotency.Phase{
			{From: "a", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				if aCalls.Add(1) == 1 {
					time.Sleep(lease + 500*time.Millisecond)
				}
				return idempotency.Continue("b", nil), nil
			}},
			{From: "b", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				inB <- struct{}{}
				<-gate
				return idempotency.Respond(http.StatusCreated, nil, []byte("done")), nil
			}},
		},
	}
	_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, f)
	first := make(chan int, 1)
	go func() {
		resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{}`)
		if err != nil {
			first <- 0
			return
		}
		first <- resp.StatusCode
	}()
	time.Sleep(lease + 200*time.Millisecond) // X's lease ran out; X still in "a" for 300ms more
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{}`)
	require.NoError(t, err)
	<-inB // X committed "a" -> "b" with a fresh lease, and runs "b"
	store, err := idempotency.NewStore(db.Schema)
	require.NoError(t, err)
	k, err := store.Get(context.Background(), db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.NotNil(t, k.Run)
	left := time.Until(k.Run.LeaseUntil)
	require.Greater(t, left, 2*time.Second, "X's new lease is live")
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	got := retryAfter(t, resp)
	close(gate)
	require.Equal(t, http.StatusCreated, <-first)
	require.GreaterOrEqual(t, got, 2,
		"409 during a live lease (%v left) told the client to come back after %ds", left.Round(100*time.Millisecond), got)
}

// Covers promise 4 (409 with a Retry-After covering the lease),
// for the server that lost its lease.
//
// Interleaving: server X's External phase outlives its lease; a retry takes
// the run over (fresh lease of 3s) and is in the same phase. X's phase then
// returns; its step changes no row (outcome lost), and X answered its
// client 409 with Retry-After 1s (Config.RetryAfter), while the run was
// the other server's for ~3s more; it now reads what is left of that lease.
func TestAServerThatLostItsLeaseTellsItsClientToWaitForTheNewOne(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	const lease = 3 * time.Second
	var calls atomic.Int64
	thawX, inY, gateY := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
	f := idempotency.Flow{
		Name:  "races",
		Lease: lease,
		Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
			return idempotency.Continue("charge", nil), nil
		},
		Phases: []idempotency.Phase{
			{From: "charge", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				if calls.Add(1) == 1 {
					<-thawX // ignores its context: a stopped process
				} else {
					inY <- struct{}{}
					<-gateY
				}
				return idempotency.Respond(http.StatusCreated, nil, []byte("done")), nil
			}},
		},
	}
	_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, f)
	type ans struct {
		resp *http.Response
		err  error
	}
	xAns := make(chan ans, 1)
	go func() {
		resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{}`)
		xAns <- ans{resp, err}
	}()
	time.Sleep(lease + 200*time.Millisecond)
	yAns := make(chan ans, 1)
	go func() {
		resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{}`)
		yAns <- ans{resp, err}
	}()
	<-inY // Y took the run over and is in "charge"
	close(thawX)
	x := <-xAns
	require.NoError(t, x.err)
	require.Equal(t, http.StatusConflict, x.resp.StatusCode)
	got := retryAfter(t, x.resp)
	close(gateY)
	y := <-yAns
	require.NoError(t, y.err)
	require.Equal(t, http.StatusCreated, y.resp.StatusCode)
	require.GreaterOrEqual(t, got, 2, "the server that lost the run told its client to come back after %ds, inside the new lease", got)
}

// two sweeps and a
// retry race to take over the same stalled run. One of them wins; Start
// and the Atomic phase commit once; one charge.
func TestTwoSweepsAndARetryRaceForOneStalledRun(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	ph1, url := pp.serve(t, pp.db.Pool, pp.flow(time.Minute))
	ph2, _ := pp.serve(t, pp.db.PoolVia(t, pp.db.ServerAddr(t)), pp.flow(time.Minute))
	pp.provider.fail.Store(1)
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)

	ctx := testenv.Context(t, 30*time.Second)
	var wg sync.WaitGroup
	var completed atomic.Int64
	start := make(chan struct{})
	for _, ph := range []*idempotency.Phased{ph1, ph2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			n, err := ph.Recover(ctx, 10)
			if err == nil {
				completed.Add(int64(n))
			}
		}()
	}
	status, replayed := make(chan int, 1), make(chan bool, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		resp, _, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
		if err != nil {
			status <- 0
			replayed <- false
			return
		}
		status <- resp.StatusCode
		replayed <- resp.Header.Get(idempotency.ReplayedHeader) == "true"
	}()
	close(start)
	wg.Wait()
	s, r := <-status, <-replayed
	require.Contains(t, []int{http.StatusCreated, http.StatusConflict}, s)
	if s == http.StatusCreated && !r {
		require.Zero(t, completed.Load(), "the retry ran the run: no sweep completed it")
	} else {
		require.EqualValues(t, 1, completed.Load(), "a sweep completed the run, once")
	}
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.EqualValues(t, 1, pp.starts.Load())
	require.Equal(t, 1, pp.provider.madeCharges())
	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
}

// A pool of one connection is enough: no step holds a connection
// while it asks for a second (claim, Start, phases, release after a
// failure, the sweep), even with concurrent duplicates.
func TestAPoolOfOneConnectionDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	pool := pp.db.PoolVia(t, pp.db.ServerAddr(t), testenv.MaxConns(1))
	f := pp.flow(time.Minute)
	f.SweepBackoff = time.Millisecond
	ph, url := pp.serve(t, pool, f)
	c := &http.Client{Timeout: 20 * time.Second}
	pp.provider.fail.Store(1)
	resp, body, err := postTo(t, c, url, "k-1", `{"amount":5}`)
	require.NoError(t, err, "a hang on the one connection")
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	ctx := testenv.Context(t, 20*time.Second)
	eventually(t, 10*time.Second, func() bool { // after the sweep's backoff
		n, err := ph.Recover(ctx, 10)
		require.NoError(t, err)
		return n == 1
	}, "the sweep completes the run")

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := postTo(t, c, url, "k-2", `{"amount":6}`)
			if err == nil && resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
				t.Errorf("k-2: %d %s", resp.StatusCode, body)
			}
			if err != nil {
				t.Errorf("k-2: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, []string{"charged ch_1", "charged ch_2"}, pp.payments(t))
	require.EqualValues(t, 2, pp.starts.Load())
}

// A phase that panics (Atomic or External) fails like a phase
// that returned an error: the Atomic phase's writes roll back, the lease
// is released, and the retry resumes at once, without Start again.
func TestAPanickingPhaseLeavesTheRunToResume(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	f := pp.flow(time.Minute)
	charge, record := f.Phases[0].External, f.Phases[1].Atomic
	var chargeCalls, recordCalls atomic.Int64
	f.Phases[0].External = func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
		if chargeCalls.Add(1) == 1 {
			panic("charge blew up")
		}
		return charge(ctx, run)
	}
	f.Phases[1].Atomic = func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
		if recordCalls.Add(1) == 1 {
			if _, err := tx.Exec(ctx, `UPDATE `+pp.table+` SET state = 'half'`); err != nil {
				return idempotency.Step{}, err
			}
			panic("record blew up")
		}
		return record(ctx, tx, run)
	}
	_, url := pp.serve(t, pp.db.Pool, f)
	for _, want := range []int{http.StatusInternalServerError, http.StatusInternalServerError, http.StatusCreated} {
		resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
		require.NoError(t, err)
		require.Equal(t, want, resp.StatusCode, body)
		if want != http.StatusCreated {
			require.Equal(t, []string{"pending -"}, pp.payments(t), "nothing of the panicking phase committed")
		}
	}
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.EqualValues(t, 1, pp.starts.Load())
	require.Equal(t, 1, pp.provider.madeCharges())
}

// Respond with nil header and nil body, from an Atomic phase and
// from Start over an expired completed row, satisfies migration 012's
// CHECK (headers and body NOT NULL when completed) and is replayed byte
// for byte.
func TestNilHeaderAndBodyResponsesAreStoredAndReplayed(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	var starts atomic.Int64
	f := idempotency.Flow{
		Name: "races",
		Start: func(r *http.Request, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
			starts.Add(1)
			if string(run.Body) == "refuse" {
				return idempotency.Respond(http.StatusOK, nil, nil), nil
			}
			return idempotency.Continue("a", nil), nil
		},
		Phases: []idempotency.Phase{
			{From: "a", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				if run.State != nil {
					return idempotency.Step{}, errors.New("nil state came back non-nil")
				}
				return idempotency.Respond(http.StatusAccepted, nil, nil), nil
			}},
		},
	}
	_, url := servePhased(t, db.Pool, db.Schema, idempotency.Config{}, f)
	resp, first, err := postTo(t, http.DefaultClient, url, "k-1", `go`)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, resp.StatusCode, first)
	resp, again, err := postTo(t, http.DefaultClient, url, "k-1", `go`)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.Equal(t, first, again)

	db.Exec(t, `UPDATE `+db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 second'`)
	resp, first, err = postTo(t, http.DefaultClient, url, "k-1", `refuse`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, first)
	resp, again, err = postTo(t, http.DefaultClient, url, "k-1", `refuse`)
	require.NoError(t, err)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.Equal(t, first, again)
	require.EqualValues(t, 2, starts.Load())
}

// The COMMIT of Start's transaction is lost (the proxy cuts the
// connection after forwarding it): the client gets 503, the run exists
// and holds its lease; a retry during the lease gets 409 with a
// Retry-After covering it, and one after it resumes the run without
// running Start again.
func TestALostCommitOfStartIsResumedNotRestarted(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	proxy, err := faultproxy.Start(pp.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	const lease = 2 * time.Second
	_, url := pp.serve(t, pp.db.PoolVia(t, proxy.Addr()), pp.flow(lease))
	proxy.DropAfterCommits(1)
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	require.Equal(t, []string{"pending -"}, pp.payments(t), "Start committed; its reply was lost")

	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, resp.StatusCode, body)
	require.GreaterOrEqual(t, retryAfter(t, resp), 1)

	time.Sleep(lease)
	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.EqualValues(t, 1, pp.starts.Load())
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
}

// With Config.InProgressWait > 0 (the claim waits for the key's
// lock instead of answering 409 at once), concurrent duplicates of a
// phased request still make one run and one charge.
func TestInProgressWaitWithPhasedDuplicates(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	_, url := servePhased(t, pp.db.Pool, pp.db.Schema, idempotency.Config{InProgressWait: 2 * time.Second}, pp.flow(time.Minute))
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
			if err != nil {
				t.Errorf("%v", err)
				return
			}
			if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusConflict {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.EqualValues(t, 1, pp.starts.Load())
	require.Equal(t, 1, pp.provider.madeCharges())
}
