package opspage

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// probeTimeout bounds the database question of a readiness probe.
const probeTimeout = time.Second

// consumerProbe is one consumer of the schema, as its tables show it.
type consumerProbe struct {
	Name    string `json:"name"`
	Stopped int    `json:"stopped_partitions"`
	Held    int    `json:"held_partitions"`
	Paused  int    `json:"pauses"`
}

// probes adds /livez and /readyz to mux: serve's own liveness (it answers)
// and readiness (Postgres answers within probeTimeout), with what the
// tables say of every consumer of the schema: partitions stopped at a
// message, held back by an open transaction, and pauses. A consumer's own
// liveness is its process's to tell (consumer.HealthHandler): serve sees
// the tables, not the loops.
func (p *page) probes(mux *http.ServeMux) {
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, r *http.Request) {
		writeProbe(w, http.StatusOK, map[string]any{"live": true})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
		defer cancel()
		consumers, err := p.consumerProbes(ctx)
		if err != nil {
			writeProbe(w, http.StatusServiceUnavailable, map[string]any{"ready": false,
				"problems": []string{"postgres: no answer within " + probeTimeout.String() + ": " + p.redact(err)}})
			return
		}
		writeProbe(w, http.StatusOK, map[string]any{"ready": true, "problems": []string{}, "consumers": consumers})
	})
}

func (p *page) consumerProbes(ctx context.Context) ([]consumerProbe, error) {
	store, err := pauses.NewStore(p.schema)
	if err != nil {
		return nil, err
	}
	// The pauses that hold, as the consumers and status count them.
	paused, err := store.Count(ctx, p.pool)
	if err != nil {
		return nil, err
	}
	runs := schema.Table(p.schema, "partition_runs")
	rows, err := p.pool.Query(ctx, `SELECT name,
  (SELECT count(*) FROM `+runs+` r WHERE r.consumer = c.name AND r.stopped_at IS NOT NULL),
  (SELECT count(*) FROM `+runs+` r WHERE r.consumer = c.name AND r.held_at IS NOT NULL)
FROM `+schema.Table(p.schema, "consumers")+` c ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []consumerProbe{}
	for rows.Next() {
		var c consumerProbe
		if err := rows.Scan(&c.Name, &c.Stopped, &c.Held); err != nil {
			return nil, err
		}
		c.Paused = paused[c.Name]
		out = append(out, c)
	}
	return out, rows.Err()
}

func writeProbe(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
