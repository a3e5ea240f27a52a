package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/user"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// pauseScopeFlags select what pause and resume act on.
type pauseScopeFlags struct {
	consumer, topic string
	partition       int
	// unrecorded allows a pause of a consumer that has recorded no
	// settings (it has not started against the schema yet).
	unrecorded bool
}

func (f *pauseScopeFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "the consumer's name (Config.Name)")
	cmd.Flags().StringVar(&f.topic, "topic", "", "a topic of the consumer (default: every topic)")
	cmd.Flags().IntVar(&f.partition, "partition", -1, "a partition of --topic (default: every partition)")
}

// scope is the scope the flags name, checked against what the consumer
// records it reads.
func (f *pauseScopeFlags) scope(cmd *cobra.Command) (pauses.Scope, error) {
	if f.consumer == "" {
		return pauses.Scope{}, errors.New("--consumer is required: the consumer's Config.Name, whose members obey the pause")
	}
	partitionGiven := cmd.Flags().Changed("partition")
	switch {
	case f.topic == "" && partitionGiven:
		return pauses.Scope{}, errors.New("--partition needs --topic: name the partition's topic")
	case f.topic == "":
		return pauses.All(), nil
	case !partitionGiven:
		return pauses.Topic(f.topic), nil
	case f.partition < 0:
		return pauses.Scope{}, fmt.Errorf("--partition %d is negative: partitions are numbered from 0; leave --partition out for every partition of the topic", f.partition)
	case f.partition > math.MaxInt32:
		return pauses.Scope{}, fmt.Errorf("--partition %d is past the largest partition number Kafka has (%d)", f.partition, math.MaxInt32)
	}
	return pauses.Partition(f.topic, f.partition), nil
}

// openPauses opens the database on the schema that knows consumerName, and
// its pauses, refusing a schema without the table. With check, it refuses
// a pause no member would obey: of a consumer that has recorded no
// settings (a mistyped name, one that never started here: unless
// --unrecorded), or of a topic the consumer does not record reading.
func (s *settings) openPauses(ctx context.Context, f *pauseScopeFlags, scope pauses.Scope, check bool) (*pgxpool.Pool, *pauses.Store, error) {
	if err := scope.Validate(); err != nil {
		return nil, nil, err
	}
	pool, store, err := openStore(ctx, s, f.consumer, pauses.NewStore)
	if err != nil {
		return nil, nil, err
	}
	if err := schema.RequireLatest(ctx, pool, s.schema); err != nil {
		pool.Close()
		return nil, nil, err
	}
	rec, err := s.loadRecord(ctx, pool, f.consumer)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	switch t := scope.Topic(); {
	case !check:
	case rec == nil && !f.unrecorded:
		pool.Close()
		return nil, nil, fmt.Errorf("consumer %q has recorded no settings in schema %s (is the name mistyped, or has it never started here?): a pause of %s it never reads would hold nothing; check --consumer, or pass --unrecorded to pause a consumer before its first start", f.consumer, s.schema, scope)
	case rec != nil && t != "" && !slices.Contains(rec.Topics, t):
		pool.Close()
		return nil, nil, fmt.Errorf("consumer %s records that it reads %q, not %q: check --topic (a pause of a topic it does not read would pause nothing)", f.consumer, rec.Topics, t)
	}
	return pool, store, nil
}

// changePause runs change (a pause or a resume) on the scope the flags
// name, and returns whether it changed anything and the consumer's pauses
// after it.
func (s *settings) changePause(cmd *cobra.Command, f *pauseScopeFlags, check bool, change func(context.Context, pauses.Querier, *pauses.Store, pauses.Scope) (bool, error)) (pauses.Scope, bool, []pauses.Pause, error) {
	scope, err := f.scope(cmd)
	if err != nil {
		return scope, false, nil, err
	}
	ctx := cmd.Context()
	pool, store, err := s.openPauses(ctx, f, scope, check)
	if err != nil {
		return scope, false, nil, err
	}
	defer pool.Close()
	changed, err := change(ctx, pool, store, scope)
	if err != nil {
		return scope, false, nil, err
	}
	list, err := store.List(ctx, pool, f.consumer)
	return scope, changed, list, err
}

type pauseResult struct {
	Consumer string    `json:"consumer"`
	Scope    string    `json:"scope"`
	Changed  bool      `json:"changed"`
	Since    time.Time `json:"since,omitzero"`
	// Until is when the pause ends by itself; zero while it holds until
	// resumed.
	Until  time.Time `json:"until,omitzero"`
	By     string    `json:"paused_by,omitempty"`
	Reason string    `json:"reason,omitempty"`
	// StillPaused is the wider pause that still holds a scope resumed.
	StillPaused string `json:"still_paused_by,omitempty"`
}

