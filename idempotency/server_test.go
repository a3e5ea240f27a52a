package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
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
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// payments is a small payments API over a real database and real HTTP on
// loopback: POST /v1/payments inserts a payment and answers 201 with it.
type payments struct {
	t      *testing.T
	db     *testenv.DB
	srv    *httptest.Server
	calls  atomic.Int64 // handler executions
	table  string
	handle func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
}

func newPayments(t *testing.T, cfg *idempotency.Config) *payments {
	t.Helper()
	return newPaymentsOn(t, testenv.NewDB(t), cfg)
}

// newPaymentsOn is newPayments on a database the test made (its own pool
// options, say).
func newPaymentsOn(t *testing.T, db *testenv.DB, cfg *idempotency.Config) *payments {
	t.Helper()
	p := &payments{t: t, db: db, table: db.Table("payments")}
	db.Exec(t, `CREATE TABLE `+p.table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL, account text NOT NULL)`)
	if cfg == nil {
		cfg = &idempotency.Config{}
	}
	cfg.Schema = db.Schema
	if cfg.Scope == nil {
		cfg.Scope = func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }
	}
	s, err := idempotency.New(db.Pool, cfg)
	require.NoError(t, err)
	p.handle = p.create
	p.srv = httptest.NewServer(s.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		p.calls.Add(1)
		return p.handle(w, r, tx)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// create inserts the payment the body asks for.
func (p *payments) create(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	var req struct {
		Amount  int64  `json:"amount"`
		Account string `json:"account"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":"bad payment"}`)
		return nil
	}
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES ($1, $2) RETURNING id`, req.Amount, req.Account).Scan(&id); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/v1/payments/%d", id))
	w.WriteHeader(http.StatusCreated)
	_, err := fmt.Fprintf(w, `{"id":%d,"amount":%d,"at":%q}`, id, req.Amount, time.Now().Format(time.RFC3339Nano))
	return err
}

// post sends one request; key and client may be empty.
func (p *payments) post(key, client, body string) (*http.Response, string) {
	p.t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(body))
	require.NoError(p.t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(p.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(p.t, err)
	return resp, string(b)
}

// holdCalls makes every handler call wait until release is closed;
// started is closed when the first arrives.
func (p *payments) holdCalls() (started, release chan struct{}) {
	started, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		once.Do(func() { close(started) })
		<-release
		return p.create(w, r, tx)
	}
	return started, release
}

// answer is a response's status and body.
type answer struct {
	status int
	body   string
}

// postInBackground sends a request on a goroutine of its own; its answer
// comes on the channel.
func (p *payments) postInBackground(key, client, body string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		resp, b := p.post(key, client, body)
		out <- answer{resp.StatusCode, b}
	}()
	return out
}

// postRetrying posts a payment for alice to url through a Transport with
// short waits, and returns the last answer (its body closed).
func postRetrying(t *testing.T, url string) *http.Response {
	t.Helper()
	c := &http.Client{Transport: &idempotency.Transport{RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond}}
	req, err := http.NewRequest(http.MethodPost, url+"/v1/payments", strings.NewReader(`{"amount":1,"account":"a"}`))
	require.NoError(t, err)
	req.Header.Set("X-Client", "alice")
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

func (p *payments) count() int64 { return p.db.Int(p.t, `SELECT count(*) FROM `+p.table) }

func TestARetryGetsTheStoredResponseByteForByte(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	first, body := p.post("k-1", "alice", `{"amount":500,"account":"a"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Empty(t, first.Header.Get(idempotency.ReplayedHeader))

	again, replayed := p.post("k-1", "alice", `{"amount":500,"account":"a"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, body, replayed, "the body is replayed byte for byte (its timestamp included)")
	require.Equal(t, first.Header.Get("Location"), again.Header.Get("Location"))
	require.Equal(t, first.Header.Get("Content-Type"), again.Header.Get("Content-Type"))
	require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.count(), "one payment")
	require.EqualValues(t, 1, p.calls.Load(), "the handler ran once")
}

func TestFiftyIdenticalRequestsAtOnceExecuteOnce(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run(fmt.Sprintf("wait %v", wait), func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, &idempotency.Config{InProgressWait: wait})
			release := make(chan struct{})
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				<-release // every duplicate arrives while the first runs
				return p.create(w, r, tx)
			}
			var wg sync.WaitGroup
			statuses := make([]int, 50)
			bodies := make([]string, 50)
			for i := range statuses {
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, body := p.post("same", "alice", `{"amount":7,"account":"a"}`)
					statuses[i], bodies[i] = resp.StatusCode, body
				}()
			}
			time.Sleep(300 * time.Millisecond)
			close(release)
			wg.Wait()
			created, conflicts := 0, 0
			var createdBody string
			for i, s := range statuses {
				switch s {
				case http.StatusCreated:
					created++
					if createdBody == "" {
						createdBody = bodies[i]
					}
					require.Equal(t, createdBody, bodies[i], "every 201 is the same response")
				case http.StatusConflict:
					conflicts++
				default:
					t.Fatalf("unexpected status %d: %s", s, bodies[i])
				}
			}
			t.Logf("wait %v: %d created or replayed, %d conflicts", wait, created, conflicts)
			require.EqualValues(t, 1, p.calls.Load(), "one execution")
			require.EqualValues(t, 1, p.count(), "one payment")
			if wait > 0 {
				require.Equal(t, 50, created, "with a wait, every duplicate gets the response")
			} else {
				require.GreaterOrEqual(t, conflicts, 1, "without one, the duplicates running alongside get 409")
			}
		})
	}
}

func TestTheSameKeyForAnotherRequestIs422(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{FingerprintHeaders: []string{"X-Api-Version"}})
	resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	resp, body := p.post("k", "alice", `{"amount":2,"account":"a"}`)
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	require.Contains(t, body, "used for a different request")

	req, err := http.NewRequest(http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(`{"amount":1,"account":"a"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-Client", "alice")
	req.Header.Set("X-Api-Version", "2")
	r2, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r2.Body.Close()
	require.Equal(t, http.StatusUnprocessableEntity, r2.StatusCode, "a fingerprinted header is part of the request")
	require.EqualValues(t, 1, p.count())
}

func TestOneClientsKeyNeverReplaysAnothersResponse(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	_, alice := p.post("shared", "alice", `{"amount":1,"account":"a"}`)
	resp, bob := p.post("shared", "bob", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
	require.NotEqual(t, alice, bob)
	require.EqualValues(t, 2, p.count())
}

func TestFailuresKeepNothingAndFreeTheKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		fail func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
		want int
	}{
		{"error", func(http.ResponseWriter, *http.Request, pgx.Tx) error { return errors.New("partner down") }, http.StatusInternalServerError},
		{"panic", func(http.ResponseWriter, *http.Request, pgx.Tx) error { panic("boom") }, http.StatusInternalServerError},
		{"5xx", func(w http.ResponseWriter, _ *http.Request, _ pgx.Tx) error {
			w.WriteHeader(http.StatusBadGateway)
			return nil
		}, http.StatusBadGateway},
		{"commit", func(_ http.ResponseWriter, r *http.Request, tx pgx.Tx) error { return tx.Commit(r.Context()) }, http.StatusInternalServerError},
		{"swallowed SQL error", func(_ http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_, _ = tx.Exec(r.Context(), `SELECT 1/0`)
			return nil
		}, http.StatusInternalServerError},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			failing := true
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'written before the failure')`); err != nil {
					return err
				}
				if failing {
					return c.fail(w, r, tx)
				}
				return p.create(w, r, tx)
			}
			resp, _ := p.post("k", "alice", `{"amount":3,"account":"a"}`)
			require.Equal(t, c.want, resp.StatusCode)
			require.EqualValues(t, 0, p.count(), "the failed request's rows were rolled back")
			failing = false
			resp, _ = p.post("k", "alice", `{"amount":3,"account":"a"}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, "the retry runs afresh")
			require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
			require.EqualValues(t, 2, p.count())
		})
	}
}

