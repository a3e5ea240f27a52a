package opspage

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
	"github.com/kafkaonce/kafkaonce/outbox"
)

//go:embed web
var webFiles embed.FS

// page is the operator's page. It reads through the same stores, and acts
// through the same calls, as the CLI commands.
type page struct {
	pool   *pgxpool.Pool
	admin  *kafkaadmin.Admin
	schema string
	o      Options
	// base is o.Prefix without its trailing slash: every link and
	// redirect starts with it.
	base      string
	letters   *deadletter.Store
	claims    *dedupe.Store
	positions *offsets.Store
	outbox    *outbox.Outbox
	tmpl      *template.Template
	// token guards the actions against cross-site requests: it is made
	// once per handler, set in a SameSite=Strict cookie and put in every
	// form, and a POST must carry both.
	token string
	log   *slog.Logger
	// secrets are the passwords an error shown must not carry: the
	// database's and Kafka's.
	secrets []string
}

// Limits of what one page shows; the CLI lists the rest.
const (
	pageLetters  = 200
	pageSuspects = 20
	pageParked   = 100
	// previewBytes bounds a message value or key shown on a letter's page.
	previewBytes = 4 << 10
)

func newPage(pool *pgxpool.Pool, admin *kafkaadmin.Admin, o Options) (*page, error) {
	p := &page{pool: pool, admin: admin, schema: o.Schema, o: o, base: strings.TrimSuffix(o.Prefix, "/"), log: o.Logger}
	if pw := pool.Config().ConnConfig.Password; pw != "" {
		p.secrets = append(p.secrets, pw)
	}
	if o.SASL != nil && o.SASL.Password != "" {
		p.secrets = append(p.secrets, o.SASL.Password)
	}
	var err error
	if p.letters, err = deadletter.NewStore(o.Schema); err != nil {
		return nil, fmt.Errorf("Options.Schema: %w", err)
	}
	p.claims, _ = dedupe.NewStore(o.Schema)
	p.positions, _ = offsets.NewStore(o.Schema)
	p.outbox, _ = outbox.New(o.Schema)
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	p.token = base64.RawURLEncoding.EncodeToString(b)
	p.tmpl, err = template.New("").Funcs(template.FuncMap{
		"when":     when,
		"optional": consumerstatus.Optional,
		"preview":  preview,
		"assigned": consumerstatus.AssignedText,
		// segment escapes a value put in one segment of a URL's path
		// (an outbox id is free text: "/", "?" and "#" included).
		"segment": url.PathEscape,
		"backlog": consumerstatus.BacklogCount,
		"age":     age,
		"state":   func(l deadletter.Letter) string { return consumerstatus.LetterState(&l) },
	}).ParseFS(webFiles, "web/*.html")
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (p *page) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", p.overview)
	mux.HandleFunc("GET /letters/{id}", p.letter)
	mux.HandleFunc("GET /style.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		http.ServeFileFS(w, r, webFiles, "web/style.css")
	})
	p.actions(mux)
	p.probes(mux)
	return p.guard(mux)
}

// requestTimeout bounds the reads and the action of one request.
const requestTimeout = 10 * time.Second

