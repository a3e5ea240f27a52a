package idempotency_test

import (
	"context"
	"io"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// hostileHeaders are header maps a handler may hold, with what net/http
// sends of them: invalid names are dropped, and a name present with no
// values suppresses what net/http would add.
var hostileHeaders = []struct {
	name   string
	header http.Header
	absent []string // never in the first response nor in a replay
	// unstored are sent the first time and never replayed.
	unstored []string
	// reframed: the first response was chunked for its trailers, the
	// replay (with no trailer left to send) is framed by its length.
	reframed bool
}{
	{name: "a name with a line break and a cookie", header: http.Header{"X-Meta-ref\nSet-Cookie": {"session=attacker; Path=/"}}, absent: []string{"Set-Cookie", "X-Meta-Ref"}},
	{name: "a name with a colon and a space", header: http.Header{"X-A: B": {"c"}}, absent: []string{"X-A"}},
	{name: "a secret smuggled in a name", header: http.Header{"X-Ref\nX-Token": {"t0ps3cret"}}, absent: []string{"X-Token", "X-Ref"}},
	{name: "a secret in another case", header: http.Header{"x-token": {"t0ps3cret"}}, unstored: []string{"X-Token"}},
	{name: "a cookie", header: http.Header{"Set-Cookie": {"session=1"}}, unstored: []string{"Set-Cookie"}},
	{name: "a cookie as a trailer", header: http.Header{"Trailer:Set-Cookie": {"session=attacker"}}, absent: []string{"Set-Cookie"}, reframed: true},
	{name: "suppressed Content-Type and Date", header: http.Header{"Content-Type": nil, "Date": nil}, absent: []string{"Content-Type", "Date"}},
	{name: "a name with no values in another case", header: http.Header{"content-type": {}}},
	{name: "bytes that are not UTF-8", header: http.Header{"X-Raw": {"\xff\xfe caf\xe9"}}},
}

// A replay sends the headers the first response sent, and nothing else,
// whatever bytes the handler's header map holds; a header that is never
// stored (Set-Cookie, Config.SecretHeaders) is in neither. The same holds
// for the response of a phased run.
func TestAReplaySendsTheHeadersTheFirstResponseSent(t *testing.T) {
	t.Parallel()
	cfg := func() *idempotency.Config { return &idempotency.Config{SecretHeaders: []string{"X-Token"}} }
	serve := map[string]func(t *testing.T, h http.Header) string{
		"a handler": func(t *testing.T, h http.Header) string {
			p := newPayments(t, cfg())
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				for name, values := range h {
					w.Header()[name] = values
				}
				w.WriteHeader(http.StatusCreated)
				_, err := io.WriteString(w, "paid")
				return err
			}
			return p.srv.URL
		},
		"a phased run": func(t *testing.T, h http.Header) string {
			db := testenv.NewDB(t)
			c := cfg()
			_, url := servePhased(t, db.Pool, db.Schema, *c, idempotency.Flow{
				Name: "headers",
				Start: func(*http.Request, pgx.Tx, *idempotency.Run) (idempotency.Step, error) {
					return idempotency.Continue("answer", nil), nil
				},
				Phases: []idempotency.Phase{{From: "answer", Atomic: func(_ context.Context, _ pgx.Tx, _ *idempotency.Run) (idempotency.Step, error) {
					return idempotency.Respond(http.StatusCreated, h.Clone(), []byte("paid")), nil
				}}},
			})
			return url
		},
	}
	for via, start := range serve {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			for _, tc := range hostileHeaders {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					url := start(t, tc.header)
					first, body, err := postTo(t, http.DefaultClient, url, "k", `{}`)
					require.NoError(t, err)
					require.Equal(t, http.StatusCreated, first.StatusCode, body)
					again, replayed, err := postTo(t, http.DefaultClient, url, "k", `{}`)
					require.NoError(t, err)
					require.Equal(t, "true", again.Header.Get(idempotency.ReplayedHeader))
					require.Equal(t, body, replayed)
					for _, name := range tc.absent {
						require.Empty(t, first.Header.Values(name), "net/http sent no %s", name)
						require.Empty(t, again.Header.Values(name), "nor does the replay")
					}
					sent, resent := first.Header.Clone(), again.Header.Clone()
					for _, name := range tc.unstored {
						require.NotEmpty(t, first.Header.Values(name), "the first response sent %s", name)
						require.Empty(t, again.Header.Values(name), "a replay never does")
						sent.Del(name)
					}
					if tc.reframed {
						resent.Del("Content-Length")
					}
					resent.Del(idempotency.ReplayedHeader)
					if _, ok := tc.header["Date"]; !ok {
						sent.Del("Date") // net/http's own, of each response's time
						resent.Del("Date")
					}
					require.Equal(t, sent, resent, "the replay's headers are the first response's")
				})
			}
		})
	}
}

// A row stored in the earlier "Name: value" lines is replayed, and a
// header never to be stored is left out of it even there: the earlier
// form kept names raw, so a name with a line break ("X-A\nX-Token",
// dropped by net/http from the first response) reads back as lines of
// its own.
func TestARowOfTheEarlierFormNeverReplaysAnUnstoredHeader(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{SecretHeaders: []string{"X-Token"}})
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	// What the earlier encoding wrote for a Content-Type, and for
	// {"X-A\nX-Token": {"s3cret"}} and {"X-B\nSet-Cookie": {"a=b"}}.
	p.db.Exec(t, `UPDATE `+p.db.Table("idempotency_keys")+` SET headers = $1`,
		[]byte("Content-Type: application/json\nX-A\nX-Token: s3cret\nX-B\nSet-Cookie: a=b\n"))
	resp, body = p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), body)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "the row is read")
	require.Empty(t, resp.Header.Values("X-Token"), "a secret header is never replayed")
	require.Empty(t, resp.Header.Values("Set-Cookie"), "nor a cookie")
}
