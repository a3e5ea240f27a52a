package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// keysStored counts the rows of the test's idempotency_keys.
func (p *payments) keysStored() int64 {
	return p.db.Int(p.t, `SELECT count(*) FROM `+p.db.Table("idempotency_keys"))
}

// advisoryLocks counts the advisory locks held by the test's sessions.
func advisoryLocks(t *testing.T, db *testenv.DB) int64 {
	return db.Int(t, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1`, db.Schema)
}

// eventually polls cond every 10ms for up to d.
func eventually(t *testing.T, d time.Duration, cond func() bool, msg string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: %s", d, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// postTo sends one keyed POST to url with client c and returns the response
// with its body read.
func postTo(t *testing.T, c *http.Client, url, key, body string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("X-Client", "alice")
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

// Two Servers on two pools are two processes: the advisory lock, not
// anything in memory, keeps a key's handler to one run.
func TestTwoServersOnTwoPoolsRunAKeyOnce(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		t.Run(fmt.Sprintf("wait %v", wait), func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			table := db.Table("payments")
			db.Exec(t, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL)`)
			var calls atomic.Int64
			var urls []string
			for _, pool := range []*pgxpool.Pool{db.Pool, db.PoolVia(t, db.ServerAddr(t))} {
				s, err := idempotency.New(pool, &idempotency.Config{Schema: db.Schema, InProgressWait: wait})
				require.NoError(t, err)
				srv := httptest.NewServer(s.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
					calls.Add(1)
					time.Sleep(100 * time.Millisecond) // the duplicates arrive meanwhile
					var id int64
					if err := tx.QueryRow(r.Context(), `INSERT INTO `+table+` (amount) VALUES (1) RETURNING id`).Scan(&id); err != nil {
						return err
					}
					w.WriteHeader(http.StatusCreated)
					_, err := fmt.Fprintf(w, `{"id":%d,"at":%q}`, id, time.Now().Format(time.RFC3339Nano))
					return err
				}))
				t.Cleanup(srv.Close)
				urls = append(urls, srv.URL)
			}
			const n = 30
			bodies := make([]string, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for try := 0; try < 300; try++ {
						resp, body, err := postTo(t, http.DefaultClient, urls[i%2], "same", `{"amount":1}`)
						if err != nil {
							t.Errorf("request %d: %v", i, err)
							return
						}
						if resp.StatusCode == http.StatusConflict {
							time.Sleep(20 * time.Millisecond)
							continue
						}
						if resp.StatusCode != http.StatusCreated {
							t.Errorf("request %d: %d %s", i, resp.StatusCode, body)
						}
						bodies[i] = body
						return
					}
					t.Errorf("request %d: still 409 after 300 tries", i)
				}()
			}
			wg.Wait()
			for i := range bodies {
				require.Equal(t, bodies[0], bodies[i], "every request got the one response")
			}
			require.EqualValues(t, 1, calls.Load(), "one execution across both servers")
			require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+table))
		})
	}
}

// storeBigResponses stores, under each key, a response too big for the
// socket buffers of loopback, so that a client that does not read it keeps
// the server's write blocked.
func storeBigResponses(t *testing.T, p *payments, keys ...string) {
	t.Helper()
	big := strings.Repeat("x", 32<<20)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if !strings.HasPrefix(r.Header.Get("Idempotency-Key"), "big") {
			return p.create(w, r, tx)
		}
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'big')`); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, big)
		return err
	}
	for _, key := range keys {
		resp, body := p.post(key, "alice", `{}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode)
		require.Len(t, body, len(big))
	}
}

// stallReplay sends a retry of key on a raw connection and never reads the
// answer.
func stallReplay(t *testing.T, p *payments, key string) {
	t.Helper()
	conn, err := net.Dial("tcp", p.srv.Listener.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() }) // before the server's Close, which waits for its handlers
	_, err = io.WriteString(conn, "POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: "+key+"\r\nX-Client: alice\r\nContent-Length: 2\r\n\r\n{}")
	require.NoError(t, err)
}

