package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/opspage"
	"github.com/kafkaonce/kafkaonce/outbox"
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
	_, srv := w.servePageOf(env, o, args...)
	return srv
}

// servePageOf is servePage, with the page itself.
func (w *world) servePageOf(env map[string]string, o serveOptions, args ...string) (*page, *httptest.Server) {
	w.t.Helper()
	st := streams{in: strings.NewReader(""), out: io.Discard, err: io.Discard, terminal: func() bool { return false }, getenv: func(k string) string { return env[k] }}
	root, s := newRootSettings(st)
	require.NoError(w.t, root.PersistentFlags().Parse(append([]string{"--schema", w.db.Schema}, args...)))
	c, err := s.connectServe(context.Background())
	require.NoError(w.t, err)
	w.t.Cleanup(c.close)
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	p, err := newPage(s, c, o)
	require.NoError(w.t, err)
	w.t.Cleanup(p.close)
	srv := httptest.NewServer(p.handler())
	w.t.Cleanup(srv.Close)
	return p, srv
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
	// why, without the secrets. PLAIN puts the password on the wire, so
	// it is the one to try (allowed without TLS: the broker is loopback).
	srv := w.servePage(env, serveOptions{allowActions: true}, "--kafka-sasl", "plain", "--kafka-user", user, "--kafka-allow-plaintext-sasl")
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)
	for _, path := range []string{"/", "/letters/" + bad1, "/letters/" + bad1 + "/redrive"} {
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
		err := checkListen(addr, false, nil)
		require.ErrorContains(t, err, "--allow-remote", addr)
		require.NoError(t, checkListen(addr, true, []string{"ops.example.com:8080"}))
	}
	for _, addr := range []string{"0.0.0.0:8080", ":8080", "[::]:8080"} {
		require.ErrorContains(t, checkListen(addr, true, nil), "--host", "every interface names no host")
	}
	require.NoError(t, checkListen("192.0.2.1:8080", true, nil), "a specific address is its own name")
	for _, addr := range []string{"127.0.0.1:8080", "[::1]:0", "localhost:8080"} {
		require.NoError(t, checkListen(addr, false, nil))
	}
	require.ErrorContains(t, checkListen("8080", false, nil), "host:port")
}

// park writes an outbox row and parks it, as the relay does when its
// deliveries keep failing, and returns its id.
func (w *world) park() string {
	w.t.Helper()
	box, err := outbox.New(w.db.Schema)
	require.NoError(w.t, err)
	tx, err := w.db.Pool.Begin(context.Background())
	require.NoError(w.t, err)
	ids, err := box.Write(context.Background(), tx, outbox.Message{Destination: "orders", Key: []byte("k1"), Value: []byte("v1")})
	require.NoError(w.t, err)
	require.NoError(w.t, tx.Commit(context.Background()))
	w.db.Exec(w.t, `UPDATE `+w.db.Table("outbox")+` SET failed_at = now(), attempts = 9, last_error = 'partner said <i>no</i>' WHERE id = $1`, ids[0])
	return ids[0]
}

// post sends a form to the page as a browser would: from origin, with
// cookie (if any) and the form's token.
func post(t *testing.T, srv *httptest.Server, path, origin, cookie, token string, fields ...string) (*http.Response, string) {
	t.Helper()
	form := url.Values{"csrf": {token}}
	for i := 0; i+1 < len(fields); i += 2 {
		form.Set(fields[i], fields[i+1])
	}
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: opspage.CSRFCookie, Value: cookie})
	}
	client := *srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	res, err := client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, string(b)
}

// actionState returns a fingerprint of what the actions change.
func (w *world) actionState(parked string) string {
	var s string
	require.NoError(w.t, w.db.Pool.QueryRow(context.Background(), `SELECT
  (SELECT string_agg(id || ':' || coalesce(redrive_requested_at::text, '-') || ':' || coalesce(settled_at::text, '-'), ',' ORDER BY id) FROM `+w.db.Table("dead_letters")+`)
  || '|' || (SELECT coalesce(failed_at::text, 'delivering') FROM `+w.db.Table("outbox")+` WHERE id = $1)`, parked).Scan(&s))
	return s
}

