package consumerstatus

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/pauses"
)

// PauseView is a pause, as status and the page show it.
type PauseView struct {
	Scope string `json:"scope"`
	// Topic and Partition name the scope for the page's actions: Topic ""
	// for every topic, Partition -1 for every partition of Topic.
	Topic     string    `json:"topic,omitempty"`
	Partition int       `json:"partition"`
	By        string    `json:"paused_by"`
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
	// Until is when the pause ends by itself; zero while it holds until
	// resumed.
	Until time.Time `json:"until,omitzero"`
}

func viewOfPause(p pauses.Pause) PauseView {
	v := PauseView{Scope: p.Scope.String(), Topic: p.Scope.Topic(), Partition: -1, By: p.By, Reason: p.Reason, Since: p.At, Until: p.Until}
	if n, ok := p.Scope.Partition(); ok {
		v.Partition = n
	}
	return v
}

// readPauses reads the consumer's pauses.
func readPauses(ctx context.Context, pool *pgxpool.Pool, schemaName, consumerName string) ([]pauses.Pause, error) {
	store, err := pauses.NewStore(schemaName)
	if err != nil {
		return nil, err
	}
	return store.List(ctx, pool, consumerName)
}

// addPauses puts the consumer's pauses on r, and on each partition the
// pause that holds it (the widest).
func addPauses(r *Report, list []pauses.Pause) {
	r.Pauses = []PauseView{}
	for _, p := range list {
		r.Pauses = append(r.Pauses, viewOfPause(p))
	}
	for i := range r.Partitions {
		ps := &r.Partitions[i]
		if p, ok := pauses.Covering(list, ps.Topic, ps.Partition); ok {
			v := viewOfPause(p)
			ps.Paused = &v
		}
	}
}

// ScopeFlags are the CLI's flags that name scope: the page names the
// command that does what it does.
func ScopeFlags(scope pauses.Scope) string {
	p, one := scope.Partition()
	switch {
	case scope.Topic() == "":
		return ""
	case !one:
		return " --topic " + scope.Topic()
	default:
		return fmt.Sprintf(" --topic %s --partition %d", scope.Topic(), p)
	}
}
