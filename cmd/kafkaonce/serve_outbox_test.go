package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// The page shows the schema's outbox backlog as the table holds it at the
// request: rows to deliver, those waiting for a retry, parked ones and the
// oldest row's age; and once a relay, in a process of its own, drained it,
// nothing left.
func TestServeShowsTheOutboxBacklog(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	box, err := outbox.New(w.db.Schema)
	require.NoError(t, err)
	var ids []string
	require.NoError(t, pgx.BeginFunc(context.Background(), w.db.Pool, func(tx pgx.Tx) error {
		ids, err = box.Write(context.Background(), tx, outbox.Message{Destination: "partner", Key: []byte("a")},
			outbox.Message{Destination: "partner", Key: []byte("b")}, outbox.Message{Destination: "partner", Key: []byte("c")},
			outbox.Message{Destination: "partner", Key: []byte("d")})
		return err
	}))
	table := w.db.Table("outbox")
	w.db.Exec(t, `UPDATE `+table+` SET created_at = now() - interval '2 hours' WHERE id = $1`, ids[0])
	w.db.Exec(t, `UPDATE `+table+` SET attempts = 1, next_attempt_at = now() + interval '1 hour' WHERE id = $1`, ids[1])
	w.db.Exec(t, `UPDATE `+table+` SET attempts = 9, failed_at = now(), last_error = 'HTTP 400' WHERE id = $1`, ids[3])
	srv := w.servePage(w.env(), serveOptions{})

	res, body := get(t, srv, "/")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "3 rows to deliver, 1 of them waiting for a retry; 1 parked; the oldest written 2h0m")
	require.Contains(t, body, ids[3], "the parked row is listed")

	// A relay delivers what is due, and the page, asked again, shows only
	// the waiting row and the parked one.
	relay, err := outbox.NewRelay(w.db.Pool, &outbox.RelayConfig{Schema: w.db.Schema, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Deliver: func(context.Context, *outbox.Delivery) error { return nil }})
	require.NoError(t, err)
	testenv.Background(t, relay.Run)
	waitUntil(t, 30*time.Second, "the backlog drained to its waiting row", func() bool {
		_, body = get(t, srv, "/")
		return strings.Contains(body, "1 rows to deliver, 1 of them waiting for a retry; 1 parked; the oldest written")
	})

	// The parked row retried, delivered, and the waiting one with it once
	// due: nothing left.
	w.db.Exec(t, `UPDATE `+table+` SET next_attempt_at = now() WHERE id = $1`, ids[1])
	_, err = box.Retry(context.Background(), w.db.Pool, ids[3])
	require.NoError(t, err)
	waitUntil(t, 30*time.Second, "the backlog drained", func() bool {
		_, body = get(t, srv, "/")
		return strings.Contains(body, "0 rows to deliver, 0 of them waiting for a retry; 0 parked</p>")
	})
}
