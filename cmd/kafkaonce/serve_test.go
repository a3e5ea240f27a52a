package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

const scriptValue = `<script>alert(1)</script>`

// poisoned is a world whose consumer set aside two messages, one of them
// holding markup, and left one message unprocessed (lag 1). fixed makes
// the handler accept them.
type poisoned struct {
	*world
	fixed   *atomic.Bool
	handler consumer.HandlerFunc
}

func newPoisoned(t *testing.T) *poisoned {
	w := newWorld(t, 1)
	msg := func(id, value string) kafka.Message {
		return kafka.Message{Key: []byte(id), Value: []byte(value), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}, {Key: "origin", Value: []byte("<b>bold</b>")}}}
	}
	w.kafka.Produce(t, w.topic, msg("ok0", "fine"), msg("bad1", scriptValue), msg("ok2", "fine"), msg("bad3", "not json"), msg("ok4", "fine"))
	p := &poisoned{world: w, fixed: &atomic.Bool{}}
	p.handler = func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if strings.HasPrefix(m.ID, "bad") && !p.fixed.Load() {
			return consumer.Permanent(errors.New("partner said no to " + string(m.Value)))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
		return err
	}
	w.consume(p.handler, 5)
	w.kafka.Produce(t, w.topic, msg("late5", "fine"))
	return p
}

// letterID returns the id of the letter of message id.
func (w *world) letterID(messageID string) int64 {
	return w.db.Int(w.t, `SELECT id FROM `+w.db.Table("dead_letters")+` WHERE message_id = $1`, messageID)
}

// servePage serves the page as kafkaonce serve would, with env as the
// environment and args as the global flags.
func (w *world) servePage(env map[string]string, o serveOptions, args ...string) *httptest.Server {
	w.t.Helper()
	st := streams{in: strings.NewReader(""), out: io.Discard, err: io.Discard, terminal: func() bool { return false }, getenv: func(k string) string { return env[k] }}
	root, s := newRootSettings(st)
	require.NoError(w.t, root.PersistentFlags().Parse(append([]string{"--schema", w.db.Schema}, args...)))
	c, err := s.connect(context.Background())
	require.NoError(w.t, err)
	w.t.Cleanup(c.close)
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	p, err := newPage(s, c, o)
	require.NoError(w.t, err)
	srv := httptest.NewServer(p.handler())
	w.t.Cleanup(srv.Close)
	return srv
}

func (w *world) env() map[string]string {
	return map[string]string{"DATABASE_URL": w.db.URL, "KAFKA_BROKERS": strings.Join(w.kafka.Brokers, ",")}
}

// get fetches a page and returns its status and body.
func get(t *testing.T, srv *httptest.Server, path string) (*http.Response, string) {
	t.Helper()
	res, err := srv.Client().Get(srv.URL + path)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

func TestServeShowsConsumersAndLettersAndEscapesMessages(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	srv := w.servePage(w.env(), serveOptions{})

	res, body := get(t, srv, "/")
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "default-src 'self'")
	require.Contains(t, res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	require.Contains(t, body, w.name)
	require.Contains(t, body, w.topic)
	require.Contains(t, body, "lag 1")
	require.Contains(t, body, "permanent")
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)
	require.Contains(t, body, `href="/letters/`+bad1+`"`)
	require.Contains(t, body, "read-only")
	require.NotContains(t, body, "<form")
	require.NotContains(t, body, "<script")

	res, body = get(t, srv, "/letters/"+bad1)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "&lt;script&gt;alert(1)&lt;/script&gt;", "the value is shown as text")
	require.Contains(t, body, "&lt;b&gt;bold&lt;/b&gt;", "so is a header")
	require.NotContains(t, body, "<script")
	require.NotContains(t, body, "<b>bold")
	require.Contains(t, body, "partner said no")
	require.NotContains(t, body, "Redrive", "read-only: no action is offered")

	res, _ = get(t, srv, "/letters/999999999")
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	res, _ = get(t, srv, "/letters/x%3Cscript%3E")
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

// The page never shows the database URL, its password, or the Kafka
// password and SASL user, not even in the errors it shows.
func TestServeNeverShowsSecrets(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	const canary = "canary-s3cret-4711"
	const user = "canary-user-0815"
	u, err := url.Parse(w.db.URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), canary)
	env := w.env()
	env["DATABASE_URL"] = u.String()
	env["KAFKA_PASSWORD"] = canary
	// The broker does not do SASL: Kafka's side fails, and the page says
	// why, without the secrets.
	srv := w.servePage(env, serveOptions{allowActions: true}, "--kafka-sasl", "plain", "--kafka-user", user)
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)
	for _, path := range []string{"/", "/letters/" + bad1} {
		res, body := get(t, srv, path)
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		for _, secret := range []string{canary, user, u.String(), w.db.URL} {
			require.NotContains(t, body, secret, path)
		}
	}
	_, body := get(t, srv, "/")
	require.Contains(t, body, w.name, "the consumer is shown from Postgres")
	require.Contains(t, body, `class="error"`, "with why Kafka could not be read")
}

func TestServeRefusesANonLoopbackAddress(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "192.0.2.1:8080", "[::]:8080"} {
		err := checkListen(addr, false)
		require.ErrorContains(t, err, "--allow-remote", addr)
		require.NoError(t, checkListen(addr, true))
	}
	for _, addr := range []string{"127.0.0.1:8080", "[::1]:0", "localhost:8080"} {
		require.NoError(t, checkListen(addr, false))
	}
	require.ErrorContains(t, checkListen("8080", false), "host:port")
}
