package main

import (
	"log/slog"
	"net"
	"net/http"
	"strings"

	"github.com/kafkaonce/kafkaonce/opspage"
)

// page is the operator's page (package opspage) as kafkaonce serve serves
// it: at the root, behind a check of the Host header.
type page struct {
	o serveOptions
	h *opspage.Handler
}

// readOnly is what the page answers an action without --allow-actions.
const readOnly = "the page is read-only: start kafkaonce serve with --allow-actions to redrive, settle, un-park, pause and resume"

func newPage(s *settings, c *conn, o serveOptions) (*page, error) {
	tlsCfg, auth, err := s.kafkaAuth(c.kafka)
	if err != nil {
		return nil, err
	}
	h, err := opspage.NewHandler(c.pool, &opspage.Options{
		Schema:       s.schema,
		AllowActions: o.allowActions,
		ReadOnlyHint: readOnly,
		Brokers:      c.kafka.brokers,
		TLS:          tlsCfg,
		SASL:         auth,
		Groups:       o.groups,
		Operator:     func(r *http.Request) string { return "kafkaonce serve, from " + r.RemoteAddr },
		Logger:       slog.New(slog.NewTextHandler(s.st.err, nil)),
	})
	if err != nil {
		return nil, err
	}
	return &page{o: o, h: h}, nil
}

func (p *page) close() { p.h.Close() }

// handler refuses a Host the page is not served as, and serves the page:
// a page on loopback must not answer a DNS name that an attacker's site
// rebinds to 127.0.0.1.
func (p *page) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.servedAs(r.Host) {
			http.Error(w, "unexpected Host header: open the page by the address kafkaonce serve printed", http.StatusMisdirectedRequest)
			return
		}
		p.h.ServeHTTP(w, r)
	})
}

// servedAs reports whether host (a request's Host) names this server: a
// loopback address or localhost, or with --allow-remote a specific
// --listen host or one of the --host names. Listening on every interface
// names no host: only --host does.
func (p *page) servedAs(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.Trim(hostport, "[]")
	}
	if isLoopback(host) {
		return true
	}
	if !p.o.allowRemote {
		return false
	}
	for _, h := range p.o.hosts {
		if strings.EqualFold(hostport, h) || strings.EqualFold(host, strings.Trim(h, "[]")) {
			return true
		}
	}
	listen, _, _ := net.SplitHostPort(p.o.listen)
	return !everyInterface(listen) && strings.EqualFold(host, listen)
}

// everyInterface reports whether a listen host listens on every interface.
func everyInterface(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}
