package consumer_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A consumer that speaks TLS to a plaintext broker says so: readiness
// names the cause instead of "joining", the health report carries the
// last dial error, and the log has it once at WARN, not a line per retry.
func TestHealthNamesTheDialFailure(t *testing.T) {
	t.Parallel()
	plaintext, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = plaintext.Close() })
	db := testenv.NewDB(t)
	logs := &syncBuffer{}
	c, err := consumer.New(db.Pool, &consumer.Config{Name: "tls-mismatch", KafkaClient: kafkaClient(), GroupID: testenv.Name(t, "g"), Brokers: plaintext.Brokers,
		Topics: []string{"orders"}, Schema: db.Schema, TLS: &tls.Config{MinVersion: tls.VersionTLS12}, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Handler: consumer.HandlerFunc(nil)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	const cause = "TLS handshake failed: is the broker's listener TLS?"
	waitFor(t, 30*time.Second, "a second failed dial", func() bool {
		d := c.Health(context.Background()).LastDialError
		return d != nil && d.Attempts >= 2
	})
	t.Run("readiness says why", func(t *testing.T) {
		h := c.Health(context.Background())
		require.False(t, h.Ready)
		require.Contains(t, strings.Join(h.Problems, "\n"), "cannot connect to the brokers: "+cause)
		require.NotContains(t, strings.Join(h.Problems, "\n"), "joining, or rejoining")
	})
	t.Run("the report carries the last dial error", func(t *testing.T) {
		code, body := probe(t, consumer.HealthHandler(c), http.MethodGet, "/health/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		d := body["consumers"].([]any)[0].(map[string]any)["last_dial_error"].(map[string]any)
		require.True(t, strings.HasPrefix(d["cause"].(string), cause), "%v", d["cause"])
		require.Equal(t, plaintext.Brokers[0], d["broker"])
		require.NotEmpty(t, d["error"])
		require.NotEmpty(t, d["since"])
		require.NotEmpty(t, d["at"])
	})
	t.Run("logged once at WARN", func(t *testing.T) {
		var warned int
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "cannot connect to the broker") {
				warned++
				require.Contains(t, line, cause)
			}
		}
		require.Equal(t, 1, warned, logs.String())
	})
}
