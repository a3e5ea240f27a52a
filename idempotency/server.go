package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
)

// DB is the Postgres pool the requests' transactions run on:
// *pgxpool.Pool implements it. A request borrows a whole connection, so
// that BEGIN travels with the key's claim and COMMIT with the stored
// response: a keyed request costs the round trips of the same request
// without a key.
type DB interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// A Handler serves a request inside the transaction that claimed its key.
// It writes its rows with tx and its response with w, and returns nil; the
// response is then stored with the key, committed with the rows, and only
// then sent. A handler that returns an error, panics or answers with a
// server error (5xx) has its transaction rolled back: nothing it wrote and
// no response is kept, the key is free again, and a retry runs afresh. It
// must not commit or roll back tx (tx refuses, see ErrTxControlled), keep
// it, or cause effects outside Postgres directly: write an outbox row with
// tx instead.
type Handler interface {
	ServeIdempotent(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error
}

// ErrTxControlled is what the handler's transaction answers a Commit or
// Rollback with, and wrapped, a statement it did not send because it would
// end or reshape the transaction (COMMIT, ROLLBACK, BEGIN, SAVEPOINT,
// RELEASE, PREPARE TRANSACTION, SET TRANSACTION, in any text, among other
// statements or alone). The request has failed then, whatever the handler
// returns: its transaction rolls back and its key is free. For a
// savepoint, use tx.Begin.
var ErrTxControlled = txguard.ErrTxControlled

// ErrTxCallOver is what the handler's transaction, and what it gave out
// (a savepoint, large objects), answer every use with once the handler
// returned: a goroutine it left behind cannot write into a transaction
// that is no longer its request's, nor into whatever transaction the
// connection holds next.
var ErrTxCallOver = txguard.ErrCallOver

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error

// ServeIdempotent calls f(w, r, tx).
func (f HandlerFunc) ServeIdempotent(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
	return f(w, r, tx)
}

// Server wraps handlers so that a request retried with the same key is
// served once. Create one with New; it is safe for concurrent use.
type Server struct {
	db    DB
	cfg   Config
	keys  keys
	check *commitCheck
	log   *slog.Logger
}

// New validates cfg and returns a Server. The idempotency_keys table must
// exist (consumer.Migrate, or kafkaonce migrate). cfg may be nil for the
// defaults.
func New(db DB, cfg *Config) (*Server, error) {
	if db == nil {
		return nil, errors.New("idempotency: db must not be nil: pass a *pgxpool.Pool")
	}
	if cfg == nil {
		cfg = &Config{}
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	keys := newKeys(c.Schema)
	return &Server{db: db, cfg: c, keys: keys, check: newCommitCheck(c.Schema, keys.table), log: c.Logger}, nil
}

// Handle returns an http.Handler that serves h under the server's rules.
func (s *Server) Handle(h Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, h) })
}

// HandleFunc is Handle for a function.
func (s *Server) HandleFunc(f func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error) http.Handler {
	return s.Handle(HandlerFunc(f))
}

// serve answers one request (see the package documentation for the rules).
func (s *Server) serve(w http.ResponseWriter, r *http.Request, h Handler) {
	k, ok := s.admit(w, r, false)
	if ok {
		s.run(w, r, h, k)
	}
}