// A completed key is not "in progress": a retry of it gets the stored
// response even while another retry of it is still being answered (here,
// to a client that reads slowly).
func TestARetryOfACompletedKeyIsReplayedWhileAnotherRetryIsBeingRead(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	storeBigResponses(t, p, "big")
	stallReplay(t, p, "big")
	time.Sleep(500 * time.Millisecond) // the stalled replay is written into full socket buffers

	c := &http.Client{Timeout: 10 * time.Second}
	resp, body, err := postTo(t, c, p.srv.URL+"/v1/payments", "big", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the key completed: its response, not 409: %.200s", body)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.calls.Load())
}

// Replaying needs the database only to read the stored response: clients
// that read replays slowly must not hold the pool's connections, or a few
// of them starve every other request.
func TestSlowReadersOfReplaysHoldNoDatabaseConnection(t *testing.T) {
	t.Parallel()
	p := newPaymentsOn(t, testenv.NewDB(t, testenv.MaxConns(2)), nil)
	storeBigResponses(t, p, "big-1", "big-2")
	stallReplay(t, p, "big-1")
	stallReplay(t, p, "big-2")
	time.Sleep(500 * time.Millisecond)

	c := &http.Client{Timeout: 3 * time.Second}
	resp, body, err := postTo(t, c, p.srv.URL+"/v1/payments", "other", `{"amount":5,"account":"a"}`)
	require.NoError(t, err, "a new payment while two clients read replays slowly")
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
}

// 103 Early Hints is informational: the response the handler decided is
// the final one, and that is what is stored and replayed.
func TestEarlyHintsDoNotBecomeTheStoredStatus(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("Link", "</receipt.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		return p.create(w, r, tx)
	}
	first, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode, "the final status after 103: %s", body)
	again, replayed := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, again.StatusCode)
	require.Equal(t, body, replayed)
	require.EqualValues(t, 1, p.count())
}

// A header value with a newline (an echoed reference, say) is sent by
// net/http with the newline as a space. The replay must send the same, not
// cut the value or turn its tail into a header of its own.
func TestAHeaderValueWithANewlineIsReplayedAsFirstSentAndInjectsNothing(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		w.Header().Set("X-Reference", "order 7\nSet-Cookie: session=stolen")
		return p.create(w, r, tx)
	}
	first, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Empty(t, first.Header.Values("Set-Cookie"), "net/http sends no such header")
	again, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader))
	require.Empty(t, again.Header.Values("Set-Cookie"), "a replay never sends a Set-Cookie, let alone one the first response did not have")
	require.Equal(t, first.Header.Values("X-Reference"), again.Header.Values("X-Reference"), "byte for byte")
}

// Ending the transaction with SQL instead of tx.Commit or tx.Rollback is the
// same misuse: the key, the rows and the response are no longer in one
// transaction, so nothing may be stored.
func TestAHandlerThatRollsBackWithSQLKeepsNothing(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	misuse := true
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := p.create(w, r, tx); err != nil {
			return err
		}
		if misuse {
			_, err := tx.Exec(r.Context(), `ROLLBACK`)
			return err
		}
		return nil
	}
	resp, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	t.Logf("first: %d %s; payments %d, keys %d", resp.StatusCode, body, p.count(), p.keysStored())
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "tx misuse is a handler error")
	require.Zero(t, p.keysStored(), "no key stored for a payment that was rolled back")
	misuse = false
	resp, _ = p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader), "the retry runs afresh")
	require.EqualValues(t, 1, p.count())
}

// InProgressWait is a bound on the wait, a lock_timeout counted in
// milliseconds: under a millisecond it would become lock_timeout = 0, no
// bound at all, so New refuses it.
func TestAnInProgressWaitUnderAMillisecondIsRefused(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema, InProgressWait: 500 * time.Microsecond})
	require.ErrorContains(t, err, "Config.InProgressWait must be 0 or between 1ms and 1m (got 500µs)")
}

