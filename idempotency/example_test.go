package idempotency_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// A payments endpoint: the payment row and the stored response commit
// together, so a client retrying with its key is charged once.
func Example() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost/payments")
	if err != nil {
		panic(err)
	}
	srv, err := idempotency.New(pool, &idempotency.Config{
		// Keys are per client: one client's key never replays another's response.
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Client-ID"), nil },
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", srv.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		var id int64
		if err := tx.QueryRow(r.Context(), `INSERT INTO payments (amount) VALUES (100) RETURNING id`).Scan(&id); err != nil {
			return err // rolled back: nothing kept, the client's retry runs afresh
		}
		w.WriteHeader(http.StatusCreated)
		_, err := fmt.Fprintf(w, `{"id":%d}`, id)
		return err
	}))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}
