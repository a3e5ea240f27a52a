package consumer_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestHealthNotLiveWhenMessagesProducedAfterCatchingUpAreNeverFetched:
// operations.md, Live means "no partition with messages waiting has gone
// Config.StallAfter without progress". A partition that caught up with the
// log and then gets new messages its fetches never hand out has messages
// waiting: it must be reported, as one that never caught up is.
func TestHealthNotLiveWhenMessagesProducedAfterCatchingUpAreNeverFetched(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { fake.Close() })
	e := setupOn(t, 1, &testenv.Kafka{Kafka: fake})
	ids := e.produceIDs("a", 10)
	var starve atomic.Bool
	var starved atomic.Int64
	fake.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
		fake.Fake.KeepControl()
		if !starve.Load() {
			return nil, nil, false
		}
		starved.Add(1)
		time.Sleep(50 * time.Millisecond) // an empty answer
		return req.ResponseKind(), nil, true
	})
	cfg := e.config(e.applyHandler())
	cfg.StallAfter = time.Second
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	defer e.run(c).stop()
	e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
	starve.Store(true)
	// A fetch that reached the broker before the starving began waits
	// there for records, and would get the next ones: produce once the
	// fetches that come after it are answered empty.
	waitFor(t, 15*time.Second, "fetches answered empty", func() bool { return starved.Load() >= 2 })
	more := e.produceIDs("b", 10)
	waitFor(t, 20*time.Second, "not live while 10 messages wait unfetched", func() bool { return !c.Health(ctx).Live })
	require.EqualValues(t, 10, e.effects(), "the messages produced while fetches were starved were fetched")
	starve.Store(false)
	e.waitCommitted(map[int]int64{0: 20}, 60*time.Second)
	e.check(expectation{ids: append(ids, more...)})
}

// TestHealthProbesStayBoundedOnASaturatedPool: Health asks Postgres "at
// most once a second, never for more than a second ... and never holds a
// probe up". With the pool's every connection held, concurrent probes
// each return within the bound, live and not ready.
func TestHealthProbesStayBoundedOnASaturatedPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 1)
	c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
	require.NoError(t, err)
	var held []interface{ Release() }
	for range int(e.db.Pool.Config().MaxConns) {
		conn, err := e.db.Pool.Acquire(ctx)
		require.NoError(t, err)
		held = append(held, conn)
	}
	defer func() {
		for _, h := range held {
			h.Release()
		}
	}()
	probes := consumer.HealthHandler(c)
	var wg sync.WaitGroup
	var slowest atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			code, body := probe(t, probes, http.MethodGet, "/livez")
			if d := time.Since(start); int64(d) > slowest.Load() {
				slowest.Store(int64(d))
			}
			if code != http.StatusOK || body["live"] != true {
				t.Errorf("a saturated pool made the consumer not live: %d %v", code, body)
			}
		}()
	}
	wg.Wait()
	require.Less(t, time.Duration(slowest.Load()), 2500*time.Millisecond, "a probe waited on the saturated pool past its bound")
	h := c.Health(ctx)
	require.False(t, h.Ready)
	require.NotEmpty(t, h.DatabaseError)
}

// TestHealthLivenessProbeAnswersWithinItsTimeoutWhileTheDatabaseHangs:
// operations.md gives the livenessProbe for HealthHandler(payments,
// refunds) without timeoutSeconds (Kubernetes' default: 1s), and says a
// database that is down is no stall and "never holds a probe up". So
// /livez must answer 200 within that second while Postgres accepts
// connections and never answers; a probe that takes longer fails, and
// failureThreshold of them restart a consumer over a database outage.
func TestHealthLivenessProbeAnswersWithinItsTimeoutWhileTheDatabaseHangs(t *testing.T) {
	t.Parallel()
	pool := hungDatabase(t)
	e := setup(t, 1)
	cfg := e.config(e.applyHandler())
	payments, err := consumer.New(pool, cfg)
	require.NoError(t, err)
	cfg2 := *cfg
	cfg2.Name = "refunds"
	refunds, err := consumer.New(pool, &cfg2)
	require.NoError(t, err)
	probes := consumer.HealthHandler(payments, refunds)
	start := time.Now()
	code, body := probe(t, probes, http.MethodGet, "/health/livez")
	took := time.Since(start)
	require.Equal(t, http.StatusOK, code, body)
	require.Less(t, took, time.Second, "the liveness probe outlived Kubernetes' default timeoutSeconds (1s) on a database that hangs")
}

