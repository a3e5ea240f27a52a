package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// apiConfig is what the API process is told by the one that starts it.
type apiConfig struct {
	Addr        string   `json:"addr"`
	DatabaseURL string   `json:"database_url"`
	Brokers     []string `json:"brokers"`
	Topic       string   `json:"topic"`
	ProviderURL string   `json:"provider_url"`
	Lease       string   `json:"lease"`
}

// PaymentRequest is the body of POST /v1/payments.
type PaymentRequest struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// Payment is the API's answer, and the event the ledger posts.
type Payment struct {
	ID      int64  `json:"id"`
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
	Charge  string `json:"charge"`
}

// serveAPI is the API process: POST /v1/payments as a phased request, the
// recovery sweep of its runs, and the outbox relay that publishes the
// payments' events. It runs until it is killed (that is the point) or
// interrupted.
func serveAPI(cfg apiConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.SetPrefix(fmt.Sprintf("[api %d] ", os.Getpid()))
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4})) // failures the run is built to survive
	lease, err := time.ParseDuration(cfg.Lease)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	srv, err := idempotency.New(pool, &idempotency.Config{
		Schema:     schemaName,
		RequireKey: true,
		// A real API takes the scope from its authentication.
		Scope:  func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil },
		Logger: quiet,
	})
	if err != nil {
		return err
	}
	events, err := outbox.New(schemaName)
	if err != nil {
		return err
	}
	card := &cardClient{url: cfg.ProviderURL, http: &http.Client{Timeout: 300 * time.Millisecond}}
	payments, err := srv.Phased(paymentFlow(lease, card, events, cfg.Topic))
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, &outbox.RelayConfig{Schema: schemaName, Brokers: cfg.Brokers,
		PollInterval: 20 * time.Millisecond, Logger: quiet})
	if err != nil {
		return err
	}
	go func() { _ = relay.Run(ctx) }()
	go func() { _ = payments.RunRecovery(ctx, 250*time.Millisecond) }()

	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", payments)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		_ = hs.Shutdown(context.Background())
	}()
	log.Printf("serving on %s", cfg.Addr)
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// paymentFlow is POST /v1/payments in three phases, because the charge
// happens at the card provider, outside our transaction:
//
//   - Start (with the key's claim): the payment, "pending";
//   - "charge" (external): the charge, under a provider idempotency key
//     derived from ours, so a resumed run never charges twice;
//   - "record" (atomic): the payment "charged", its event in the outbox,
//     and the response stored with the key, in one transaction.
func paymentFlow(lease time.Duration, card *cardClient, events *outbox.Outbox, topic string) idempotency.Flow {
	return idempotency.Flow{
		Name:  "payments.create",
		Lease: lease,
		Start: func(r *http.Request, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
			var req PaymentRequest
			if err := json.Unmarshal(run.Body, &req); err != nil || req.Amount <= 0 || req.Account == "" {
				return respondJSON(http.StatusBadRequest, map[string]string{"error": "a payment needs an account and a positive amount"})
			}
			var id int64
			err := tx.QueryRow(r.Context(), `INSERT INTO `+schemaName+`.payments (scope, idem_key, account, amount, state)
				VALUES ($1, $2, $3, $4, 'pending') RETURNING id`, run.Scope, run.Key, req.Account, req.Amount).Scan(&id)
			if err != nil {
				return idempotency.Step{}, err
			}
			state, _ := json.Marshal(Payment{ID: id, Account: req.Account, Amount: req.Amount})
			return idempotency.Continue("charge", state), nil
		},
		Phases: []idempotency.Phase{
			{From: "charge", External: func(ctx context.Context, run *idempotency.Run) (idempotency.Step, error) {
				var p Payment
				if err := json.Unmarshal(run.State, &p); err != nil {
					return idempotency.Step{}, err
				}
				charge, err := card.charge(ctx, run.DerivedKey("charge"), p)
				if err != nil {
					return idempotency.Step{}, err // the run stays at "charge"; the retry or the sweep calls again, with the same key
				}
				p.Charge = charge
				state, _ := json.Marshal(p)
				return idempotency.Continue("record", state), nil
			}},
			{From: "record", Atomic: func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
				var p Payment
				if err := json.Unmarshal(run.State, &p); err != nil {
					return idempotency.Step{}, err
				}
				if _, err := tx.Exec(ctx, `UPDATE `+schemaName+`.payments SET state = 'charged', charge = $2 WHERE id = $1`, p.ID, p.Charge); err != nil {
					return idempotency.Step{}, err
				}
				event, _ := json.Marshal(p)
				// The event's id is derived from the payment, so the
				// consumer's claim would refuse a second one even if it
				// were ever written.
				_, err := events.Write(ctx, tx, outbox.Message{ID: fmt.Sprintf("payment-%d", p.ID), Destination: topic,
					Key: []byte(p.Account), Value: event})
				if err != nil {
					return idempotency.Step{}, err
				}
				return respondJSON(http.StatusCreated, p)
			}},
		},
	}
}

// respondJSON ends a run with v as its JSON body.
func respondJSON(status int, v any) (idempotency.Step, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return idempotency.Step{}, err
	}
	return idempotency.Respond(status, http.Header{"Content-Type": {"application/json"}}, body), nil
}

// cardClient calls the card provider.
type cardClient struct {
	url  string
	http *http.Client
}

// charge asks the provider to charge p under key, and returns the charge's
// id. The provider answers a repeated key with the charge it made first.
func (c *cardClient) charge(ctx context.Context, key string, p Payment) (string, error) {
	body, _ := json.Marshal(map[string]any{"reference": p.ID, "amount": p.Amount})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/charges", strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.http.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("card provider: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", fmt.Errorf("card provider: %w", err)
	}
	return out.ID, nil
}