func pauseCmd(s *settings) *cobra.Command {
	var f pauseScopeFlags
	var reason, by string
	var lasting time.Duration
	cmd := &cobra.Command{
		Use:   "pause",
		Short: "Pause a consumer, one of its topics or a partition, until resume or for a time",
		Long: `pause stores a pause of a consumer (every topic), of one of its topics
(--topic) or of one partition (--topic and --partition). Every running member
of the consumer reads its pauses each second: a paused partition finishes the
batch it is in, then keeps its assignment, fetches nothing and holds no
transaction open, and a message waiting between retries stops waiting. The
pause holds across rebalances and restarts until kafkaonce resume lifts it,
or, with --for, until that long from now by the database server's clock: the
members fetch again within a second or so of its end. status and the page
show it, with who paused it, when, why and until when.

Pausing a scope paused already keeps that pause (its time, author and reason),
lengthened to end --for from now if that is later; without --for, it then
holds until resumed.

  kafkaonce pause --consumer notifications --topic emails --reason "mail partner down"
  kafkaonce pause --consumer notifications --topic emails --for 30m --reason "partner maintenance window"
  kafkaonce resume --consumer notifications --topic emails`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if by == "" {
				by = whoAmI()
			}
			if cmd.Flags().Changed("for") && lasting < time.Second {
				return fmt.Errorf("--for %s is too short: give how long the pause lasts, at least 1s (e.g. --for 30m), or leave --for out for a pause until resumed", lasting)
			}
			scope, changed, list, err := s.changePause(cmd, &f, true, func(ctx context.Context, q pauses.Querier, store *pauses.Store, scope pauses.Scope) (bool, error) {
				if lasting > 0 {
					return store.PauseFor(ctx, q, f.consumer, scope, lasting, by, reason)
				}
				return store.Pause(ctx, q, f.consumer, scope, by, reason)
			})
			if err != nil {
				return err
			}
			r := pauseResult{Consumer: f.consumer, Scope: scope.String(), Changed: changed}
			if i := slices.IndexFunc(list, func(p pauses.Pause) bool { return p.Scope == scope }); i >= 0 {
				r.Since, r.Until, r.By, r.Reason = list[i].At, list[i].Until, list[i].By, list[i].Reason
			}
			return s.emit(r, func(w io.Writer) {
				if changed {
					fmt.Fprintf(w, "paused %s of consumer %s %s; its running members stop fetching within a second or so\n", r.Scope, f.consumer, pauseEnd(r.Until))
					return
				}
				fmt.Fprintf(w, "%s of consumer %s was paused already, since %s by %s", r.Scope, f.consumer, r.Since.UTC().Format(time.RFC3339), orDash(r.By))
				if r.Reason != "" {
					fmt.Fprintf(w, ": %s", r.Reason)
				}
				fmt.Fprintf(w, "; it holds %s\n", pauseEnd(r.Until))
			})
		},
	}
	f.register(cmd)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for status and the page")
	cmd.Flags().DurationVar(&lasting, "for", 0, "end the pause by itself after this long, by the database's clock (e.g. 30m, 2h; default: until resumed)")
	cmd.Flags().BoolVar(&f.unrecorded, "unrecorded", false, "pause a consumer that has recorded no settings yet (before its first start)")
	cmd.Flags().StringVar(&by, "by", "", `who pauses (default "kafkaonce pause by USER@HOST")`)
	return cmd
}

func resumeCmd(s *settings) *cobra.Command {
	var f pauseScopeFlags
	cmd := &cobra.Command{
		Use:   "resume",
		Short: "Lift a pause that kafkaonce pause (or Consumer.Pause, or the page) stored",
		Long: `resume lifts the pause of the scope given, the same --topic and --partition
that pause was given: the partitions no other pause covers fetch again, from
where they stopped, within a second or so. A partition is paused while any
pause covers it (its own, its topic's, the consumer's), so resume says when a
wider pause still holds the scope.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// A resume lifts whatever was stored, checked or not.
			scope, changed, list, err := s.changePause(cmd, &f, false, func(ctx context.Context, q pauses.Querier, store *pauses.Store, scope pauses.Scope) (bool, error) {
				return store.Resume(ctx, q, f.consumer, scope)
			})
			if err != nil {
				return err
			}
			r := pauseResult{Consumer: f.consumer, Scope: scope.String(), Changed: changed}
			var wider []pauses.Pause
			for _, p := range list {
				if covers(p.Scope, scope) {
					wider = append(wider, p)
				}
			}
			if len(wider) > 0 {
				r.StillPaused = wider[0].Scope.String()
			}
			return s.emit(r, func(w io.Writer) {
				switch {
				case changed:
					fmt.Fprintf(w, "resumed %s of consumer %s", r.Scope, f.consumer)
				default:
					fmt.Fprintf(w, "%s of consumer %s had no pause of its own; nothing changed", r.Scope, f.consumer)
				}
				if r.StillPaused != "" {
					fmt.Fprintf(w, "; the pause of %s still holds it: kafkaonce resume --consumer %s%s", r.StillPaused, f.consumer, scopeFlags(wider[0].Scope))
				}
				fmt.Fprintln(w)
			})
		},
	}
	f.register(cmd)
	return cmd
}

// pauseEnd says until when a pause with end until holds.
func pauseEnd(until time.Time) string {
	if until.IsZero() {
		return "until resumed"
	}
	return "until " + until.UTC().Format(time.RFC3339) + " (or resumed before)"
}

// covers reports whether wide, a pause's scope, covers all of narrow.
func covers(wide, narrow pauses.Scope) bool {
	switch p, one := narrow.Partition(); {
	case wide == narrow:
		return false
	case wide.Topic() == "":
		return true
	case narrow.Topic() == "":
		return false
	case one:
		return wide.Covers(narrow.Topic(), p)
	default:
		_, wideOne := wide.Partition()
		return wide.Topic() == narrow.Topic() && !wideOne
	}
}

// scopeFlags are the flags that name scope.
var scopeFlags = consumerstatus.ScopeFlags

// whoAmI names the operator for a pause's record.
func whoAmI() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("kafkaonce pause by %s@%s", name, host)
}