// TestHealthHandlerUnderHostileRequests: HealthHandler answers odd paths,
// methods, query strings, huge headers and non-UTF-8 bytes in the path,
// many at once, for a consumer never run, one running, and one whose Run
// returned while probes came: never a panic, a hang or a goroutine left.
func TestHealthHandlerUnderHostileRequests(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
	require.NoError(t, err)
	srv := httptest.NewServer(consumer.HealthHandler(c, c))
	defer srv.Close()
	before := runtime.NumGoroutine()

	raw := func(line string, extra string) (int, string) {
		conn, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 5*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = fmt.Fprintf(conn, "%s\r\nHost: x\r\n%sConnection: close\r\n\r\n", line, extra)
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, "an answer to %q", line)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	probe := func(phase string) {
		for _, line := range []string{
			"GET /livez HTTP/1.1", "GET /readyz HTTP/1.1", "GET /health/livez?x=1&x=%ff HTTP/1.1",
			"GET / HTTP/1.1", "HEAD /readyz HTTP/1.1", "GET /\xff\xfe/livez HTTP/1.1", "GET /%ff%00/readyz HTTP/1.1",
			"GET /" + strings.Repeat("a", 6000) + " HTTP/1.1", "POST /livez HTTP/1.1", "OPTIONS * HTTP/1.1",
			"DELETE /readyz HTTP/1.1", "GET /livez/../readyz HTTP/1.1", "GET http://evil/livez HTTP/1.1",
		} {
			code, body := raw(line, "")
			require.NotEqualf(t, http.StatusInternalServerError, code, "%s: %q answered %d %s", phase, line, code, body)
			if code == http.StatusOK || code == http.StatusServiceUnavailable {
				if !strings.HasPrefix(line, "HEAD") && !strings.HasPrefix(line, "OPTIONS *") { // net/http answers OPTIONS * itself
					var v map[string]any
					require.NoErrorf(t, json.Unmarshal([]byte(body), &v), "%s: %q: body %q", phase, line, body)
				}
			}
		}
		code, _ := raw("GET /readyz HTTP/1.1", "X-Big: "+strings.Repeat("b", 900<<10)+"\r\n")
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable, http.StatusRequestHeaderFieldsTooLarge}, code)
	}
	concurrently := func(n int) {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				path := []string{"/livez", "/readyz", "/"}[i%3]
				resp, err := srv.Client().Get(srv.URL + path)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				_ = c.Health(context.Background())
			})
		}
		wg.Wait()
	}

	probe("never run")
	code, _ := raw("GET /readyz HTTP/1.1", "")
	require.Equal(t, http.StatusServiceUnavailable, code, "a consumer never run is not ready")
	concurrently(50)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 30*time.Second, "ready", func() bool { return c.Health(context.Background()).Ready })
	probe("running")
	// Run returns while probes come.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = c.Health(context.Background())
				resp, err := srv.Client().Get(srv.URL + "/readyz")
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		})
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel while probes came")
	}
	close(stop)
	wg.Wait()
	probe("returned")
	h := c.Health(context.Background())
	require.False(t, h.Ready)
	require.False(t, h.Running)

	srv.Client().CloseIdleConnections()
	waitFor(t, 20*time.Second, "the goroutines of the probes gone", func() bool { return runtime.NumGoroutine() <= before+2 })
}