func TestClientErrorsAreKept(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	resp, body := p.post("k", "alice", `{"amount":-1}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	again, replayed := p.post("k", "alice", `{"amount":-1}`)
	require.Equal(t, http.StatusBadRequest, again.StatusCode)
	require.Equal(t, body, replayed)
	require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.calls.Load())
}

func TestSecretHeadersAndCookiesAreNotKept(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{SecretHeaders: []string{"X-Session-Token"}})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("Set-Cookie", "session=abc")
		w.Header().Set("X-Session-Token", "secret")
		w.Header().Set("X-Trace", "kept")
		return p.create(w, r, tx)
	}
	first, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, "session=abc", first.Header.Get("Set-Cookie"), "the first response has them")
	again, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Empty(t, again.Header.Get("Set-Cookie"))
	require.Empty(t, again.Header.Get("X-Session-Token"))
	require.Equal(t, "kept", again.Header.Get("X-Trace"))
	stored := p.db.Int(t, `SELECT count(*) FROM `+p.db.Table("idempotency_keys")+` WHERE position('secret' in convert_from(headers, 'UTF8')) > 0 OR position('abc' in convert_from(headers, 'UTF8')) > 0`)
	require.Zero(t, stored, "never written to the table")
}

func TestInvalidAndMissingKeys(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{RequireKey: true})
	for _, key := range []string{strings.Repeat("k", idempotency.MaxKeyLen+1), "has space", "tab\tkey", "ünï"} {
		resp, body := p.post(key, "alice", `{"amount":1,"account":"a"}`)
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, key)
		require.Contains(t, body, "Idempotency-Key header", key)
	}
	resp, body := p.post("", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, body, "need an Idempotency-Key header")
	require.Zero(t, p.calls.Load())

	open := newPayments(t, nil)
	resp, _ = open.post("", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "without RequireKey a keyless request runs")
	resp, _ = open.post("", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 2, open.count(), "and runs again: it has no key")
}

func TestAnExpiredKeyRunsAgain(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.post("k", "alice", `{"amount":1,"account":"a"}`)
	p.db.Exec(t, `UPDATE `+p.db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 second'`)
	resp, _ := p.post("k", "alice", `{"amount":2,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "an expired key is free, even for another request")
	require.EqualValues(t, 2, p.count())
	require.EqualValues(t, 1, p.db.Int(t, `SELECT count(*) FROM `+p.db.Table("idempotency_keys")))
}

// A crash between the claim and the commit leaves nothing: the connection
// dies under the handler, the server rolls the transaction back (rows,
// key and all), and the retry runs once.
func TestAConnectionLostMidRequestLeavesNothing(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	killed := false
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (9, 'lost')`); err != nil {
			return err
		}
		if !killed {
			killed = true
			_, _ = p.db.Pool.Exec(context.Background(), `SELECT pg_terminate_backend($1)`, tx.Conn().PgConn().PID())
		}
		return p.create(w, r, tx)
	}
	resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.GreaterOrEqual(t, resp.StatusCode, 500)
	require.EqualValues(t, 0, p.count())
	require.EqualValues(t, 0, p.db.Int(t, `SELECT count(*) FROM `+p.db.Table("idempotency_keys")))
	// pg_terminate_backend only signals: the session holds the key's lock
	// until it is gone, and a retry meanwhile is (rightly) answered 409.
	eventually(t, 10*time.Second, func() bool { return advisoryLocks(t, p.db) == 0 }, "the terminated session's lock is released")
	resp, _ = p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.EqualValues(t, 2, p.count(), "the 'lost' row and the payment, once")
}

