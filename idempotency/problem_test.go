package idempotency_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// problemOf decodes a problem details body (RFC 9457).
func problemOf(t *testing.T, resp *http.Response, body string) (typ string, status int) {
	t.Helper()
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &p), body)
	require.Equal(t, resp.StatusCode, p.Status)
	return p.Type, p.Status
}

// The answers the draft standard for the header asks to link to
// documentation (section 2.7: a key missing, a request in progress, a key
// reused) carry a problem type that is a link: kafkaonce's docs/http.md
// by default, the API's own when configured. Other answers are
// about:blank.
func TestProblemTypesLinkToDocumentation(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  idempotency.ProblemTypes
		want idempotency.ProblemTypes
	}{
		"by default": {want: idempotency.DefaultProblemTypes},
		"configured": {
			cfg: idempotency.ProblemTypes{KeyMissing: "https://api.example/errors/key-missing", KeyReused: "https://api.example/errors/key-reused"},
			want: idempotency.ProblemTypes{KeyMissing: "https://api.example/errors/key-missing", KeyReused: "https://api.example/errors/key-reused",
				InProgress: idempotency.DefaultProblemTypes.InProgress},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, &idempotency.Config{RequireKey: true, ProblemTypes: tc.cfg})
			typeOf := func(resp *http.Response, body string) string {
				typ, _ := problemOf(t, resp, body)
				return typ
			}
			resp, body := p.post("", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			require.Equal(t, tc.want.KeyMissing, typeOf(resp, body), "no key")
			resp, body = p.post("not printable: é", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode)
			require.Equal(t, tc.want.KeyMissing, typeOf(resp, body), "an invalid key")

			resp, body = p.post("k1", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, body)
			resp, body = p.post("k1", "alice", `{"amount":2}`)
			require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
			require.Equal(t, tc.want.KeyReused, typeOf(resp, body), "a key reused")

			started, release := p.holdCalls()
			first := p.postInBackground("k2", "alice", `{"amount":1}`)
			<-started
			resp, body = p.post("k2", "alice", `{"amount":1}`)
			close(release)
			require.Equal(t, http.StatusConflict, resp.StatusCode)
			require.Equal(t, tc.want.InProgress, typeOf(resp, body), "a request in progress")
			require.Equal(t, http.StatusCreated, (<-first).status)

			p.handle = func(http.ResponseWriter, *http.Request, pgx.Tx) error { return errors.New("the handler fails") }
			resp, body = p.post("k3", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
			require.Equal(t, "about:blank", typeOf(resp, body), "any other answer")
		})
	}
}

// A problem type that is not an absolute URI is refused, naming the field.
func TestProblemTypesMustBeAbsoluteURIs(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	_, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema,
		ProblemTypes: idempotency.ProblemTypes{InProgress: "/errors/in-progress", KeyReused: "::"}})
	require.ErrorContains(t, err, `idempotency: Config.ProblemTypes.InProgress must be an absolute URI, such as a link to your API's documentation of the answer (got "/errors/in-progress")`)
	require.ErrorContains(t, err, `Config.ProblemTypes.KeyReused must be an absolute URI`)
	require.NotContains(t, err.Error(), "KeyMissing")
}