func TestServeWithoutAllowActionsRefusesEveryAction(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	parked := w.park()
	srv := w.servePage(w.env(), serveOptions{})
	before := w.actionState(parked)
	bad1 := strconv.FormatInt(w.letterID("bad1"), 10)

	for _, path := range []string{"/", "/letters/" + bad1} {
		res, body := get(t, srv, path)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.NotContains(t, body, "<form", path)
		require.NotContains(t, body, "/redrive", path)
		require.NotContains(t, body, "/unpark", path)
		require.NotContains(t, body, "/pause", path)
		require.NotContains(t, body, "/resume", path)
		require.Empty(t, res.Cookies(), "no token is handed out")
	}
	for _, path := range []string{"/letters/" + bad1 + "/redrive", "/letters/" + bad1 + "/settle", "/outbox/" + parked + "/unpark",
		"/consumers/" + w.name + "/pause", "/consumers/" + w.name + "/resume?topic=t"} {
		res, body := get(t, srv, path)
		require.Equal(t, http.StatusForbidden, res.StatusCode, path)
		require.Contains(t, body, "--allow-actions")
		res, _ = post(t, srv, path, srv.URL, "guess", "guess")
		require.Equal(t, http.StatusForbidden, res.StatusCode, path)
	}
	for _, path := range []string{"/", "/letters/" + bad1} {
		res, _ := post(t, srv, path, srv.URL, "", "")
		require.Equal(t, http.StatusMethodNotAllowed, res.StatusCode, path)
	}
	require.Equal(t, before, w.actionState(parked))
}

// tokenOf reads the token of a confirmation page's form, and checks that
// the page set the same in its cookie.
func tokenOf(t *testing.T, res *http.Response, body string) string {
	t.Helper()
	_, rest, ok := strings.Cut(body, `name="csrf" value="`)
	require.True(t, ok, "the confirmation page has a form with the token")
	token, _, _ := strings.Cut(rest, `"`)
	var cookie *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == opspage.CSRFCookie {
			cookie = c
		}
	}
	require.NotNil(t, cookie)
	require.Equal(t, token, cookie.Value)
	require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	require.True(t, cookie.HttpOnly)
	return token
}

func TestServeActionsAreRefusedWithoutTheTokenOrFromAnotherOrigin(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	parked := w.park()
	srv := w.servePage(w.env(), serveOptions{allowActions: true})
	bad1, bad3 := w.letterID("bad1"), w.letterID("bad3")
	redrive := "/letters/" + strconv.FormatInt(bad1, 10) + "/redrive"

	res, body := get(t, srv, redrive)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Contains(t, body, "Redrive dead letter "+strconv.FormatInt(bad1, 10), "the confirmation names the action")
	require.Contains(t, body, w.name, "and the consumer that performs it")
	require.Contains(t, body, "&lt;script&gt;", "the value is shown as text here too")
	token := tokenOf(t, res, body)

	before := w.actionState(parked)
	for _, path := range []string{redrive, "/letters/" + strconv.FormatInt(bad3, 10) + "/settle", "/outbox/" + parked + "/unpark"} {
		for name, r := range map[string]struct{ origin, cookie, token string }{
			"no token":          {srv.URL, token, ""},
			"a wrong token":     {srv.URL, token, "x" + token},
			"no cookie":         {srv.URL, "", token},
			"a foreign origin":  {"http://evil.example", token, token},
			"no origin":         {"", token, token},
			"a foreign port":    {"http://127.0.0.1:1", token, token},
			"a stale token":     {srv.URL, "stale", "stale"},
			"a null origin":     {"null", token, token},
			"an origin in path": {srv.URL + ".evil.example", token, token},
		} {
			res, _ := post(t, srv, path, r.origin, r.cookie, r.token)
			require.Equal(t, http.StatusForbidden, res.StatusCode, "%s with %s", path, name)
		}
	}
	require.Equal(t, before, w.actionState(parked), "nothing changed")

	// A Host the page is not served as is refused, reads too.
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	require.NoError(t, err)
	req.Host = "rebound.example:8080"
	res, err = srv.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusMisdirectedRequest, res.StatusCode)

	// From the page, with its token, each action does what the CLI does.
	res, _ = post(t, srv, redrive, srv.URL, token, token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/letters/"+strconv.FormatInt(bad1, 10)+"?done=redrive", res.Header.Get("Location"))
	require.EqualValues(t, 1, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("dead_letters")+` WHERE id = $1 AND redrive_requested_at IS NOT NULL`, bad1))

	res, _ = post(t, srv, "/letters/"+strconv.FormatInt(bad3, 10)+"/settle", srv.URL, token, token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.EqualValues(t, 1, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("dead_letters")+` WHERE id = $1 AND settled_at IS NOT NULL`, bad3))
	_, body = get(t, srv, "/letters/"+strconv.FormatInt(bad3, 10)+"?done=settled")
	require.Contains(t, body, "Letter settled")
	require.NotContains(t, body, "Mark settled", "a settled letter offers no action")

	res, _ = post(t, srv, "/outbox/"+parked+"/unpark", srv.URL, token, token)
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "delivering", w.actionState(parked)[strings.LastIndex(w.actionState(parked), "|")+1:])

	// A settled letter is not redriven, even when asked for by id.
	w.fixed.Store(true)
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: w.handler, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	r, err := c.Redrive(context.Background(), consumer.RedriveFilter{IDs: []int64{bad1, bad3}})
	require.NoError(t, err)
	require.Equal(t, 1, r.Applied)
	require.Zero(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")+` WHERE message_id = 'bad3'`))
	res, _ = post(t, srv, "/letters/"+strconv.FormatInt(bad3, 10)+"/redrive", srv.URL, token, token)
	require.Equal(t, "/letters/"+strconv.FormatInt(bad3, 10)+"?done=unchanged", res.Header.Get("Location"))
}

