package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

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

// A payment charged at a card provider, outside the transaction: the
// pending payment commits with the key's claim, the charge runs under a
// provider key derived from ours, and the result commits with the stored
// response. A server that dies half way leaves a run that the retry, or
// the recovery sweep, resumes from its last recovery point.
func ExampleServer_Phased() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost/payments")
	if err != nil {
		panic(err)
	}
	srv, err := idempotency.New(pool, &idempotency.Config{
		Scope: func(r *http.Request) (string, error) { return r.Header.Get("X-Client-ID"), nil },
	})
	if err != nil {
		panic(err)
	}
	payments, err := srv.Phased(idempotency.Flow{
		Name:  "payments.create",
		Lease: 30 * time.Second, // well above the provider client's timeout
		Start: func(r *http.Request, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
			var id int64
			err := tx.QueryRow(r.Context(), `INSERT INTO payments (amount, state) VALUES (100, 'pending') RETURNING id`).Scan(&id)
			return idempotency.Continue("charge", []byte(strconv.FormatInt(id, 10))), err
		},
		Phases: []idempotency.Phase{
			{From: "charge", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				// May run again after a crash: the derived key makes the
				// provider answer with its first charge.
				charge, err := chargeAtProvider(ctx, run.DerivedKey("charge"), 100)
				return idempotency.Continue("record", []byte(string(run.State)+" "+charge)), err
			}},
			{From: "record", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				id, charge, _ := strings.Cut(string(run.State), " ")
				if _, err := tx.Exec(ctx, `UPDATE payments SET state = 'charged', charge = $2 WHERE id = $1`, id, charge); err != nil {
					return idempotency.Step{}, err
				}
				body := fmt.Sprintf(`{"id":%s,"charge":%q}`, id, charge)
				return idempotency.Respond(http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, []byte(body)), nil
			}},
		},
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = payments.RunRecovery(ctx, 10*time.Second) }()
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", payments)
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// chargeAtProvider stands for a card provider's client.
func chargeAtProvider(ctx context.Context, idempotencyKey string, amount int64) (string, error) {
	return "ch_1", nil
}
