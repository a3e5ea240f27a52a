// Package idempotency serves HTTP requests that carry an Idempotency-Key
// once, however often a client retries them, on the same Postgres store
// as the consumer.
//
// A client that times out cannot tell a request that failed from one that
// succeeded with a lost response, so it retries; with a key per operation,
// sent again on every retry, the server runs the operation once and
// answers every retry with the first response. The key is claimed, the
// operation's rows written and the response stored in ONE transaction, so
// a crash at any point leaves all of it or none of it: the retry gets the
// stored response, or runs afresh.
//
//	srv, err := idempotency.New(pool, &idempotency.Config{
//		Scope: func(r *http.Request) (string, error) { return clientID(r) },
//	})
//	mux.Handle("POST /v1/payments", srv.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
//		// write the payment and an outbox row with tx, then the response to w
//	}))
//
// # The rules
//
// A request of Config.Methods (POST and PATCH by default) with a key runs
// in a transaction that first takes the key (scope and key: one client's
// key never touches another's). Then:
//
//   - a key never seen, or expired: the handler runs; its response is
//     stored with the key and committed with its rows, and only then sent;
//   - a key completed for the same request (method, route, body and the
//     headers named in Config.FingerprintHeaders): the stored status,
//     headers and body are sent again byte for byte, with
//     Idempotent-Replayed: true;
//   - a key completed for a different request: 422, problem+json;
//   - a key whose request is still running: 409 with Retry-After, or,
//     with Config.InProgressWait, a wait for it to finish and its response;
//   - a key that is empty, longer than MaxKeyLen or not printable ASCII:
//     400; no key: 400 under Config.RequireKey, else the request runs
//     without one.
//
// What is stored: a response the handler decided (2xx, 3xx, 4xx), except
// those that tell the client to try again (408, 409, 425, 429). Those, a
// handler error, a panic, a 5xx, a statement that failed, or a database
// that fails roll everything back: nothing is kept, the key is free, and
// the client's retry runs afresh. The transaction is READ COMMITTED. Set-Cookie and
// Config.SecretHeaders are never stored. A running request holds an
// advisory lock on its key, not a row, so there is nothing to clean up
// after a crash. Keys are kept for Config.Retention (24 hours by default).
//
// # Calls outside Postgres: phases
//
// A request that calls a system outside Postgres (a card provider) cannot
// be one transaction. Server.Phased serves it as a Flow: Start records the
// intent with the key's claim, then phases run one after the other, Atomic
// ones in a transaction of their own, External ones outside any, and each
// commits a recovery point. A run that stops part way (a crash, a failed
// call) is resumed from its last recovery point by the next retry after its
// lease ran out, or by the recovery sweep (Phased.Recover): it never starts
// over, and never stays in progress for ever. An External phase may run
// more than once, so it sends Run.DerivedKey as the provider's idempotency
// key.
//
// # The client
//
// Transport is the calling side: an http.RoundTripper that gives each POST
// or PATCH one key, sends it on every retry, and retries only what may
// pass (no response, 5xx, 429, 409), with backoff, Retry-After, the
// context's deadline and a retry budget respected.
//
// See docs/http.md in the repository for how the key, the outbox and the
// consumer fit together.
package idempotency
