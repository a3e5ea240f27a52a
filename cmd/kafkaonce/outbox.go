package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

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

// outboxBacklog is what the outbox holds: rows waiting, and rows parked.
type outboxBacklog struct {
	Pending int64           `json:"pending"`
	Parked  []outbox.Parked `json:"parked"`
}

func outboxParkedCmd(s *settings) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "Count the rows waiting for delivery, and list the parked rows, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, box, err := openStore(ctx, s, "", outbox.New)
			if err != nil {
				return err
			}
			defer pool.Close()
			var b outboxBacklog
			if b.Pending, err = box.Pending(ctx, pool); err != nil {
				return err
			}
			if b.Parked, err = box.Parked(ctx, pool, limit); err != nil {
				return err
			}
			if b.Parked == nil {
				b.Parked = []outbox.Parked{}
			}
			return s.emit(b, func(w io.Writer) {
				fmt.Fprintf(w, "%d rows waiting for delivery, %d parked\n", b.Pending, len(b.Parked))
				if len(b.Parked) == 0 {
					return
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