// admit reads a request's key, scope and body and fingerprints it. It
// answers the request itself (and returns false) when the key or the
// request is unusable; it returns nil and true for a request that runs
// without a key. required asks for a key whatever the method and
// Config.RequireKey.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, required bool) (*keyed, bool) {
	values := r.Header.Values(s.cfg.Header)
	required = required || s.cfg.RequireKey && slices.Contains(s.cfg.Methods, r.Method)
	switch {
	case len(values) == 0 && required:
		problem(w, s.cfg.ProblemTypes.KeyMissing, http.StatusBadRequest, "Idempotency key missing",
			fmt.Sprintf("%s requests need an %s header: make one key (a UUID) per operation and send it again on every retry of it", r.Method, s.cfg.Header), 0)
		return nil, false
	case len(values) == 0 || !required && !slices.Contains(s.cfg.Methods, r.Method):
		return nil, true
	case len(values) > 1:
		problem(w, s.cfg.ProblemTypes.KeyMissing, http.StatusBadRequest, "Idempotency key repeated", fmt.Sprintf("send one %s header, not %d", s.cfg.Header, len(values)), 0)
		return nil, false
	}
	key := values[0]
	if err := ValidateKey(key); err != nil {
		problem(w, s.cfg.ProblemTypes.KeyMissing, http.StatusBadRequest, "Idempotency key invalid", fmt.Sprintf("the %s header %v: use 1 to %d bytes of printable ASCII, such as a UUID", s.cfg.Header, err, MaxKeyLen), 0)
		return nil, false
	}
	scope, err := s.cfg.Scope(r)
	if err == nil {
		if verr := validateText(scope, MaxScopeLen); verr != nil {
			err = fmt.Errorf("the scope Config.Scope gave %v", verr)
		}
	}
	if err != nil {
		problem(w, aboutBlank, http.StatusForbidden, "No scope for the idempotency key", err.Error(), 0)
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem(w, aboutBlank, http.StatusRequestEntityTooLarge, "Request body too large", fmt.Sprintf("the body is longer than the %d bytes allowed", s.cfg.MaxBodyBytes), 0)
			return nil, false
		}
		problem(w, aboutBlank, http.StatusBadRequest, "Request body unreadable", err.Error(), 0)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	route := s.cfg.Route(r)
	if err := validateText(route, maxRouteLen); err != nil {
		problem(w, aboutBlank, http.StatusBadRequest, "Request route unusable", fmt.Sprintf("the route of this request %v: it cannot name an operation", err), 0)
		return nil, false
	}
	return &keyed{scope: scope, key: key, body: body, row: stored{
		method: r.Method, route: route, fingerprint: fingerprint(r, route, body, s.cfg.FingerprintHeaders)}}, true
}

// keyed is a request with a key: whose, and what it is.
type keyed struct {
	scope, key string
	body       []byte
	row        stored
}

