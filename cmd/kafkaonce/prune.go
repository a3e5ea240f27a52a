package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/offsets"
)

func pruneCmd(s *settings) *cobra.Command {
	var consumerName, olderText string
	var batch int
	var force, dryRun bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Delete old claims and expired idempotency keys in bounded batches",
		Long: `prune deletes claims older than --older-than (default 7d) from
processed_messages, a batch per transaction, skipping rows in use, so workers
keep running meanwhile. Dead-lettered messages keep their claims until they
are redriven.

Without --consumer it also deletes the schema's expired idempotency keys
(package idempotency), whose retention is their own, as "keys prune" does.

Replays stay safe after pruning: the stored positions make a rewound group
skip what was processed. What pruning narrows is the window in which a
producer's late re-send of an old message is recognised as a duplicate, so
windows shorter than 1 day are refused unless --force.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			older, err := parseDuration(olderText)
			if err != nil {
				return fmt.Errorf("--older-than: %w", err)
			}
			if older < dedupe.MinRetention && !force {
				return fmt.Errorf("--older-than %v is shorter than the minimum %v: a producer re-sending later than that would have its message applied twice; pass --force if you mean it", older, dedupe.MinRetention)
			}
			if batch < 1 || batch > 100000 {
				return errors.New("--batch must be between 1 and 100000")
			}
			ctx := cmd.Context()
			pool, err := s.open(ctx, consumerName)
			if err != nil {
				return err
			}
			defer pool.Close()
			claims, err := dedupe.NewStore(s.schema)
			if err != nil {
				return err
			}
			consumers := []string{consumerName}
			if consumerName == "" {
				positions, err := offsets.NewStore(s.schema)
				if err != nil {
					return err
				}
				if consumers, err = positions.Consumers(ctx, pool); err != nil {
					return err
				}
			}
			before := time.Now().Add(-older)
			type result struct {
				Consumer string `json:"consumer"`
				Eligible int64  `json:"eligible"`
				Deleted  int64  `json:"deleted"`
			}
			var results []result
			for _, c := range consumers {
				eligible, err := claims.CountBefore(ctx, pool, c, before)
				if err != nil {
					return err
				}
				res := result{Consumer: c, Eligible: eligible}
				if !dryRun && eligible > 0 {
					bar := newProgress(s.st, "pruning "+c)
					bar.start(eligible)
					for {
						n, err := claims.Prune(ctx, pool, c, before, batch)
						if err != nil {
							bar.done()
							// Each batch commits on its own: say what is gone.
							return fmt.Errorf("%w; deleted %d claims of consumer %s older than %s before the failure, after pruning %d consumer(s) before it; the rest are kept: run prune again to finish",
								err, res.Deleted, c, before.UTC().Format(time.RFC3339), len(results))
						}
						res.Deleted += n
						bar.add(n)
						if n < int64(batch) {
							break
						}
					}
					bar.done()
				}
				results = append(results, res)
			}
			out := struct {
				Claims []result    `json:"claims"`
				Keys   *keysPruned `json:"idempotency_keys,omitempty"`
			}{Claims: results}
			if consumerName == "" {
				keys, err := idempotency.NewStore(s.schema)
				if err != nil {
					return err
				}
				res, err := pruneKeys(ctx, pool, keys, batch, dryRun)
				if err != nil {
					return err
				}
				out.Keys = &res
			}
			return s.emit(out, func(w io.Writer) {
				for _, r := range results {
					if dryRun {
						fmt.Fprintf(w, "consumer %s: %d claims older than %s would be deleted\n", r.Consumer, r.Eligible, before.UTC().Format(time.RFC3339))
					} else {
						fmt.Fprintf(w, "consumer %s: deleted %d claims older than %s\n", r.Consumer, r.Deleted, before.UTC().Format(time.RFC3339))
					}
				}
				if len(results) == 0 {
					fmt.Fprintln(w, "no consumers")
				}
				if out.Keys != nil {
					out.Keys.print(w, dryRun)
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&consumerName, "consumer", "", "prune this consumer's claims (default: every consumer with stored positions)")
	f.StringVar(&olderText, "older-than", "7d", "delete claims older than this")
	f.IntVar(&batch, "batch", dedupe.DefaultPruneBatch, "rows per transaction")
	f.BoolVar(&force, "force", false, "allow a window shorter than the minimum (1 day)")
	f.BoolVar(&dryRun, "dry-run", false, "only count what would be deleted")
	return cmd
}
