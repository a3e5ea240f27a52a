package opspage

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// pauseScopeOf is the scope an action's query names: topic (none: every
// topic) and partition (none: every partition of the topic).
func pauseScopeOf(r *http.Request) (pauses.Scope, error) {
	q := r.URL.Query()
	topic, partition := q.Get("topic"), q.Get("partition")
	switch {
	case topic == "" && partition != "":
		return pauses.Scope{}, fmt.Errorf("a partition needs its topic")
	case topic == "":
		return pauses.All(), nil
	case partition == "":
		return pauses.Topic(topic), nil
	}
	n, err := strconv.Atoi(partition)
	if err != nil || n < 0 {
		return pauses.Scope{}, fmt.Errorf("partition %q is not a partition number", partition)
	}
	return pauses.Partition(topic, n), nil
}

// pauseAction is the page's pause or resume: confirm says what it will do
// (what and the equivalent command), change does it.
func (p *page) pauseAction(verb string, ask bool, what func(name string, scope pauses.Scope) []string,
	change func(r *http.Request, store *pauses.Store, name string, scope pauses.Scope) (bool, error), notice string) action {
	return action{
		confirm: func(w http.ResponseWriter, r *http.Request) (confirmData, bool) {
			scope, err := pauseScopeOf(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return confirmData{}, false
			}
			name := r.PathValue("name")
			title := fmt.Sprintf("%s %s of consumer %s?", verb, scope, name)
			return confirmData{chrome: chrome{Title: title}, Button: fmt.Sprintf("%s %s", verb, scope), Reason: ask, Lasting: ask, What: what(name, scope)}, true
		},
		do: func(r *http.Request) (string, error) {
			scope, err := pauseScopeOf(r)
			if err != nil {
				return "", &formError{err.Error()}
			}
			store, err := pauses.NewStore(p.schema)
			if err != nil {
				return "", err
			}
			ok, err := change(r, store, r.PathValue("name"), scope)
			if err != nil || !ok {
				return "unpaused", err
			}
			return notice, nil
		},
		back: func(*http.Request) string { return "/" },
	}
}

func (p *page) pause() action {
	return p.pauseAction("Pause", true,
		func(name string, scope pauses.Scope) []string {
			return []string{
				fmt.Sprintf("This pauses %s of consumer %s, as kafkaonce pause --consumer %s%s does.", scope, name, name, consumerstatus.ScopeFlags(scope)),
				"Every running member of the consumer obeys within a second or so: each partition covered finishes the transaction it is in, stops waiting between retries, then keeps its assignment, fetches nothing and holds no transaction open, across rebalances and restarts, until it is resumed.",
			}
		},
		func(r *http.Request, store *pauses.Store, name string, scope pauses.Scope) (bool, error) {
			by, reason := p.o.Operator(r), r.PostForm.Get("reason")
			lasting, err := pauseLasting(r.PostForm.Get("for"))
			switch {
			case err != nil:
				return false, err
			case lasting > 0:
				return store.PauseFor(r.Context(), p.pool, name, scope, lasting, by, reason)
			}
			return store.Pause(r.Context(), p.pool, name, scope, by, reason)
		}, "paused")
}

// pauseLasting reads the form's "for": how long a pause lasts, 0 for
// until resumed.
func pauseLasting(text string) (time.Duration, error) {
	text = strings.TrimSpace(text)
	if text == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(text)
	if err != nil || d < time.Second {
		return 0, &formError{fmt.Sprintf("for %q is not how long a pause lasts: give a duration of at least 1s, such as 30m or 2h, or nothing for a pause until resumed", text)}
	}
	return d, nil
}

func (p *page) resume() action {
	return p.pauseAction("Resume", false,
		func(name string, scope pauses.Scope) []string {
			return []string{
				fmt.Sprintf("This lifts the pause of %s of consumer %s, as kafkaonce resume --consumer %s%s does.", scope, name, name, consumerstatus.ScopeFlags(scope)),
				"The partitions no other pause covers fetch again from where they stopped, within a second or so: nothing is skipped, and nothing applied is applied again.",
			}
		},
		func(r *http.Request, store *pauses.Store, name string, scope pauses.Scope) (bool, error) {
			return store.Resume(r.Context(), p.pool, name, scope)
		}, "resumed")
}
