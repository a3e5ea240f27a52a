package opspage

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// CSRFCookie is the cookie that carries the page's token back with an
// action's POST. It is set for the page's prefix only.
const CSRFCookie = "kafkaonce_csrf"

// action is one thing the page can change: what its confirmation page says
// it will do, and the call that does it, the same as the CLI command's.
type action struct {
	// confirm reads what the action is on and says what it will do; ok
	// is false once it has answered (not found, nothing to do).
	confirm func(w http.ResponseWriter, r *http.Request) (c confirmData, ok bool)
	// do performs it and returns the notice to show, by its key.
	do func(r *http.Request) (notice string, err error)
	// back is where to go after it.
	back func(r *http.Request) string
}

// actions registers the actions: a GET of the path asks for confirmation,
// a POST performs it. Unless actions are allowed both are refused, and no
// page links to them.
func (p *page) actions(mux *http.ServeMux) {
	for path, a := range map[string]action{
		"/letters/{id}/redrive":    p.redrive(),
		"/letters/{id}/settle":     p.settle(),
		"/outbox/{id}/unpark":      p.unpark(),
		"/consumers/{name}/pause":  p.pause(),
		"/consumers/{name}/resume": p.resume(),
	} {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) {
			if !p.o.AllowActions {
				http.Error(w, p.o.ReadOnlyHint, http.StatusForbidden)
				return
			}
			d, ok := a.confirm(w, r)
			if !ok {
				return
			}
			d.chrome = p.chrome(r, d.Title) // the title confirm chose, and the rest
			d.Back = p.base + a.back(r)
			p.render(w, "confirm.html", d)
		})
		mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) {
			if !p.o.AllowActions {
				http.Error(w, p.o.ReadOnlyHint, http.StatusForbidden)
				return
			}
			if err := p.checkPost(w, r); err != nil {
				http.Error(w, err.Error(), http.StatusForbidden)
				return
			}
			notice, err := a.do(r)
			var bad *formError
			switch {
			case errors.As(err, &bad):
				http.Error(w, bad.Error(), http.StatusBadRequest)
				return
			case err != nil:
				p.fail(w, err)
				return
			}
			http.Redirect(w, r, p.base+a.back(r)+"?done="+notice, http.StatusSeeOther)
		})
	}
}

// formError is an action's refusal of what its request asked: the asker
// can fix it (400), where any other error is the page's (500).
type formError struct{ msg string }

func (e *formError) Error() string { return e.msg }

// checkPost refuses a POST that did not come from a form of this page: it
// must come from this origin, and carry the process's token both in the
// form and in the SameSite=Strict cookie the page set.
func (p *page) checkPost(w http.ResponseWriter, r *http.Request) error {
	origin := r.Header.Get("Origin")
	u, err := url.Parse(origin)
	if origin == "" || err != nil || u.Host != r.Host {
		return fmt.Errorf("refused: the request comes from origin %q, not from this page (%s)", origin, r.Host)
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		return errors.New("refused: the form could not be read")
	}
	c, err := r.Cookie(CSRFCookie)
	if err != nil || !sameToken(c.Value, p.token) || !sameToken(r.PostForm.Get("csrf"), p.token) {
		return errors.New("refused: the form's token is missing or stale (the server restarted?): reload the page and try again")
	}
	return nil
}