// timeoutMiddleware gives every request a deadline, as API gateways' and
// routers' timeout middlewares do.
func timeoutMiddleware(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), d)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// A request's context can end with the client still there (a deadline of
// a middleware). Nothing was committed then, and the answer must say so:
// never a 2xx, which the client takes for success and does not retry.
func TestARequestWhoseContextEndsBeforeTheCommitIsNeverAnswered2xx(t *testing.T) {
	t.Parallel()
	t.Run("while waiting for the key", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, &idempotency.Config{InProgressWait: 5 * time.Second})
		started, release := p.holdCalls()
		first := p.postInBackground("k", "alice", `{"amount":1,"account":"a"}`)
		<-started
		time.AfterFunc(1500*time.Millisecond, func() { close(release) })
		defer func() { <-first }()

		inner := p.srv.Config.Handler
		gw := httptest.NewServer(timeoutMiddleware(300*time.Millisecond, inner))
		t.Cleanup(gw.Close)
		resp, body, err := postTo(t, http.DefaultClient, gw.URL+"/v1/payments", "k", `{"amount":1,"account":"a"}`)
		require.NoError(t, err)
		t.Logf("answered %d %q", resp.StatusCode, body)
		require.False(t, resp.StatusCode < 300, "got %d with body %q: a success for a request that got no response", resp.StatusCode, body)
	})
	t.Run("after the handler", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, nil)
		p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			if err := p.create(w, r, tx); err != nil {
				return err
			}
			time.Sleep(500 * time.Millisecond) // a slow fraud check, say
			return nil
		}
		gw := httptest.NewServer(timeoutMiddleware(300*time.Millisecond, p.srv.Config.Handler))
		t.Cleanup(gw.Close)
		resp, body, err := postTo(t, http.DefaultClient, gw.URL+"/v1/payments", "k", `{"amount":1,"account":"a"}`)
		require.NoError(t, err)
		t.Logf("answered %d %q; payments %d, keys %d", resp.StatusCode, body, p.count(), p.keysStored())
		if p.count() == 0 {
			require.False(t, resp.StatusCode < 300, "got %d with body %q, but no payment was committed", resp.StatusCode, body)
		}
	})
}

// With a default isolation above READ COMMITTED (common in payments), the
// waiter's snapshot predates the first request's commit: it must still
// replay, not run the handler again.
func TestInProgressWaitReplaysUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
	p := newPaymentsOn(t, db, &idempotency.Config{InProgressWait: 5 * time.Second})
	started, release := p.holdCalls()
	first := p.postInBackground("k", "alice", `{"amount":1,"account":"a"}`)
	<-started
	second := p.postInBackground("k", "alice", `{"amount":1,"account":"a"}`)
	time.Sleep(300 * time.Millisecond) // the second waits for the key
	close(release)
	a, b := <-first, <-second
	t.Logf("answers: %d %s / %d %s; handler ran %d times", a.status, a.body, b.status, b.body, p.calls.Load())
	require.Equal(t, http.StatusCreated, a.status)
	require.Equal(t, http.StatusCreated, b.status)
	require.Equal(t, a.body, b.body)
	require.EqualValues(t, 1, p.calls.Load(), "the handler ran once")
	require.EqualValues(t, 1, p.count())
}