// A partition stopped at a message shows on the page, with why, though
// the consumer that stopped it runs in another process; the next
// assignment clears it.
func TestServeShowsAStoppedPartitionAndWhy(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(6, "s")
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "s3" {
			return consumer.Permanent(errors.New("partner said <b>no</b>"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
		return err
	}
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: consumer.HandlerFunc(h), OnPermanentFailure: consumer.StopPartition,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("partition_runs")+` WHERE consumer = $1 AND stopped_at IS NOT NULL`, w.name) == 0 {
		require.True(t, time.Now().Before(deadline), "the partition did not stop")
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)

	srv := w.servePage(w.env(), serveOptions{})
	_, body := get(t, srv, "/")
	require.Contains(t, body, w.topic+"/1 stopped", "s3 is in partition 1")
	require.Contains(t, body, "partner said &lt;b&gt;no&lt;/b&gt;")
	require.Contains(t, body, `<tr class="stopped">`)
	resp, body := get(t, srv, "/readyz")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	var ready struct {
		Ready     bool            `json:"ready"`
		Consumers []consumerProbe `json:"consumers"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.True(t, ready.Ready)
	require.Contains(t, ready.Consumers, consumerProbe{Name: w.name, Stopped: 1}, "the readiness probe counts the stopped partition")
	resp, _ = get(t, srv, "/livez")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	out, errOut, code := w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "STOPPED "+w.topic+"/1 since ")

	// Fixed, and assigned again: the partition runs, and the mark is gone.
	w.consume(nil, 3)
	_, body = get(t, srv, "/")
	require.NotContains(t, body, "stopped</strong>")
	require.NotContains(t, body, `<tr class="stopped">`)
}

// The CLI commands behind the page's actions.
func TestDeadLettersSettleAndOutboxRetry(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	parked := w.park()
	bad3 := strconv.FormatInt(w.letterID("bad3"), 10)

	_, errOut, code := w.cli("dead-letters", "settle", bad3)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--consumer is required")
	out, errOut, code := w.cli("dead-letters", "settle", "--consumer", w.name, bad3, "999999")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "settled 1 of 2 letter(s)")
	out, _, _ = w.cli("dead-letters", "show", bad3)
	require.Contains(t, out, "state:         settled ")
	out, _, _ = w.cli("dead-letters", "list", "--consumer", w.name, "--pending")
	require.Contains(t, out, "bad1")
	require.NotContains(t, out, "bad3", "a settled letter is not open")
	out, _, _ = w.cli("dead-letters", "redrive", "--consumer", w.name, bad3)
	require.Contains(t, out, "requested a redrive of 0 letter(s)")
	out, _, _ = w.cli("status", "--consumer", w.name)
	require.Contains(t, out, "dead letters: 2 (1 open")

	out, errOut, code = w.cli("outbox", "parked")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "0 rows to deliver (0 of them waiting for a retry), 1 parked")
	require.Contains(t, out, parked)
	out, _, code = w.cli("outbox", "retry", parked)
	require.Equal(t, 0, code)
	require.Contains(t, out, "put 1 of 1 row(s) back")
	out, _, _ = w.cli("outbox", "parked")
	require.Contains(t, out, "1 rows to deliver (0 of them waiting for a retry), 0 parked")
}

// consumerProbe is a consumer of the readiness probe's answer.
type consumerProbe struct {
	Name    string `json:"name"`
	Stopped int    `json:"stopped_partitions"`
	Held    int    `json:"held_partitions"`
	Paused  int    `json:"pauses"`
}