func sameToken(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// notices are the outcomes an action redirects to; only these texts are
// shown, so a link cannot make the page say anything else.
var notices = map[string]string{
	"redrive":   "Redrive requested: a running consumer of that name performs it within seconds. Reload to see the outcome.",
	"settled":   "Letter settled: it will not be redriven.",
	"unparked":  "Row un-parked: the relay delivers it again, with fresh attempts.",
	"unchanged": "Nothing changed: it was redriven, settled or un-parked meanwhile.",
	"paused":    "Paused: the consumer's running members stop fetching it within a second or so.",
	"resumed":   "Resumed: the partitions no other pause holds fetch again within a second or so.",
	"unpaused":  "Nothing changed: it was paused or resumed meanwhile.",
}

// confirmData is the confirmation page of an action.
type confirmData struct {
	chrome
	// What says what the action will do; Button names it.
	What   []string
	Button string
	Back   string
	// Letter is shown when the action is on a dead letter.
	Letter *deadletter.Letter
	// Reason asks for the action's reason, and Lasting for how long it
	// lasts (a pause's).
	Reason, Lasting bool
}

func (p *page) letterBack(r *http.Request) string { return "/letters/" + r.PathValue("id") }

// openLetter reads the letter for an action on it, and answers when it is
// not open any more.
func (p *page) openLetter(w http.ResponseWriter, r *http.Request) (deadletter.Letter, bool) {
	l, ok := p.findLetter(w, r)
	if ok && !letterOpen(&l) {
		http.Redirect(w, r, p.base+p.letterBack(r)+"?done=unchanged", http.StatusSeeOther)
		return l, false
	}
	return l, ok
}

func (p *page) redrive() action {
	return action{
		confirm: func(w http.ResponseWriter, r *http.Request) (confirmData, bool) {
			l, ok := p.openLetter(w, r)
			return confirmData{chrome: chrome{Title: fmt.Sprintf("Redrive dead letter %d?", l.ID)}, Letter: &l, Button: fmt.Sprintf("Redrive dead letter %d", l.ID),
				What: []string{
					fmt.Sprintf("This asks the running consumer %s to run the message at %s/%d/%d through its handler again, as kafkaonce dead-letters redrive --consumer %s %d does.", l.Consumer, l.Topic, l.Partition, l.Offset, l.Consumer, l.ID),
					"It re-claims the message id in the handler's transaction: redriving twice applies the message once. If the handler fails again the letter stays, with the error.",
				}}, ok
		},
		do: func(r *http.Request) (string, error) {
			l, err := p.letters.Get(r.Context(), p.pool, idOf(r))
			if err != nil {
				return "", err
			}
			n, err := p.letters.RequestRedrive(r.Context(), p.pool, l.Consumer, []int64{l.ID})
			return changed(n, "redrive"), err
		},
		back: p.letterBack,
	}
}

func (p *page) settle() action {
	return action{
		confirm: func(w http.ResponseWriter, r *http.Request) (confirmData, bool) {
			l, ok := p.openLetter(w, r)
			return confirmData{chrome: chrome{Title: fmt.Sprintf("Mark dead letter %d settled?", l.ID)}, Letter: &l, Button: fmt.Sprintf("Mark dead letter %d settled", l.ID),
				What: []string{
					fmt.Sprintf("This closes the letter of the message at %s/%d/%d without running it, as kafkaonce dead-letters settle --consumer %s %d does: for a message whose effect was made by other means, or is not wanted.", l.Topic, l.Partition, l.Offset, l.Consumer, l.ID),
					"A settled letter is never redriven (a pending redrive request is withdrawn). It stays listed, as the record of the message.",
				}}, ok
		},
		do: func(r *http.Request) (string, error) {
			l, err := p.letters.Get(r.Context(), p.pool, idOf(r))
			if err != nil {
				return "", err
			}
			n, err := p.letters.Settle(r.Context(), p.pool, l.Consumer, []int64{l.ID})
			return changed(n, "settled"), err
		},
		back: p.letterBack,
	}
}

func (p *page) unpark() action {
	return action{
		confirm: func(w http.ResponseWriter, r *http.Request) (confirmData, bool) {
			id := r.PathValue("id")
			return confirmData{chrome: chrome{Title: "Un-park outbox row " + id + "?"}, Button: "Un-park outbox row " + id,
				What: []string{
					fmt.Sprintf("This puts the parked outbox row %s back to be delivered, with fresh attempts, as kafkaonce outbox retry %s does. Do it once the cause of its failures is fixed.", id, id),
					"It is then delivered after any later rows of its key already delivered.",
				}}, true
		},
		do: func(r *http.Request) (string, error) {
			n, err := p.outbox.Retry(r.Context(), p.pool, r.PathValue("id"))
			return changed(n, "unparked"), err
		},
		back: func(*http.Request) string { return "/" },
	}
}

// idOf is the letter id of an action's path; one that is not a number,
// whole ("5abc" is not 5), finds no letter.
func idOf(r *http.Request) int64 {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		return 0
	}
	return id
}

func changed(n int64, notice string) string {
	if n == 0 {
		return "unchanged"
	}
	return notice
}
