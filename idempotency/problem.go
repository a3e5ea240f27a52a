package idempotency

import (
	"cmp"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ProblemTypes are the "type" URIs of the problem details (RFC 9457) the
// server answers with where the draft standard for the Idempotency-Key
// header (draft-ietf-httpapi-idempotency-key-header, section 2.7) asks
// for a link to documentation: a client's developer follows the link to
// learn what went wrong and what to change. Every other answer's type is
// about:blank, its title the status's meaning.
type ProblemTypes struct {
	// KeyMissing is the type of a 400 for a request that needs a key and
	// has none, has more than one, or has one that is not a valid key.
	KeyMissing string
	// InProgress is the type of a 409 for a request whose key's first
	// request is still running.
	InProgress string
	// KeyReused is the type of a 422 for a key used before for another
	// request.
	KeyReused string
}

// problemDocs is the page that documents the answers.
const problemDocs = "https://github.com/kafkaonce/kafkaonce/blob/main/docs/http.md"

// DefaultProblemTypes are the sections of kafkaonce's docs/http.md that
// say what each answer means and what a client does about it.
var DefaultProblemTypes = ProblemTypes{
	KeyMissing: problemDocs + "#idempotency-key-missing",
	InProgress: problemDocs + "#request-in-progress",
	KeyReused:  problemDocs + "#idempotency-key-reused",
}

// aboutBlank is the type of a problem that needs no more than its status.
const aboutBlank = "about:blank"

// withDefaults fills in the types left empty.
func (p ProblemTypes) withDefaults() ProblemTypes {
	return ProblemTypes{
		KeyMissing: cmp.Or(p.KeyMissing, DefaultProblemTypes.KeyMissing),
		InProgress: cmp.Or(p.InProgress, DefaultProblemTypes.InProgress),
		KeyReused:  cmp.Or(p.KeyReused, DefaultProblemTypes.KeyReused),
	}
}

// validate reports each type that is not an absolute URI.
func (p ProblemTypes) validate(bad func(format string, args ...any)) {
	for _, f := range []struct{ name, uri string }{{"KeyMissing", p.KeyMissing}, {"InProgress", p.InProgress}, {"KeyReused", p.KeyReused}} {
		if u, err := url.Parse(f.uri); err != nil || !u.IsAbs() {
			bad("ProblemTypes.%s must be an absolute URI, such as a link to your API's documentation of the answer (got %q)", f.name, f.uri)
		}
	}
}

// problem answers with an application/problem+json body (RFC 9457) of
// type typ that says what went wrong and what the client should do.
func problem(w http.ResponseWriter, typ string, status int, title, detail string, retryAfter time.Duration) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{typ, title, status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((retryAfter+time.Second-1)/time.Second)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// answerInProgress tells a client that a request with its key is still
// running: 409, to retry after retryAfter, saying why in detail.
func (s *Server) answerInProgress(w http.ResponseWriter, detail string, retryAfter time.Duration) {
	problem(w, s.cfg.ProblemTypes.InProgress, http.StatusConflict, "Request in progress", detail, retryAfter)
}

// stillRunning is the detail of a 409 for a request whose key's request
// is running.
const stillRunning = "a request with this key is still running: retry after a while with the same key to get its response"
