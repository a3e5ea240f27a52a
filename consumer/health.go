package consumer

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Health is what the consumer's probes report.
type Health = kafkaoncetype.Health

// GroupHealth is a consumer group member as Health reports it.
type GroupHealth = kafkaoncetype.GroupHealth

// Health reports whether the consumer is live (no loop wedged: see
// Config.StallAfter) and ready (Run running, the member in its group,
// Postgres answering). It reads the consumer's own state; the only
// question it asks is a ping of Postgres, at most once a second and for at
// most a second, and none when a batch committed within the last second.
// Any number of goroutines may call it while Run runs.
func (c *Consumer) Health(ctx context.Context) Health { return c.engine.Health(ctx, true) }

// HealthHandler serves the liveness and readiness probes of consumers, for
// Kubernetes or any supervisor that speaks HTTP: a path ending in /livez
// answers 200 while every consumer is live, and a path ending in /readyz
// while every one is ready; any other path answers for both. Either way
// the body is the consumers' Health as JSON, and 503 says one is not. A
// liveness probe asks Postgres nothing, and answers at once; the others
// ask it for all the consumers together, within a second:
//
//	mux.Handle("/health/", consumer.HealthHandler(payments, refunds))
//	// livenessProbe:  httpGet: {path: /health/livez, port: 8081}
//	// readinessProbe: httpGet: {path: /health/readyz, port: 8081}
//
// No probe waits on a slow database for more than a second: see Health.
func HealthHandler(consumers ...*Consumer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		askDB := !strings.HasSuffix(r.URL.Path, "/livez")
		reports := make([]Health, len(consumers))
		var wg sync.WaitGroup
		for i, c := range consumers {
			wg.Go(func() { reports[i] = c.engine.Health(ctx, askDB) })
		}
		wg.Wait()
		live, ready := true, true
		for _, h := range reports {
			live = live && h.Live
			ready = ready && h.Ready
		}
		ok := live && ready
		switch {
		case strings.HasSuffix(r.URL.Path, "/livez"):
			ok = live
		case strings.HasSuffix(r.URL.Path, "/readyz"):
			ok = ready
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(struct {
			Live      bool          `json:"live"`
			Ready     bool          `json:"ready"`
			Consumers []namedHealth `json:"consumers"`
		}{live, ready, named(consumers, reports)})
	})
}

// namedHealth is one consumer's report, under its name.
type namedHealth struct {
	Name string `json:"name"`
	Health
}

func named(cs []*Consumer, hs []Health) []namedHealth {
	out := make([]namedHealth, len(cs))
	for i := range cs {
		out[i] = namedHealth{Name: cs[i].engine.Name(), Health: hs[i]}
	}
	slices.SortStableFunc(out, func(a, b namedHealth) int { return strings.Compare(a.Name, b.Name) })
	return out
}