// run serves r in a transaction: with a key, claimed first (and replayed,
// refused or waited for as the key says); without one, as is.
func (s *Server) run(w http.ResponseWriter, r *http.Request, h Handler, k *keyed) {
	ctx := r.Context()
	var got bool
	var row *stored
	t, err := s.begin(ctx, func(b *pgx.Batch, idle string) opening {
		if k == nil {
			return opening{}
		}
		return s.queueClaim(b, k, idle, s.cfg.InProgressWait, &got, &row)
	})
	if t == nil {
		s.unavailable(w, r, "begin", err)
		return
	}
	defer t.end(ctx)
	conn := t.conn
	switch {
	case err == nil && row != nil && row.run != nil:
		t.end(ctx)
		s.answerRunning(w, k, row)
		return
	case err == nil && row != nil && !row.expired:
		// Completed: the row never changes until it expires, so it is
		// answered whether or not this request got the key's lock, and
		// after the transaction ended, so that a slow reader holds neither
		// the lock nor a connection.
		t.end(ctx)
		s.answerStored(w, k, row)
		return
	case k != nil && (stillInProgress(ctx, err) || err == nil && !got):
		t.end(ctx)
		s.answerInProgress(w, stillRunning, s.cfg.RetryAfter)
		return
	case err != nil:
		t.end(ctx)
		s.unavailable(w, r, "claim the key", err)
		return
	}
	rec := newRecorder()
	if err := s.call(rec, r, h, t.tx); err != nil {
		t.end(ctx)
		s.log.Error("idempotency: the handler failed; its transaction was rolled back and its key is free again",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		requestFailed(w)
		return
	}
	status := rec.code()
	if !storable(status) {
		// Rolled back, not kept, sent as the handler wrote it: the client
		// is to try again, and its retry runs afresh.
		t.end(ctx)
		send(w, rec.header, status, rec.body.Bytes())
		return
	}
	// One round trip: the expired row gone, the key stored, COMMIT.
	b := s.closing()
	if k != nil {
		if row != nil {
			s.keys.queueForget(b, k.scope, k.key)
		}
		k.row.status, k.row.headers = status, encodeHeaders(rec.header, s.cfg.SecretHeaders)
		k.row.body = append([]byte{}, rec.body.Bytes()...) // never nil: stored NOT NULL
		s.keys.queueComplete(b, k.scope, k.key, &k.row, s.cfg.Retention)
	}
	queueCommit(b)
	err = conn.SendBatch(ctx, b).Close()
	t.committed = err == nil
	t.end(ctx)
	if err != nil {
		// Not committed, or (a lost reply) maybe committed: either way a
		// retry with the key finds out, and gets the response or runs
		// afresh.
		s.commitFailed(w, r, "handler", err)
		return
	}
	send(w, rec.header, status, rec.body.Bytes())
}

// idle is the idle_in_transaction_session_timeout of a request's
// transactions, in milliseconds: "" for the server's.
func (s *Server) idle() string {
	if s.cfg.IdleInTransactionTimeout == LeaveUnset {
		return ""
	}
	return strconv.FormatInt(s.cfg.IdleInTransactionTimeout.Milliseconds(), 10)
}

// begin borrows a connection and begins a transaction on it, in one round
// trip with the statements queue adds: the key's claim and read, say.
// READ COMMITTED and READ WRITE, whatever the session's defaults: a read
// after the key's lock must see what the previous holder committed, and
// the key must be stored. The transaction's
// commit check is opened with it: its last round trip starts with
// closing, so that only the server can commit it. queue gets the
// transaction's idle timeout ("" for the server's) and reports what it
// did of begin's work: set the timeout (the claim does, in its first
// statement), open the check (the claim does, unless it replays); begin
// does the rest. A nil requestTx is a connection not borrowed; with one,
// err is the round trip's, and the caller ends it.
func (s *Server) begin(ctx context.Context, queue func(b *pgx.Batch, idle string) opening) (*requestTx, error) {
	conn, err := s.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	t := &requestTx{conn: conn, tx: pipetx.New(conn.Conn())}
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE")
	idle := s.idle()
	done := queue(b, idle)
	if !done.opensCheck {
		s.check.queueOpen(b)
	}
	if !done.setsIdle && idle != "" {
		b.Queue(`SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, idle)
	}
	// What the handler sends runs in a savepoint: a statement of its that
	// fails aborts only the savepoint, so the transaction keeps its locks
	// (the key's, a run's row) until the handler returns and the
	// transaction ends. (An aborted transaction releases its locks at
	// once, not at its ROLLBACK.) COMMIT commits the savepoint with the
	// rest.
	b.Queue(handlerSavepoint)
	return t, conn.SendBatch(ctx, b).Close()
}

// handlerSavepoint opens the savepoint a request's user code runs in.
const handlerSavepoint = "SAVEPOINT kafkaonce_request"

// opening is what a queue function given to begin did of begin's work.
type opening struct{ setsIdle, opensCheck bool }

// queueClaim adds k's claim to b, the first round trip of its request's
// transaction (see keys.queueClaim), with the opening of the commit check
// after the key's read, unless the key is stored (see
// commitCheck.queueOpenUnlessStored).
func (s *Server) queueClaim(b *pgx.Batch, k *keyed, idle string, wait time.Duration, got *bool, row **stored) opening {
	s.keys.queueClaim(b, k.scope, k.key, idle, wait, got, row)
	s.check.queueOpenUnlessStored(b, k.scope, k.key)
	return opening{setsIdle: true, opensCheck: true}
}

// requestTx is a request's transaction on a borrowed connection.
type requestTx struct {
	conn            *pgxpool.Conn
	tx              *pipetx.Tx
	committed, done bool
}

// end rolls the transaction back unless it committed, and gives the
// connection back; once. A connection that broke is closed by pgx, and the
// pool replaces it.
func (t *requestTx) end(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	if !t.committed && t.conn.Conn().PgConn().TxStatus() != 'I' {
		_ = cleanup.Rollback(ctx, t.tx)
	}
	t.conn.Release()
}

// closing starts a transaction's last round trip: the close of its commit
// check, which fails when the transaction is no longer the one begin
// opened; the caller adds its statements and queueCommit.
func (s *Server) closing() *pgx.Batch {
	b := &pgx.Batch{}
	s.check.queueClose(b)
	return b
}

// errCommitRolledBack is a COMMIT the server answered with ROLLBACK: the
// transaction was aborted.
var errCommitRolledBack = errors.New("COMMIT rolled back: the transaction was aborted")

// queueCommit adds COMMIT to b, failing when the server rolls back instead.
func queueCommit(b *pgx.Batch) {
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return errCommitRolledBack
		}
		return nil
	})
}

// call runs the handler with tx guarded (see guarded).
func (s *Server) call(w http.ResponseWriter, r *http.Request, h Handler, tx pgx.Tx) error {
	return s.guarded(tx, "handler", func(g pgx.Tx) error { return h.ServeIdempotent(w, r, g) })
}

// guarded runs f, user code named who, with tx guarded: it may not commit
// or roll back, by a call or a statement, nor use tx once it returned. A
// panic, a misuse of tx or a statement that failed while f returned nil
// are errors.
func (s *Server) guarded(tx pgx.Tx, who string, f func(pgx.Tx) error) (err error) {
	g := txguard.WrapChecked(tx, s.check.guard)
	defer func() {
		g.Seal()
		if p := recover(); p != nil {
			err = fmt.Errorf("the %s panicked: %v", who, p)
		}
		switch {
		case err != nil:
		case g.Misused():
			err = fmt.Errorf("the %s committed or rolled back the transaction: the server does, after storing what it must", who)
		case tx.Conn().PgConn().TxStatus() == 'E':
			err = fmt.Errorf("a statement of the %s failed and it returned nil: the transaction is aborted", who)
		case tx.Conn().PgConn().TxStatus() != 'T':
			err = fmt.Errorf("the %s ended the transaction with a COMMIT or ROLLBACK statement: the server ends it, after storing what it must", who)
		}
	}()
	return f(g)
}

// answerStored answers a request whose key completed: the stored response
// when it is the same request, else 422.
func (s *Server) answerStored(w http.ResponseWriter, k *keyed, row *stored) {
	if s.refuseOther(w, k, row) {
		return
	}
	h, err := decodeHeaders(row.headers, s.cfg.SecretHeaders)
	if err != nil {
		// Not a byte of the row is replayed when part of it cannot be: a
		// response without its headers is another response.
		s.log.Error("idempotency: a stored response cannot be replayed", slog.String("scope", k.scope), slog.String("key", k.key), slog.String("error", err.Error()))
		problem(w, aboutBlank, http.StatusInternalServerError, "Stored response unreadable",
			"the response stored for this key cannot be read back; the request is not run again: ask the API's operators", 0)
		return
	}
	h.Set(ReplayedHeader, "true")
	send(w, h, row.status, row.body)
}

// answerRunning answers a request whose key's phased run is in progress
// and not to be taken over by this request: 422 when it is a different
// request, else 409 with Retry-After, at least until the run's lease ends.
func (s *Server) answerRunning(w http.ResponseWriter, k *keyed, row *stored) {
	if s.refuseOther(w, k, row) {
		return
	}
	s.answerInProgress(w, stillRunning, max(s.cfg.RetryAfter, row.run.leaseLeft))
}

// refuseOther answers 422 when row's key was used for a different request
// than k, and says whether it did.
func (s *Server) refuseOther(w http.ResponseWriter, k *keyed, row *stored) bool {
	if bytes.Equal(row.fingerprint, k.row.fingerprint) {
		return false
	}
	problem(w, s.cfg.ProblemTypes.KeyReused, http.StatusUnprocessableEntity, "Idempotency key reused",
		fmt.Sprintf("this key was used for a different request (%s %s, created %s): make a new key for each operation; a retry must repeat its request exactly",
			row.method, row.route, row.createdAt.UTC().Format("2006-01-02T15:04:05Z")), 0)
	return true
}

// commitFailed answers a request whose closing round trip failed: 500
// when the handler, user code named who, caused it (see handlersFault),
// else 503 (see unavailable). Either way nothing was kept.
func (s *Server) commitFailed(w http.ResponseWriter, r *http.Request, who string, err error) {
	if !handlersFault(err) {
		s.unavailable(w, r, "commit", err)
		return
	}
	s.log.Error("idempotency: the COMMIT of a request's transaction was refused because of what its user code did; it was rolled back and its key is free again",
		slog.String("code", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	requestFailed(w)
}

// requestFailed answers a request whose user code failed it: its
// transaction was rolled back, so the key is free for the retry.
func requestFailed(w http.ResponseWriter) {
	problem(w, aboutBlank, http.StatusInternalServerError, "Request failed", "the request failed and changed nothing: retry it with the same key", 0)
}

// unavailable answers a request the database failed: nothing was kept (or,
// after a COMMIT without a reply, a retry finds out what was), so the
// client retries with the same key.
func (s *Server) unavailable(w http.ResponseWriter, r *http.Request, what string, err error) {
	// Answered even when the request's context ended (a deadline set by a
	// router, a client gone): a silent handler would be a 200.
	s.log.Warn("idempotency: the database failed; the client may retry with the same key",
		slog.String("step", what), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("error", err.Error()))
	problem(w, aboutBlank, http.StatusServiceUnavailable, "Database unavailable", "the request could not be completed: retry it with the same key", s.cfg.RetryAfter)
}
