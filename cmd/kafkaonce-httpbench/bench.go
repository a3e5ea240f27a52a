package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

const benchSchema = "kafkaonce_httpbench"

// bench serves the same endpoint two ways: plain, in a transaction of its
// own, and keyed, behind the middleware.
type bench struct {
	pool         *pgxpool.Pool
	plain, keyed *httptest.Server
	floor        *httptest.Server // answers at once: what HTTP on loopback costs
	client       *http.Client
	clients      int
	keys         atomic.Int64
	table        string
}

func newBench(ctx context.Context, url string, clients int) (*bench, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(clients + 4)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{pool: pool, clients: clients, table: schema.Table(benchSchema, "payments")}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+benchSchema+` CASCADE`); err != nil {
		return nil, err
	}
	if _, err := schema.Migrate(ctx, pool, benchSchema); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+b.table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL, client text NOT NULL)`); err != nil {
		return nil, err
	}
	srv, err := idempotency.New(pool, &idempotency.Config{Schema: benchSchema,
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}) // a run ends by cancelling requests in flight
	if err != nil {
		return nil, err
	}
	b.keyed = httptest.NewServer(srv.HandleFunc(b.insert))
	b.plain = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return b.insert(w, r, tx) })
		if err != nil && r.Context().Err() == nil { // a run ends by cancelling requests in flight
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))
	b.floor = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":0,"amount":100}`)
	}))
	b.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients * 4, MaxConnsPerHost: 0}}
	return b, nil
}

// insert is the endpoint: one row, a 201 with it.
func (b *bench) insert(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	amount, err := strconv.ParseInt(strings.TrimSpace(string(body)), 10, 64)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return nil
	}
	var id int64
	if err := tx.QueryRow(r.Context(), `INSERT INTO `+b.table+` (amount, client) VALUES ($1, $2) RETURNING id`, amount, r.Header.Get("X-Client")).Scan(&id); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, err = fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, amount)
	return err
}

func (b *bench) close() {
	b.plain.Close()
	b.keyed.Close()
	b.floor.Close()
	_, _ = b.pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+benchSchema+` CASCADE`)
	b.pool.Close()
}

// request is one request to send: to which server, with which key.
type request struct {
	url, key string
}

// post sends one request and returns how long it took.
func (b *bench) post(ctx context.Context, q request) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.url+"/v1/payments", strings.NewReader("100"))
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Client", "bench")
	if q.key != "" {
		req.Header.Set(idempotency.DefaultHeader, q.key)
	}
	began := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return time.Since(began), nil
}

// flood runs b.clients clients flat out for d, each taking its next
// request from next, and returns the requests done per second and every
// request's latency.
func (b *bench) flood(ctx context.Context, d time.Duration, next func() request) (float64, []time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	began := time.Now()
	for range b.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for ctx.Err() == nil {
				took, err := b.post(ctx, next())
				if err != nil {
					if ctx.Err() == nil && firstErr == nil {
						mu.Lock()
						firstErr = err
						mu.Unlock()
					}
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(len(lat)) / time.Since(began).Seconds(), lat, firstErr
}

// paced sends rate requests a second for d, each on its own goroutine (an
// open loop: a slow server does not slow the sender), and returns their
// latencies.
func (b *bench) paced(ctx context.Context, d time.Duration, rate float64, next func() request) ([]time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-tick.C
		q := next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			took, err := b.post(ctx, q)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			lat = append(lat, took)
		}()
	}
	wg.Wait()
	return lat, firstErr
}

// freshKey makes a key never used before.
func (b *bench) freshKey() string { return "k-" + strconv.FormatInt(b.keys.Add(1), 10) }

// run measures each mode in rounds: full load, then half of the plain
// endpoint's capacity; and replays of keys already completed.
func (b *bench) run(ctx context.Context, d time.Duration, rounds int) (*results, error) {
	res := &results{seconds: d.Seconds(), rounds: rounds, clients: b.clients}
	plain := func() request { return request{url: b.plain.URL} }
	keyed := func() request { return request{url: b.keyed.URL, key: b.freshKey()} }
	modes := map[string]func() request{"plain": plain, "keyed": keyed}
	// Warm both up: connections, prepared statements, the table's pages.
	for _, next := range []func() request{plain, keyed} {
		if _, _, err := b.flood(ctx, time.Second, next); err != nil {
			return nil, err
		}
	}
	for round := range rounds {
		for _, mode := range interleaved(round) {
			tput, lat, err := b.flood(ctx, d, modes[mode])
			if err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
			res.add(mode+" full", tput, lat)
		}
		// Replays: the keys the last keyed run completed, sent again.
		done := b.keys.Load()
		var replayed atomic.Int64
		replay := func() request {
			n := replayed.Add(1)%done + 1
			return request{url: b.keyed.URL, key: "k-" + strconv.FormatInt(n, 10)}
		}
		tput, lat, err := b.flood(ctx, d, replay)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		res.add("replay full", tput, lat)
		tput, lat, err = b.flood(ctx, d, func() request { return request{url: b.floor.URL} })
		if err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		res.add("floor full", tput, lat)
	}
	half := res.median("plain full") / 2
	res.halfRate = half
	for round := range rounds {
		for _, mode := range interleaved(round) {
			lat, err := b.paced(ctx, d, half, modes[mode])
			if err != nil {
				return nil, fmt.Errorf("%s at half load: %w", mode, err)
			}
			res.add(mode+" half", 0, lat)
		}
	}
	return res, nil
}

// interleaved is the order of the modes in a round: each goes first every
// other round, so that neither always meets a database the other warmed.
func interleaved(round int) []string {
	if round%2 == 1 {
		return []string{"keyed", "plain"}
	}
	return []string{"plain", "keyed"}
}

// percentile returns the p-th percentile of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func sortDurations(d []time.Duration) { sort.Slice(d, func(i, j int) bool { return d[i] < d[j] }) }
