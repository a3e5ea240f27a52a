package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

func migrateCmd(s *settings) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade kafkaonce's tables and show the schema version",
		Long: `migrate applies the embedded, numbered migrations that the schema lacks, in one
transaction under an advisory lock: safe to run while workers start, and a
second run changes nothing.

Without --schema it migrates the one schema that holds kafkaonce's tables,
or creates them in "kafkaonce" when none does; with several, it asks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := s.pool(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := s.settleMigrateSchema(ctx, pool); err != nil {
				return err
			}
			before, err := schema.Version(ctx, pool, s.schema)
			if err != nil {
				return err
			}
			after, err := consumer.Migrate(ctx, pool, s.schema)
			if err != nil {
				return err
			}
			var applied []string
			for _, m := range schema.Migrations() {
				if m.Version > before {
					applied = append(applied, fmt.Sprintf("%03d_%s", m.Version, m.Name))
				}
			}
			report := struct {
				Schema  string   `json:"schema"`
				Before  int      `json:"version_before"`
				Version int      `json:"version"`
				Applied []string `json:"applied"`
			}{s.schema, before, after, applied}
			return s.emit(report, func(w io.Writer) {
				if len(applied) == 0 {
					fmt.Fprintf(w, "schema %s is at version %d; nothing to apply\n", s.schema, after)
					return
				}
				fmt.Fprintf(w, "schema %s: version %d -> %d\n", s.schema, before, after)
				for _, a := range applied {
					fmt.Fprintf(w, "  applied %s\n", a)
				}
			})
		},
	}
}