// net/http panics on a status outside 100-999; a handler that sets one has
// failed, like one that panics: nothing is kept, the key stays free.
func TestAnInvalidStatusKeepsNothing(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'a')`); err != nil {
			return err
		}
		w.WriteHeader(42)
		return nil
	}
	resp, body, err := postTo(t, http.DefaultClient, p.srv.URL+"/v1/payments", "k", `{}`)
	if err == nil {
		t.Logf("answered %d %s", resp.StatusCode, body)
	} else {
		t.Logf("no answer: %v", err)
	}
	require.Zero(t, p.keysStored(), "no key for a response that cannot be sent")
	require.Zero(t, p.count(), "rolled back, like a panic")
}

// The route is the URL path by default, which may hold bytes Postgres text
// cannot (percent-encoded). That is not a database failure to retry.
func TestARouteWithBytesThatAreNotUTF8IsNotADatabaseFailure(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	for _, path := range []string{"/v1/payments/%FF", "/v1/payments/%00"} {
		first, body, err := postTo(t, http.DefaultClient, p.srv.URL+path, "k"+path[len(path)-2:], `{"amount":1,"account":"a"}`)
		require.NoError(t, err)
		require.Less(t, first.StatusCode, 500, "%s: %d %s", path, first.StatusCode, body)
		again, _, err := postTo(t, http.DefaultClient, p.srv.URL+path, "k"+path[len(path)-2:], `{"amount":1,"account":"a"}`)
		require.NoError(t, err)
		require.Equal(t, first.StatusCode, again.StatusCode, path)
		require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader), path)
	}
}

// A waiter for a request that then fails runs the request itself, once;
// a second waiter replays that.
func TestInProgressWaitRunsTheRequestWhenTheFirstFails(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{InProgressWait: 5 * time.Second})
	started, release := make(chan struct{}), make(chan struct{})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if p.calls.Load() == 1 {
			close(started)
			<-release
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'failed')`); err != nil {
				return err
			}
			return errors.New("partner down")
		}
		return p.create(w, r, tx)
	}
	statuses := make(chan int, 1)
	go func() {
		resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
		statuses <- resp.StatusCode
	}()
	<-started
	var wg sync.WaitGroup
	bodies := make([]string, 2)
	replayed := make([]string, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, body)
			bodies[i], replayed[i] = body, resp.Header.Get(idempotency.ReplayedHeader)
		}()
	}
	time.Sleep(300 * time.Millisecond)
	close(release)
	wg.Wait()
	require.Equal(t, http.StatusInternalServerError, <-statuses)
	require.Equal(t, bodies[0], bodies[1])
	require.ElementsMatch(t, []string{"", "true"}, replayed, "one waiter ran it, the other replayed it")
	require.EqualValues(t, 2, p.calls.Load(), "the failed run and one more")
	require.EqualValues(t, 1, p.count())
}

// A client that gives up mid-request leaves nothing, and its key free.
func TestAClientThatCancelsMidRequestLeavesTheKeyFree(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	started, finished := make(chan struct{}), make(chan struct{})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if p.calls.Load() > 1 {
			return p.create(w, r, tx)
		}
		defer close(finished)
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'cancelled')`); err != nil {
			return err
		}
		close(started)
		<-r.Context().Done()
		w.WriteHeader(http.StatusCreated) // a handler that does not look at ctx
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.srv.URL+"/v1/payments", strings.NewReader(`{"amount":1,"account":"a"}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("X-Client", "alice")
	go func() { <-started; cancel() }()
	_, err = http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.Canceled)
	<-finished
	eventually(t, 5*time.Second, func() bool { return advisoryLocks(t, p.db) == 0 }, "the cancelled request's lock is released")
	require.Zero(t, p.keysStored())
	require.Zero(t, p.count())
	resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.count())
}

// Keys live in a schema: the same scope and key in another schema is
// another key.
func TestAKeyInOneSchemaIsNotSeenInAnother(t *testing.T) {
	t.Parallel()
	a, b := newPayments(t, nil), newPayments(t, nil)
	ra, bodyA := a.post("k", "alice", `{"amount":1,"account":"a"}`)
	rb, bodyB := b.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, ra.StatusCode)
	require.Equal(t, http.StatusCreated, rb.StatusCode)
	require.Empty(t, rb.Header.Get(idempotency.ReplayedHeader))
	require.NotEqual(t, bodyA, bodyB)
	require.EqualValues(t, 1, a.count())
	require.EqualValues(t, 1, b.count())
}

