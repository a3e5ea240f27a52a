// Package opspage is the operator's page of kafkaonce as an http.Handler,
// for a server of your own: every consumer of a schema with its partitions
// (stored position, committed offset, lag, stops, holds, pauses) and its
// claims per minute over the last hour, dead letters by class with their
// letters per hour over the last day, suspect duplicates, fingerprint
// conflicts and the outbox's parked rows. kafkaonce serve serves the same
// page on its own.
//
// The page has no login: mount it behind your own authentication, and
// under a prefix of your router's:
//
//	page, err := opspage.NewHandler(pool, &opspage.Options{
//		Prefix:  "/ops/kafkaonce",
//		Brokers: []string{"kafka-1:9092"},
//	})
//	...
//	defer page.Close()
//	mux.Handle("/ops/kafkaonce/", requireOperator(page))
//
// Every link, form and redirect of the page starts with Options.Prefix.
// The handler takes requests with their full path (as above), or with the
// prefix already stripped (http.StripPrefix).
//
// It is read-only unless Options.AllowActions: then it offers to redrive
// a dead letter, mark one settled, un-park an outbox row, and pause or
// resume a consumer, each behind a confirmation page. An action's POST
// must come from the page's own origin (its Origin header naming the
// request's Host) and carry a token the page sets in a SameSite=Strict
// cookie and puts in its forms, so that another site cannot make an
// operator's browser act.
//
// What it shows is read at each request from Postgres and Kafka: it keeps
// nothing between requests, and a handler that starts again shows the
// same.
package opspage

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Options configure the page. Brokers is required.
type Options struct {
	// Schema is the Postgres schema of kafkaonce's tables. Defaults to
	// consumer.DefaultSchema.
	Schema string
	// Prefix is the path the page is mounted under, such as
	// "/ops/kafkaonce" (a trailing slash is dropped). Empty: the root.
	Prefix string
	// AllowActions offers redrive, settle, un-park, pause and resume.
	// Without it the page is read-only.
	AllowActions bool
	// ReadOnlyHint is what a read-only page answers an action, naming how
	// to allow them. Defaults to a sentence naming AllowActions.
	ReadOnlyHint string
	// Brokers, TLS and SASL reach the Kafka cluster the consumers read:
	// the page reads each partition's log bounds and the group's
	// committed offsets (docs/security.md for TLS and SASL).
	Brokers []string
	TLS     *tls.Config
	SASL    *kafkaconn.SASL
	// Groups maps a consumer's name to its group, for a consumer whose
	// group is neither recorded nor its name.
	Groups map[string]string
	// Operator names who pauses, for the pause's record ("paused by").
	// Defaults to "kafkaonce page, from " and the request's RemoteAddr:
	// behind your authentication, name the user.
	Operator func(r *http.Request) string
	// Logger receives the errors the page answers with. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Handler serves the page. Close releases its Kafka connections.
type Handler struct {
	page  *page
	admin *kafkaadmin.Admin
	// routes takes paths without the prefix; stripped takes them with it.
	routes, stripped http.Handler
}

// NewHandler returns the page for the consumers of pool's schema.
func NewHandler(pool *pgxpool.Pool, opts *Options) (*Handler, error) {
	if pool == nil {
		return nil, errors.New("opspage: the pool is nil: pass the *pgxpool.Pool of the consumers' database")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Schema == "" {
		o.Schema = kafkaoncetype.DefaultSchema
	}
	if err := schema.ValidateName(o.Schema); err != nil {
		return nil, fmt.Errorf("opspage: Options.Schema %w", err)
	}
	if o.Prefix != "" && (!strings.HasPrefix(o.Prefix, "/") || strings.ContainsAny(o.Prefix, "?#{}")) {
		return nil, fmt.Errorf("opspage: Options.Prefix %q is not a path: give one such as /ops/kafkaonce, or nothing for the root", o.Prefix)
	}
	if len(o.Brokers) == 0 {
		return nil, errors.New("opspage: Options.Brokers is empty: give the brokers the consumers read from (the page reads their log ends and committed offsets)")
	}
	if err := o.SASL.CheckOver(o.TLS); err != nil {
		return nil, fmt.Errorf("opspage: Options.SASL: %w", err)
	}
	if o.ReadOnlyHint == "" {
		o.ReadOnlyHint = "the page is read-only: its server must allow actions (opspage.Options.AllowActions) to redrive, settle, un-park, pause and resume"
	}
	if o.Operator == nil {
		o.Operator = func(r *http.Request) string { return "kafkaonce page, from " + r.RemoteAddr }
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	mech, err := kafkaclient.Mechanism(o.SASL)
	if err != nil {
		return nil, fmt.Errorf("opspage: Options.SASL: %w", err)
	}
	admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: o.Brokers, TLS: o.TLS, SASL: mech, ClientID: "kafkaonce-page"})
	if err != nil {
		return nil, fmt.Errorf("opspage: Options.Brokers: %w", err)
	}
	p, err := newPage(pool, admin, o)
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("opspage: %w", err)
	}
	routes := p.handler()
	h := &Handler{page: p, admin: admin, routes: routes, stripped: routes}
	if p.base != "" {
		h.stripped = http.StripPrefix(p.base, routes)
	}
	return h, nil
}

// ServeHTTP serves a request for the page, with its path under the prefix
// or with the prefix stripped already.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	base := h.page.base
	// The path as sent, escaped: an outbox id holds "/" and "." escaped,
	// which are no segments of the path.
	path, prefix := r.URL.EscapedPath(), (&url.URL{Path: base}).EscapedPath()
	rest, under := strings.CutPrefix(path, prefix)
	if base == "" || !under || rest != "" && rest[0] != '/' {
		rest, under = path, false // stripped already, or no prefix
	}
	if under && rest == "" {
		// The prefix without its slash: the page's links are relative
		// to the prefix with it.
		http.Redirect(w, r, prefix+"/", http.StatusMovedPermanently)
		return
	}
	if clean := cleanPath(rest); clean != rest {
		// Cleaned here, as net/http's mux would, but to a path under the
		// prefix: the page's own mux, behind the stripped prefix, would
		// redirect to the clean path without it.
		target := prefix + clean
		if r.URL.RawQuery != "" {
			target += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, target, http.StatusTemporaryRedirect)
		return
	}
	if under {
		h.stripped.ServeHTTP(w, r)
		return
	}
	h.routes.ServeHTTP(w, r)
}

// cleanPath is p with double slashes and dot segments resolved, keeping a
// trailing slash, as net/http's mux cleans a path.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// Close releases the page's Kafka connections. The pool is the caller's.
func (h *Handler) Close() { h.admin.Close() }
