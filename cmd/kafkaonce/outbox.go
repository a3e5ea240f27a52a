package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func outboxCmd(s *settings) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "Show the outbox backlog and its parked rows; put parked rows back to be delivered",
	}
	cmd.AddCommand(outboxParkedCmd(s), outboxRetryCmd(s))
	return cmd
}

// outboxBacklog is what the outbox holds: rows to deliver (some waiting
// for a retry), and rows parked, counted and the oldest listed.
type outboxBacklog struct {
	Pending     int64           `json:"pending"`
	Waiting     int64           `json:"waiting"`
	ParkedCount int64           `json:"parked_count"`
	OldestAge   float64         `json:"oldest_pending_age_seconds"`
	Parked      []outbox.Parked `json:"parked"`
}

func outboxParkedCmd(s *settings) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "Count the rows to deliver, those waiting for a retry and the parked ones, and list the parked rows, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, box, err := openStore(ctx, s, "", outbox.New)
			if err != nil {
				return err
			}
			defer pool.Close()
			counts, err := box.Backlog(ctx, pool)
			if err != nil {
				return err
			}
			b := outboxBacklog{Pending: counts.Pending, Waiting: counts.Waiting, ParkedCount: counts.Parked, OldestAge: counts.OldestPendingAge.Seconds()}
			if b.Parked, err = box.Parked(ctx, pool, limit); err != nil {
				return err
			}
			if b.Parked == nil {
				b.Parked = []outbox.Parked{}
			}
			return s.emit(b, func(w io.Writer) {
				fmt.Fprintf(w, "%s rows to deliver (%s of them waiting for a retry), %s parked", consumerstatus.BacklogCount(b.Pending), consumerstatus.BacklogCount(b.Waiting), consumerstatus.BacklogCount(b.ParkedCount))
				if counts.OldestPendingAge > 0 {
					fmt.Fprintf(w, "; the oldest written %s ago", counts.OldestPendingAge.Round(time.Second))
				}
				fmt.Fprintln(w)
				if len(b.Parked) == 0 {
					return
				}
				if int64(len(b.Parked)) < b.ParkedCount {
					fmt.Fprintf(w, "the oldest %d parked (--limit):\n", len(b.Parked))
				}
				var rows [][]string
				for _, p := range b.Parked {
					rows = append(rows, []string{p.ID, p.Destination, strconv.Itoa(p.Attempts), p.FailedAt.UTC().Format(time.RFC3339), firstLine(p.LastError)})
				}
				table(w, "ID\tDESTINATION\tATTEMPTS\tPARKED\tLAST ERROR", rows)
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many parked rows")
	return cmd
}

func outboxRetryCmd(s *settings) *cobra.Command {
	return &cobra.Command{
		Use:   "retry ID...",
		Short: "Put parked rows back to be delivered, with fresh attempts (once the cause is fixed)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, box, err := openStore(ctx, s, "", outbox.New)
			if err != nil {
				return err
			}
			defer pool.Close()
			n, err := box.Retry(ctx, pool, args...)
			if err != nil {
				return err
			}
			return s.emit(map[string]any{"retried": n}, func(w io.Writer) {
				fmt.Fprintf(w, "put %d of %d row(s) back to be delivered; the others were not parked\n", n, len(args))
			})
		},
	}
}