// A COMMIT whose reply is lost is answered 503; the retry finds out what
// happened and the handler's effect exists once.
func TestALostCommitReplyIs503AndTheRetryFindsTheOutcome(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	proxy, err := faultproxy.Start(db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	viaProxy := &testenv.DB{Pool: db.PoolVia(t, proxy.Addr()), Schema: db.Schema, URL: db.URL}
	p := newPaymentsOn(t, viaProxy, nil)
	proxy.DropAfterCommits(1)
	resp, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	var again *http.Response
	for try := 0; try < 100; try++ {
		again, body = p.post("k", "alice", `{"amount":1,"account":"a"}`)
		if again.StatusCode != http.StatusConflict {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, http.StatusCreated, again.StatusCode, body)
	t.Logf("the retry was replayed: %q; handler ran %d times", again.Header.Get(idempotency.ReplayedHeader), p.calls.Load())
	require.EqualValues(t, 1, p.count(), "one payment")
}

// Headers set after the body, and a second WriteHeader: whatever the first
// response was, the replay is the same.
func TestOddlyWrittenResponsesAreReplayedAsFirstSent(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := p.create(w, r, tx); err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted) // superfluous
		w.Header().Set("X-Late", "after the body")
		w.Header()["x-lowercase"] = []string{"v1", "v2"}
		w.Header().Set("X-Bytes", "café\ttab  two spaces")
		return nil
	}
	first, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	again, replayed := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	require.Equal(t, first.StatusCode, again.StatusCode)
	require.Equal(t, body, replayed)
	again.Header.Del(idempotency.ReplayedHeader)
	again.Header.Del("Date")
	first.Header.Del("Date")
	require.Equal(t, first.Header, again.Header)
}

// A body over MaxBodyBytes is 413, runs nothing and keeps nothing.
func TestABodyOverMaxBodyBytesIs413AndKeepsNothing(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{MaxBodyBytes: 32})
	resp, body := p.post("k", "alice", `{"amount":1,"account":"aaaaaaaaaaaaaaa"}`)
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode, body)
	require.Zero(t, p.calls.Load())
	require.Zero(t, p.keysStored())
	resp, _ = p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the key is free")
}

// GET and HEAD are not keyed methods: a key on them is ignored, and they
// run every time.
func TestAKeyOnAGetOrHeadIsIgnored(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		_, err := fmt.Fprintf(w, "call %d", p.calls.Load())
		return err
	}
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		for range 2 {
			req, err := http.NewRequest(method, p.srv.URL+"/v1/payments", nil)
			require.NoError(t, err)
			req.Header.Set("Idempotency-Key", "k")
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode)
			require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
		}
	}
	require.EqualValues(t, 4, p.calls.Load())
	require.Zero(t, p.keysStored())
}

// Pruning does not wait for a request running an expired key again (it
// holds the key's lock, not its old row), and that request then stores the
// key anew.
func TestPruneSkipsAnExpiredKeyThatIsRunningAgain(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.post("k", "alice", `{"amount":1,"account":"a"}`)
	p.post("k-other", "alice", `{"amount":1,"account":"a"}`)
	p.db.Exec(t, `UPDATE `+p.db.Table("idempotency_keys")+` SET expires_at = now() - interval '1 second'`)
	started, release := p.holdCalls()
	running := p.postInBackground("k", "alice", `{"amount":2,"account":"a"}`)
	<-started
	store, err := idempotency.NewStore(p.db.Schema)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	n, err := store.Prune(ctx, p.db.Pool, 100)
	close(release)
	require.NoError(t, err, "prune does not wait for the running request")
	require.EqualValues(t, 2, n, "both expired rows: the running request holds its key's lock, not its old row")
	require.Equal(t, http.StatusCreated, (<-running).status)
	k, err := store.Get(context.Background(), p.db.Pool, "alice", "k")
	require.NoError(t, err)
	require.True(t, k.ExpiresAt.After(time.Now()))
	require.Contains(t, string(k.Body), `"amount":2`)
}

