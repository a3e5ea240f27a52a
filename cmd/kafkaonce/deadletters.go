package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
)

// letters opens the database and the dead-letter store, on the schema
// that knows consumerName ("" for none; see settleSchema).
func (s *settings) letters(ctx context.Context, consumerName string) (*pgxpool.Pool, *deadletter.Store, error) {
	return openStore(ctx, s, consumerName, deadletter.NewStore)
}

// openStore opens the database and a store on the schema's tables, made
// by newStore. The schema is settled for consumerName ("" for none).
func openStore[T any](ctx context.Context, s *settings, consumerName string, newStore func(schemaName string) (T, error)) (*pgxpool.Pool, T, error) {
	var none T
	pool, err := s.open(ctx, consumerName)
	if err != nil {
		return nil, none, err
	}
	store, err := newStore(s.schema)
	if err != nil {
		pool.Close()
		return nil, none, err
	}
	return pool, store, nil
}

func deadLettersCmd(s *settings) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "dead-letters",
		Aliases: []string{"dl"},
		Short:   "List, show, redrive and settle dead letters",
	}
	cmd.AddCommand(dlListCmd(s), dlShowCmd(s), dlRedriveCmd(s), dlSettleCmd(s))
	return cmd
}

type letterFilterFlags struct {
	consumer, topic, class string
	partition              int
	pending                bool
	limit                  int
}

func (f *letterFilterFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "the consumer's name (Config.Name)")
	cmd.Flags().StringVar(&f.topic, "topic", "", "only letters from this topic")
	cmd.Flags().IntVar(&f.partition, "partition", -1, "only letters from this partition (with --topic)")
	cmd.Flags().StringVar(&f.class, "class", "", "only letters of this class (permanent, panic, retries_exhausted, crashed, ...)")
	cmd.Flags().IntVar(&f.limit, "limit", 100, "at most this many letters")
}

func (f *letterFilterFlags) filter() deadletter.Filter {
	return deadletter.Filter{Consumer: f.consumer, Topic: f.topic, Partition: f.partition, HasPartition: f.topic != "" && f.partition >= 0,
		Class: deadletter.Class(f.class), Pending: f.pending, Limit: f.limit}
}

func dlListCmd(s *settings) *cobra.Command {
	var f letterFilterFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, store, err := s.letters(ctx, f.consumer)
			if err != nil {
				return err
			}
			defer pool.Close()
			letters, err := store.List(ctx, pool, f.filter())
			if err != nil {
				return err
			}
			return s.emit(letterList(letters), func(w io.Writer) {
				if len(letters) == 0 {
					fmt.Fprintln(w, "no dead letters")
					return
				}
				var rows [][]string
				for _, l := range letters {
					rows = append(rows, []string{strconv.FormatInt(l.ID, 10), l.Consumer, fmt.Sprintf("%s/%d/%d", l.Topic, l.Partition, l.Offset),
						orDash(l.MessageID), string(l.Class), strconv.Itoa(l.Attempts), l.DeadLetteredAt.UTC().Format(time.RFC3339), letterState(&l)})
				}
				table(w, "ID\tCONSUMER\tSOURCE\tMESSAGE ID\tCLASS\tATTEMPTS\tDEAD-LETTERED\tSTATE", rows)
			})
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&f.pending, "pending", false, "only open letters: neither redriven nor settled")
	return cmd
}

// letterList keeps JSON output an array even when empty.
func letterList(ls []deadletter.Letter) []deadletter.Letter {
	if ls == nil {
		return []deadletter.Letter{}
	}
	return ls
}

// letterState is how the lists and the page say where a letter stands.
var letterState = consumerstatus.LetterState

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func dlShowCmd(s *settings) *cobra.Command {
	return &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter whole: message, headers, error",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("ID must be a dead letter's number (got %q)", args[0])
			}
			ctx := cmd.Context()
			pool, store, err := s.letters(ctx, "")
			if err != nil {
				return err
			}
			defer pool.Close()
			l, err := store.Get(ctx, pool, id)
			if err != nil {
				return err
			}
			return s.emit(l, func(w io.Writer) {
				fmt.Fprintf(w, "dead letter %d of consumer %s\n", l.ID, l.Consumer)
				fmt.Fprintf(w, "source:        %s/%d/%d\n", l.Topic, l.Partition, l.Offset)
				fmt.Fprintf(w, "message id:    %s\n", orDash(l.MessageID))
				if !l.MessageTime.IsZero() {
					fmt.Fprintf(w, "message time:  %s\n", l.MessageTime.UTC().Format(time.RFC3339Nano))
				}
				fmt.Fprintf(w, "class:         %s\n", l.Class)
				fmt.Fprintf(w, "attempts:      %d (first failed %s, last %s)\n", l.Attempts, l.FirstFailedAt.UTC().Format(time.RFC3339), l.LastFailedAt.UTC().Format(time.RFC3339))
				fmt.Fprintf(w, "dead-lettered: %s\n", l.DeadLetteredAt.UTC().Format(time.RFC3339))
				fmt.Fprintf(w, "state:         %s\n", letterState(&l))
				if l.RedriveError != "" {
					fmt.Fprintf(w, "redrive error: %s\n", l.RedriveError)
				}
				fmt.Fprintf(w, "key:           %s\n", printable(l.Key))
				fmt.Fprintf(w, "value:         %s\n", printable(l.Value))
				for _, h := range l.Headers {
					fmt.Fprintf(w, "header:        %s = %s\n", h.Key, printable(h.Value))
				}
				fmt.Fprintf(w, "error:\n%s\n", indent(l.Error))
			})
		},
	}
}