func TestNewRejectsBadConfigNamingTheField(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := idempotency.New(db.Pool, &idempotency.Config{Schema: "Bad Schema", Retention: time.Second, InProgressWait: time.Hour, RetryAfter: time.Millisecond})
	require.Error(t, err)
	for _, want := range []string{"Config.Schema", "Config.Retention must be at least 1m", "Config.InProgressWait must be 0 or between", "Config.RetryAfter must be at least 1s"} {
		require.ErrorContains(t, err, want)
	}
	_, err = idempotency.New(nil, nil)
	require.ErrorContains(t, err, "db must not be nil")
}

func TestTheStoreLooksUpCountsAndPrunesKeys(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.post("k-1", "alice", `{"amount":1,"account":"a"}`)
	p.post("k-2", "alice", `{"amount":2,"account":"a"}`)
	p.post("k-3", "bob", `{"amount":3,"account":"a"}`)
	store, err := idempotency.NewStore(p.db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	k, err := store.Get(ctx, p.db.Pool, "alice", "k-2")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, k.Status)
	require.Equal(t, "/v1/payments", k.Route)
	require.Equal(t, http.MethodPost, k.Method)
	require.Contains(t, string(k.Body), `"amount":2`)
	require.Equal(t, []string{"application/json"}, k.Header["Content-Type"])
	_, err = store.Get(ctx, p.db.Pool, "bob", "k-2")
	require.ErrorIs(t, err, idempotency.ErrNotFound)

	p.db.Exec(t, `UPDATE `+p.db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 second' WHERE scope = 'alice'`)
	counts, err := store.Count(ctx, p.db.Pool)
	require.NoError(t, err)
	require.Equal(t, idempotency.Counts{Total: 3, Expired: 2}, counts)
	n, err := store.Prune(ctx, p.db.Pool, 1)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "at most the limit")
	n, err = store.Prune(ctx, p.db.Pool, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	counts, err = store.Count(ctx, p.db.Pool)
	require.NoError(t, err)
	require.Equal(t, idempotency.Counts{Total: 1}, counts)
	_, err = store.Get(ctx, p.db.Pool, "bob", "k-3")
	require.NoError(t, err, "a live key is kept")
}

func TestAnInformationalStatusIsNotTakenForTheResponse(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.WriteHeader(http.StatusEarlyHints)
		return p.create(w, r, tx)
	}
	resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	again, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode, "the stored status is the final one")
}