// A goroutine the handler leaves running cannot write in the request's
// transaction once the handler returned.
func TestTxUsedAfterTheHandlerReturnedIsRefused(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	late := make(chan error, 1)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		go func() {
			time.Sleep(200 * time.Millisecond)
			_, err := tx.Exec(context.Background(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'late')`)
			late <- err
		}()
		return p.create(w, r, tx)
	}
	resp, _ := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Error(t, <-late)
	require.EqualValues(t, 1, p.count())
	require.Zero(t, p.db.Int(t, `SELECT count(*) FROM `+p.table+` WHERE account = 'late'`))
}

// The handler runs under the session's lock_timeout, not InProgressWait's.
func TestTheHandlerRunsUnderTheSessionsLockTimeout(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["lock_timeout"] = "250ms" })
	p := newPaymentsOn(t, db, &idempotency.Config{InProgressWait: 5 * time.Second})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var v string
		if err := tx.QueryRow(r.Context(), `SHOW lock_timeout`).Scan(&v); err != nil {
			return err
		}
		_, err := io.WriteString(w, v)
		return err
	}
	_, body := p.post("k", "alice", `{}`)
	require.Equal(t, "250ms", body)
}

// A 429 the handler decides (a velocity limit: "slow down") asks for a
// retry, and the Transport retries it with the same key. If it were stored
// with the key, every retry would get it again and could never pass.
func TestAHandlersTooManyRequestsIsNotKeptForTheKey(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if p.calls.Load() == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			_, err := io.WriteString(w, `{"error":"velocity limit for this account: retry later"}`)
			return err
		}
		return p.create(w, r, tx)
	}
	resp := postRetrying(t, p.srv.URL)
	t.Logf("after the retries: %d (replayed %q), handler ran %d times", resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader), p.calls.Load())
	require.Equal(t, http.StatusCreated, resp.StatusCode, "the Transport's retry after Retry-After passed")
	require.EqualValues(t, 1, p.count())
}

// A 409 the handler decides is not "the key's first request still
// running". Either it is kept, and a retry can only get it again, or it is
// not, and a retry runs afresh: one retry at most, not MaxAttempts of
// replays of the same answer.
func TestAHandlersConflictIsNotRetriedAsAKeyInProgress(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if p.calls.Load() == 1 {
			w.WriteHeader(http.StatusConflict)
			_, err := io.WriteString(w, `{"error":"the order is being paid by another operation"}`)
			return err
		}
		return p.create(w, r, tx)
	}
	var attempts atomic.Int64
	inner := p.srv.Config.Handler
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)
	resp := postRetrying(t, counted.URL)
	t.Logf("%d attempts, the last answered %d (replayed %q)", attempts.Load(), resp.StatusCode, resp.Header.Get(idempotency.ReplayedHeader))
	require.LessOrEqual(t, attempts.Load(), int64(2))
}

// End to end: a handler error keeps nothing, and the Transport's retry
// runs the request afresh, once.
func TestTheClientsRetryRunsAFailedRequestAfresh(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'doomed')`); err != nil {
			return err
		}
		if p.calls.Load() == 1 {
			return errors.New("partner down")
		}
		return p.create(w, r, tx)
	}
	resp := postRetrying(t, p.srv.URL)
	require.Equal(t, http.StatusCreated, resp.StatusCode)
	require.Empty(t, resp.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 2, p.calls.Load())
	require.EqualValues(t, 2, p.count(), "the second run's 'doomed' row and its payment")
}

