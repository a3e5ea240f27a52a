package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Defaults for Config fields left at their zero value.
const (
	DefaultHeader       = "Idempotency-Key"
	DefaultRetention    = 24 * time.Hour
	DefaultMaxBodyBytes = 1 << 20
	DefaultRetryAfter   = time.Second
	// DefaultIdleInTransactionTimeout bounds a request's transaction left
	// idle (see Config.IdleInTransactionTimeout).
	DefaultIdleInTransactionTimeout = time.Minute
	// MaxKeyLen bounds a key, in bytes.
	MaxKeyLen = 255
	// MaxScopeLen bounds a scope, in bytes.
	MaxScopeLen = 255
)

// LeaveUnset, as Config.IdleInTransactionTimeout, leaves the server's
// setting in force.
const LeaveUnset time.Duration = -1

// ReplayedHeader marks a replayed response: its value is "true".
const ReplayedHeader = "Idempotent-Replayed"

// Config configures a Server. Every field has a default, named in its doc.
type Config struct {
	// Schema is where the idempotency_keys table lives (see
	// consumer.Migrate, or kafkaonce migrate). Defaults to the consumer's
	// default schema.
	Schema string

	// Header is the request header that carries the key. Defaults to
	// DefaultHeader.
	Header string

	// Methods are the methods whose requests take a key. Others pass
	// straight to the handler, in a transaction of their own. Defaults to
	// POST and PATCH.
	Methods []string

	// RequireKey refuses (400) a request of one of Methods that comes
	// without a key. When false, such a request runs without a key, as an
	// ordinary request would: a retry of it runs again.
	RequireKey bool

	// Scope says whose key a request's is: a client, an account, taken
	// from your own authentication. The same key in two scopes is two keys,
	// so one client can never replay another's response. An error answers
	// the request 403 with its text. Defaults to one scope for all
	// requests.
	Scope func(r *http.Request) (string, error)

	// Route names the operation a request asks for, part of its
	// fingerprint. Defaults to the URL's escaped path and query: a key
	// first used with ?dry_run=true is refused for the real request. It
	// must be valid UTF-8 without NUL, at most 2,048 bytes; another is
	// answered 400.
	Route func(r *http.Request) string

	// FingerprintHeaders are request headers that are part of a request's
	// fingerprint besides its method, route and body (a tenant, an API
	// version): a retry that changes one is refused (422).
	FingerprintHeaders []string

	// SecretHeaders are response headers never stored, so never replayed
	// (Set-Cookie never is either).
	SecretHeaders []string

	// Retention is how long a completed key is kept, and replayed. After
	// it the key is free again. Defaults to DefaultRetention, longer than
	// any sane client's retries.
	Retention time.Duration

	// MaxBodyBytes bounds a request's body (it is read whole, to
	// fingerprint it). A longer one is answered 413. Defaults to
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64

	// InProgressWait is how long a request waits for another with the same
	// key, still running, to finish, and then replays its response. After
	// it, or at once when zero (the default), the request is answered 409
	// with Retry-After.
	InProgressWait time.Duration

	// RetryAfter is the Retry-After of a 409. Defaults to
	// DefaultRetryAfter.
	RetryAfter time.Duration

	// IdleInTransactionTimeout ends a request's transaction the server
	// sees idle for this long: one whose client connection was lost with
	// its COMMIT (a network fault can leave the server waiting for hours),
	// which would keep its key "in progress" all that time. Keep it longer
	// than any pause of a handler between two statements. Defaults to
	// DefaultIdleInTransactionTimeout; LeaveUnset leaves the server's.
	IdleInTransactionTimeout time.Duration

	// ProblemTypes are the "type" URIs of the problem details of a 400
	// for a missing or unusable key, a 409 for a request in progress and
	// a 422 for a reused key: links a client's developer follows to learn
	// what the answer means. Point them at your API's documentation. A
	// field left empty defaults to DefaultProblemTypes', sections of
	// kafkaonce's docs/http.md.
	ProblemTypes ProblemTypes

	// Logger gets handler errors, panics and failed commits. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	out := *c
	if out.Schema == "" {
		out.Schema = schema.DefaultName
	}
	if out.Header == "" {
		out.Header = DefaultHeader
	}
	if out.Methods == nil {
		out.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		out.Methods = slices.Clone(out.Methods)
		for i, m := range out.Methods {
			out.Methods[i] = strings.ToUpper(m) // methods are case-sensitive, and sent upper-case
		}
	}
	if out.Scope == nil {
		out.Scope = func(*http.Request) (string, error) { return "", nil }
	}
	if out.Route == nil {
		out.Route = func(r *http.Request) string {
			if r.URL.RawQuery != "" {
				return r.URL.EscapedPath() + "?" + r.URL.RawQuery
			}
			return r.URL.EscapedPath()
		}
	}
	out.FingerprintHeaders = slices.Clone(out.FingerprintHeaders)
	out.SecretHeaders = slices.Clone(out.SecretHeaders)
	if out.Retention == 0 {
		out.Retention = DefaultRetention
	}
	if out.MaxBodyBytes == 0 {
		out.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if out.RetryAfter == 0 {
		out.RetryAfter = DefaultRetryAfter
	}
	if out.IdleInTransactionTimeout == 0 {
		out.IdleInTransactionTimeout = DefaultIdleInTransactionTimeout
	}
	out.ProblemTypes = out.ProblemTypes.withDefaults()
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

func (c *Config) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("idempotency: Config."+format, args...))
	}
	if err := schema.ValidateName(c.Schema); err != nil {
		bad("Schema %v", err)
	}
	if len(c.Methods) == 0 {
		bad("Methods must name at least one method (or be nil for POST and PATCH)")
	}
	if c.Retention < time.Minute {
		bad("Retention must be at least 1m (got %v)", c.Retention)
	}
	if c.MaxBodyBytes < 0 {
		bad("MaxBodyBytes must not be negative (got %d)", c.MaxBodyBytes)
	}
	if c.InProgressWait < 0 || c.InProgressWait > time.Minute || c.InProgressWait > 0 && c.InProgressWait < time.Millisecond {
		bad("InProgressWait must be 0 or between 1ms and 1m (got %v): it is a lock_timeout, counted in milliseconds", c.InProgressWait)
	}
	if c.IdleInTransactionTimeout != LeaveUnset && c.IdleInTransactionTimeout < time.Second {
		bad("IdleInTransactionTimeout must be at least 1s, or LeaveUnset (got %v)", c.IdleInTransactionTimeout)
	}
	if c.RetryAfter < time.Second {
		bad("RetryAfter must be at least 1s, the unit of the header (got %v)", c.RetryAfter)
	}
	c.ProblemTypes.validate(bad)
	return errors.Join(errs...)
}