// printable shows bytes as text when they are printable UTF-8, else as
// base64.
func printable(b []byte) string {
	if b == nil {
		return "(none)"
	}
	if utf8.Valid(b) && strings.IndexFunc(string(b), func(r rune) bool { return !unicode.IsPrint(r) && !unicode.IsSpace(r) }) < 0 {
		return strconv.Quote(string(b))
	}
	return "base64:" + base64.StdEncoding.EncodeToString(b)
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n  ")
}

func dlRedriveCmd(s *settings) *cobra.Command {
	var f letterFilterFlags
	var all, wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "redrive [ID...]",
		Short: "Ask the running consumer to run dead letters through its handler again",
		Long: `redrive marks dead letters for a redrive. The handler lives in your worker, not
in this tool, so a running consumer with the letters' consumer name performs
the redrive within seconds: in a transaction per letter that re-claims the
message id and runs the handler, so redriving a letter twice applies it once.
A failed redrive is recorded on the letter (see show) and the letter stays.

Select letters by ID, or with --all plus the filters. --wait waits for the
outcome and exits with 1 if any redrive failed.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.consumer == "" {
				return errors.New("--consumer is required: redrives are performed by the consumer of that name")
			}
			ids, err := letterIDs(args)
			if err != nil {
				return err
			}
			if len(ids) == 0 && !all {
				return errors.New("name letters by ID, or pass --all (with --topic, --class, ... to narrow it)")
			}
			ctx := cmd.Context()
			pool, store, err := s.letters(ctx, f.consumer)
			if err != nil {
				return err
			}
			defer pool.Close()
			if len(ids) == 0 {
				flt := f.filter()
				flt.Pending = true
				letters, err := store.List(ctx, pool, flt)
				if err != nil {
					return err
				}
				for _, l := range letters {
					ids = append(ids, l.ID)
				}
			}
			n, err := store.RequestRedrive(ctx, pool, f.consumer, ids)
			if err != nil {
				return err
			}
			if !s.json {
				fmt.Fprintf(s.st.out, "requested a redrive of %d letter(s) of consumer %s; a running consumer of that name performs it\n", n, f.consumer)
			}
			if !wait || n == 0 {
				return s.emitJSONOnly(map[string]any{"requested": n})
			}
			deadline := time.Now().Add(timeout)
			for {
				letters, err := store.List(ctx, pool, deadletter.Filter{Consumer: f.consumer, IDs: ids, Limit: len(ids)})
				if err != nil {
					return err
				}
				waiting, failed := 0, 0
				for _, l := range letters {
					switch {
					case l.RedriveRequestedAt != nil && l.RedrivenAt == nil:
						waiting++
					case l.RedrivenAt == nil && l.RedriveError != "":
						failed++
					}
				}
				if waiting == 0 {
					if err := s.emit(letterList(letters), func(w io.Writer) {
						for _, l := range letters {
							fmt.Fprintf(w, "%d\t%s", l.ID, letterState(&l))
							if l.RedrivenAt == nil && l.RedriveError != "" {
								fmt.Fprintf(w, ": %s", firstLine(l.RedriveError))
							}
							fmt.Fprintln(w)
						}
					}); err != nil {
						return err
					}
					if failed > 0 {
						return errFindings
					}
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%d letter(s) still wait for a redrive after %v: is a consumer named %s running? The requests stay, and it performs them when it runs", waiting, timeout, f.consumer)
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(500 * time.Millisecond):
				}
			}
		},
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "redrive every pending letter matching the filters")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait for the outcome")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "how long --wait waits")
	return cmd
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// letterIDs parses letters' ids from arguments.
func letterIDs(args []string) ([]int64, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a dead letter's number", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func dlSettleCmd(s *settings) *cobra.Command {
	var consumerName string
	cmd := &cobra.Command{
		Use:   "settle ID...",
		Short: "Close dead letters without a redrive: their effect was made by other means, or is not wanted",
		Long: `settle closes open dead letters without running them: for a letter whose
effect you made by other means, or decided is not wanted. A settled letter
is never redriven (a pending redrive request of it is withdrawn), no longer
counts as open, and stays listed as the record of the message. A letter
that a redrive is running for right now is left to it.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if consumerName == "" {
				return errors.New("--consumer is required: the consumer the letters belong to (a guard against a mistyped id)")
			}
			ids, err := letterIDs(args)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			pool, store, err := s.letters(ctx, consumerName)
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := store.Settle(ctx, pool, consumerName, ids)
			if err != nil {
				return err
			}
			return s.emit(map[string]any{"settled": n}, func(w io.Writer) {
				fmt.Fprintf(w, "settled %d of %d letter(s) of consumer %s\n", n, len(ids), consumerName)
				if n < int64(len(ids)) {
					fmt.Fprintln(w, "the others are redriven or settled already, or are not that consumer's: see dead-letters show")
				}
			})
		},
	}
	cmd.Flags().StringVar(&consumerName, "consumer", "", "the consumer's name (Config.Name)")
	return cmd
}