// A COMMIT that never reaches Postgres (the server's machine died, a
// network path went dark) leaves its session idle in transaction, holding
// the key's lock: the key is "in progress" for as long as that session
// lives. The consumer bounds such a transaction
// (idle_in_transaction_session_timeout, 60 s by default); a request's
// transaction must be bounded too, or the key is stuck for hours.
func TestAnAbandonedTransactionDoesNotKeepItsKeyInProgressForever(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	proxy, err := faultproxy.Start(db.ServerAddr(t))
	require.NoError(t, err)
	viaProxy := &testenv.DB{Pool: db.PoolVia(t, proxy.Addr()), Schema: db.Schema, URL: db.URL}
	p := newPaymentsOn(t, viaProxy, nil)
	t.Cleanup(func() { proxy.Close() }) // ends the stranded session
	var idleTimeout atomic.Value
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var v string
		if err := tx.QueryRow(r.Context(), `SHOW idle_in_transaction_session_timeout`).Scan(&v); err != nil {
			return err
		}
		idleTimeout.Store(v)
		return p.create(w, r, tx)
	}
	proxy.SwallowCommits(1)
	resp, body := p.post("k", "alice", `{"amount":1,"account":"a"}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	require.EqualValues(t, 1, proxy.Swallowed())
	conflicts := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		resp, _ = p.post("k", "alice", `{"amount":1,"account":"a"}`)
		if resp.StatusCode == http.StatusConflict {
			conflicts++
		}
	}
	t.Logf("retries answered 409 %d times in 2s; the request's transaction ran with idle_in_transaction_session_timeout = %v, %d session(s) idle in transaction",
		conflicts, idleTimeout.Load(), db.Sessions(t, "idle in transaction%"))
	require.NotEqual(t, "0", idleTimeout.Load(), "the stranded transaction, and the key's lock, are held with no bound")
}

// Scope "ab" with key "c" and scope "a" with key "bc" spell the same
// bytes end to end: their locks must still differ, or one would answer
// 409 while the other runs.
func TestKeysWhoseScopeAndKeyConcatenateAlikeDoNotShareALock(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	started, release := make(chan struct{}), make(chan struct{})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if r.Header.Get("X-Client") == "ab" {
			close(started)
			<-release
		}
		return p.create(w, r, tx)
	}
	held := p.postInBackground("c", "ab", `{"amount":1,"account":"a"}`)
	<-started
	resp, body := p.post("bc", "a", `{"amount":1,"account":"a"}`)
	close(release)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, http.StatusCreated, (<-held).status)
	require.EqualValues(t, 2, p.count())
}

// A keyed request's transaction has the configured idle timeout, or the
// server's under LeaveUnset, whichever way its key is claimed.
func TestTheIdleTimeoutIsTheConfiguredOneOrTheServers(t *testing.T) {
	t.Parallel()
	for _, wait := range []time.Duration{0, 5 * time.Second} {
		for _, c := range []struct {
			idle time.Duration
			want string
		}{{0, "1min"}, {5 * time.Second, "5s"}, {idempotency.LeaveUnset, ""}} {
			t.Run(fmt.Sprintf("wait %v idle %v", wait, c.idle), func(t *testing.T) {
				t.Parallel()
				p := newPayments(t, &idempotency.Config{InProgressWait: wait, IdleInTransactionTimeout: c.idle})
				want := c.want
				if want == "" {
					require.NoError(t, p.db.Pool.QueryRow(context.Background(), `SHOW idle_in_transaction_session_timeout`).Scan(&want))
				}
				p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
					var got string
					if err := tx.QueryRow(r.Context(), `SHOW idle_in_transaction_session_timeout`).Scan(&got); err != nil {
						return err
					}
					_, err := io.WriteString(w, got)
					return err
				}
				resp, body := p.post("k", "alice", `{}`)
				require.Equal(t, http.StatusOK, resp.StatusCode, body)
				require.Equal(t, want, body)
			})
		}
	}
}