// guard sets the security headers of every response, and bounds the
// request's time.
func (p *page) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		// A database or broker that stops answering (a connection left
		// open, nothing coming back) ends the request with an error page,
		// instead of holding it, and its connection, for ever.
		ctx, cancel := context.WithTimeout(r.Context(), requestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// chrome is what every page shows around its content.
type chrome struct {
	// Base starts every link: the page's mount prefix, "" at the root.
	Base    string
	Title   string
	Schema  string
	Actions bool
	Token   string
	Notice  string
	Errors  []string
}

func (p *page) chrome(r *http.Request, title string) chrome {
	return chrome{Base: p.base, Title: title, Schema: p.schema, Actions: p.o.AllowActions, Token: p.token, Notice: notices[r.URL.Query().Get("done")]}
}

// cookiePath is the path the token's cookie is scoped to: prefix, or, when
// prefix holds a character a URL escapes, the part of it before the
// segment that holds the first. Browsers compare a cookie's path with the
// request's path as sent (escaped), other clients (Go's cookie jar) with
// it unescaped, and net/http drops the bytes of a Path that are not ASCII:
// a path that is the same both ways matches for all.
func cookiePath(prefix string) string {
	escaped := (&url.URL{Path: prefix}).EscapedPath()
	if escaped == prefix {
		return prefix
	}
	i := 0
	for i < len(prefix) && i < len(escaped) && prefix[i] == escaped[i] {
		i++
	}
	return prefix[:strings.LastIndexByte(prefix[:i], '/')+1]
}

// render writes a page, and the cookie that an action's POST must send back.
func (p *page) render(w http.ResponseWriter, name string, data any) {
	if p.o.AllowActions {
		http.SetCookie(w, &http.Cookie{Name: CSRFCookie, Value: p.token, Path: cookiePath(p.base + "/"), HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	var b strings.Builder
	if err := p.tmpl.ExecuteTemplate(&b, name, data); err != nil {
		p.fail(w, err)
		return
	}
	_, _ = w.Write([]byte(b.String()))
}

// fail answers with an error the page can show: without secrets.
func (p *page) fail(w http.ResponseWriter, err error) {
	p.log.Error("kafkaonce page", slog.String("error", p.redact(err)))
	http.Error(w, p.redact(err), http.StatusInternalServerError)
}

// redact removes the database password and the Kafka password from an
// error the page shows.
func (p *page) redact(err error) string { return p.redactText(err.Error()) }

// redactText removes them from a text the page shows that came from
// elsewhere, such as a stopped partition's reason.
func (p *page) redactText(text string) string {
	for _, s := range p.secrets {
		text = strings.ReplaceAll(text, s, "xxxxx")
	}
	return text
}

type consumerView struct {
	Name   string
	Report consumerstatus.Report
	Lag    int64
	// Chart is the consumer's claims per minute over the last hour.
	Chart template.HTML
	// Stopped are the partitions stopped at a message, with why; Held
	// those an open transaction holds back.
	Stopped []consumerstatus.Partition
	Held    []consumerstatus.Partition
	// Err says why Kafka's side (or the status as a whole) could not be
	// read; the rows from Postgres are shown anyway.
	Err string
}

type suspectView struct {
	Consumer string
	dedupe.Suspect
}

type letterClass struct {
	Class   deadletter.Class
	Letters []deadletter.Letter
}

type overviewData struct {
	chrome
	Consumers []consumerView
	Classes   []deadletter.ClassCount
	// LetterCharts are the letters of each class per hour, over a day.
	LetterCharts []template.HTML
	Letters      []letterClass
	MoreLetters  bool
	Suspects     []suspectView
	Conflicts    []deadletter.Letter
	// Backlog is read from the outbox table at each request, not from a
	// relay: the page shows it with no relay running, or many.
	Backlog outbox.Backlog
	Parked  []outbox.Parked
}

func (p *page) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	d := overviewData{chrome: p.chrome(r, "kafkaonce")}
	pool := p.pool
	now := time.Now()
	names, err := p.positions.Consumers(ctx, pool)
	if err != nil {
		p.fail(w, err)
		return
	}
	records, recErr := consumerstatus.Records(ctx, pool, p.schema)
	// A share group's consumer stores no positions: its record names it.
	for _, rec := range records {
		if consumerstatus.IsShare(&rec) && !slices.Contains(names, rec.Consumer) {
			names = append(names, rec.Consumer)
		}
	}
	slices.Sort(names)
	classes, err := lettersPerClass(ctx, pool, p.schema, names, now)
	if err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	for _, cs := range classes {
		d.LetterCharts = append(d.LetterCharts, chart(cs.series, "letters of class "+cs.class+" per hour", "last 24 hours"))
	}
	if recErr != nil {
		d.Errors = append(d.Errors, p.redact(recErr))
	}
	recordOf := map[string]*recorded.Settings{}
	for i := range records {
		recordOf[records[i].Consumer] = &records[i]
	}
	for _, name := range names {
		rec := recordOf[name]
		cv := consumerView{Name: name}
		rep, err := consumerstatus.Read(ctx, pool, p.admin, p.schema, name, consumerstatus.GroupOf(p.o.Groups[name], rec, name), rec, nil)
		if err != nil {
			cv.Err = p.redact(err)
		} else if lines := rep.KafkaProblems(); len(lines) > 0 {
			cv.Err = p.redactText(strings.Join(lines, "; "))
		}
		for i := range rep.Partitions {
			ps := &rep.Partitions[i]
			cv.Lag += max(ps.Lag, 0) // -1: unknown
			if ps.StoppedAt != nil {
				ps.StopReason = p.redactText(ps.StopReason)
				cv.Stopped = append(cv.Stopped, *ps)
			}
			if ps.HeldAt != nil {
				cv.Held = append(cv.Held, *ps)
			}
		}
		cv.Report = rep
		if claims, err := claimsPerMinute(ctx, pool, p.schema, name, now); err != nil {
			d.Errors = append(d.Errors, p.redact(err))
		} else {
			cv.Chart = chart(claims, "claims per minute", "last hour")
		}
		d.Consumers = append(d.Consumers, cv)
		suspects, err := p.claims.Suspects(ctx, pool, name, pageSuspects)
		if err != nil {
			d.Errors = append(d.Errors, p.redact(err))
		}
		for _, sp := range suspects {
			d.Suspects = append(d.Suspects, suspectView{Consumer: name, Suspect: sp})
		}
	}
	if d.Classes, err = p.letters.CountByClass(ctx, pool); err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	pending, err := p.letters.List(ctx, pool, deadletter.Filter{Pending: true, Limit: pageLetters + 1, WithoutPayload: true})
	if err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	if len(pending) > pageLetters {
		pending, d.MoreLetters = pending[:pageLetters], true
	}
	d.Letters = byClass(pending)
	if d.Conflicts, err = p.letters.List(ctx, pool, deadletter.Filter{Class: deadletter.ClassConflict, Limit: pageLetters, WithoutPayload: true}); err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	if d.Backlog, err = p.outbox.Backlog(ctx, pool); err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	if d.Parked, err = p.outbox.Parked(ctx, pool, pageParked); err != nil {
		d.Errors = append(d.Errors, p.redact(err))
	}
	p.render(w, "overview.html", d)
}

// byClass groups letters by class, keeping their order within a class.
func byClass(ls []deadletter.Letter) []letterClass {
	idx := map[deadletter.Class]int{}
	var out []letterClass
	for _, l := range ls {
		i, ok := idx[l.Class]
		if !ok {
			i = len(out)
			idx[l.Class] = i
			out = append(out, letterClass{Class: l.Class})
		}
		out[i].Letters = append(out[i].Letters, l)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Class < out[j].Class })
	return out
}

type letterData struct {
	chrome
	Letter deadletter.Letter
	// Open is true while the letter can be redriven or settled.
	Open bool
}

func (p *page) letter(w http.ResponseWriter, r *http.Request) {
	l, ok := p.findLetter(w, r)
	if !ok {
		return
	}
	d := letterData{chrome: p.chrome(r, fmt.Sprintf("dead letter %d", l.ID)), Letter: l, Open: letterOpen(&l)}
	p.render(w, "letter.html", d)
}

// findLetter reads the letter the path names, or answers that it cannot.
func (p *page) findLetter(w http.ResponseWriter, r *http.Request) (deadletter.Letter, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.Error(w, "a dead letter's id is a number", http.StatusNotFound)
		return deadletter.Letter{}, false
	}
	l, err := p.letters.Get(r.Context(), p.pool, id)
	if errors.Is(err, deadletter.ErrNotFound) {
		http.Error(w, fmt.Sprintf("no dead letter %d", id), http.StatusNotFound)
		return deadletter.Letter{}, false
	}
	if err != nil {
		p.fail(w, err)
		return deadletter.Letter{}, false
	}
	return l, true
}

// letterOpen reports whether a letter waits for an operator: neither
// redriven nor settled.
func letterOpen(l *deadletter.Letter) bool { return l.RedrivenAt == nil && l.SettledAt == nil }

func when(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "-"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v == nil {
			return "-"
		}
		return when(*v)
	}
	return fmt.Sprint(t)
}

// age shows how long a row has waited, to the second.
func age(d time.Duration) string {
	if d < time.Second {
		return "under a second"
	}
	return d.Round(time.Second).String()
}

// preview shows bytes as text when they are printable UTF-8, else as
// base64, cut at previewBytes. The template escapes it: a value holding
// markup is shown, never run.
func preview(b []byte) string {
	if b == nil {
		return "(none)"
	}
	cut := ""
	if len(b) > previewBytes {
		cut = fmt.Sprintf(" … (%d bytes in all)", len(b))
		b = b[:previewBytes]
		for len(b) > 0 && !utf8.Valid(b) && len(b) > previewBytes-utf8.UTFMax {
			b = b[:len(b)-1]
		}
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) && !unicode.IsSpace(r) }) < 0 {
		return string(b) + cut
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b) + cut
}
