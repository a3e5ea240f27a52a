package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// keys opens the database and the store of its idempotency keys, in the
// schema --schema names, else the one of consumer (when given), else the
// one holding key in scope (when given), else the only one.
func (s *settings) keys(ctx context.Context, consumer, scope, key string) (*pgxpool.Pool, *idempotency.Store, error) {
	pool, err := s.pool(ctx)
	if err != nil {
		return nil, nil, err
	}
	switch {
	case consumer != "":
		err = s.settleSchema(ctx, pool, consumer)
	case key != "":
		err = s.settleSchemaWith(ctx, pool, fmt.Sprintf("key %q in scope %q", key, scope), func(ctx context.Context, name string) (bool, error) {
			store, _ := idempotency.NewStore(name) // Find checked the name
			_, err := store.Get(ctx, pool, scope, key)
			if errors.Is(err, idempotency.ErrNotFound) {
				return false, nil
			}
			return err == nil, err
		})
	default:
		err = s.settleSchemaWith(ctx, pool, "", nil)
	}
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	store, err := idempotency.NewStore(s.schema)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, store, nil
}

func keysCmd(s *settings) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Look up and prune the idempotency keys of HTTP requests (package idempotency)",
	}
	cmd.AddCommand(keysGetCmd(s), keysPruneCmd(s))
	return cmd
}

func keysGetCmd(s *settings) *cobra.Command {
	var scope, consumer string
	var derive []string
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show a stored key: the request it completed and the response a retry gets",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			pool, store, err := s.keys(ctx, consumer, scope, args[0])
			if err != nil {
				return err
			}
			defer pool.Close()
			k, err := store.Get(ctx, pool, scope, args[0])
			if errors.Is(err, idempotency.ErrNotFound) {
				return fmt.Errorf("no key %q in scope %q: never used, or pruned after it expired (keys are per scope: pass --scope)", args[0], scope)
			}
			if err != nil {
				return err
			}
			return s.emit(k, func(w io.Writer) {
				fmt.Fprintf(w, "key %s in scope %s\n", k.Key, orDash(k.Scope))
				fmt.Fprintf(w, "request:  %s %s (fingerprint %x)\n", k.Method, k.Route, k.Fingerprint)
				fmt.Fprintf(w, "created:  %s\n", k.CreatedAt.UTC().Format(time.RFC3339))
				if h := k.Phased; h != nil {
					fmt.Fprintf(w, "phased:   flow %s, run %s, taken %d time(s)\n", h.Flow, h.RunID, h.Taken)
					for _, purpose := range derive {
						fmt.Fprintf(w, "derived key %q: %s\n", purpose, h.DerivedKey(purpose))
					}
					if h.LastError != "" {
						at := ""
						if !h.LastErrorAt.IsZero() {
							at = " at " + h.LastErrorAt.UTC().Format(time.RFC3339)
						}
						fmt.Fprintf(w, "last error%s: %s\n", at, h.LastError)
					}
					if !h.GivenUpAt.IsZero() {
						fmt.Fprintf(w, "given up: %s: %s\n", h.GivenUpAt.UTC().Format(time.RFC3339), h.GiveUpReason)
					}
				}
				if r := k.Run; r != nil {
					fmt.Fprintf(w, "in progress: at recovery point %s\n", r.RecoveryPoint)
					lease := "held until"
					if !r.LeaseUntil.After(time.Now()) {
						lease = "ran out at"
					}
					fmt.Fprintf(w, "lease:    %s %s (after it a retry or the flow's recovery sweep resumes the run)\n", lease, r.LeaseUntil.UTC().Format(time.RFC3339))
					if r.SweepAfter.After(time.Now()) {
						fmt.Fprintf(w, "sweep:    not before %s (backing off after a failed phase; a retry resumes at once)\n", r.SweepAfter.UTC().Format(time.RFC3339))
					}
					return
				}
				state := "expires"
				if !k.ExpiresAt.After(time.Now()) {
					state = "expired"
				}
				fmt.Fprintf(w, "%s:  %s\n", state, k.ExpiresAt.UTC().Format(time.RFC3339))
				fmt.Fprintf(w, "status:   %d\n", k.Status)
				names := make([]string, 0, len(k.Header))
				for name := range k.Header {
					names = append(names, name)
				}
				sort.Strings(names)
				for _, name := range names {
					for _, v := range k.Header[name] {
						fmt.Fprintf(w, "header:   %s: %s\n", name, v)
					}
				}
				fmt.Fprintf(w, "body:     %s\n", printable(k.Body))
			})
		},
	}
	cmd.Flags().StringVar(&scope, "scope", "", "the key's scope (what Config.Scope gave: a client, an account)")
	cmd.Flags().StringVar(&consumer, "consumer", "", "find the schema by a consumer in it (default: the schema holding the key)")
	cmd.Flags().StringSliceVar(&derive, "derive", nil, "for a phased run, print Run.DerivedKey of these purposes (say charge): the keys its calls sent to a provider")
	return cmd
}

// keysPruned is what pruning the expired idempotency keys found and did.
type keysPruned struct {
	Expired int64 `json:"expired"`
	Deleted int64 `json:"deleted"`
}

func (r keysPruned) print(w io.Writer, dryRun bool) {
	if dryRun {
		fmt.Fprintf(w, "%d expired idempotency keys would be deleted\n", r.Expired)
		return
	}
	fmt.Fprintf(w, "deleted %d expired idempotency keys\n", r.Deleted)
}

// pruneKeys deletes the schema's expired idempotency keys, batch at a
// time (with dryRun, only counts them). Phased runs in progress are never
// deleted.
func pruneKeys(ctx context.Context, pool *pgxpool.Pool, store *idempotency.Store, batch int, dryRun bool) (keysPruned, error) {
	counts, err := store.Count(ctx, pool)
	if err != nil {
		return keysPruned{}, err
	}
	res := keysPruned{Expired: counts.Expired}
	for !dryRun {
		n, err := store.Prune(ctx, pool, batch)
		if err != nil {
			// Each batch commits on its own: say what is gone.
			return res, fmt.Errorf("%w; %d expired idempotency keys were deleted before the failure, the rest are kept: run it again to finish", err, res.Deleted)
		}
		res.Deleted += n
		if n < int64(batch) {
			break
		}
	}
	return res, nil
}

func keysPruneCmd(s *settings) *cobra.Command {
	var batch int
	var consumer string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Delete expired idempotency keys in bounded batches",
		Long: `prune deletes the idempotency keys whose retention ran out, a batch per
transaction, skipping rows in use. An expired key is already free for a new
request; pruning only reclaims its space. A consumer with Config.Prune set
and idempotency.Store.Pruner() in Config.Pruners does the same in the
background.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 1 || batch > 100000 {
				return errors.New("--batch must be between 1 and 100000")
			}
			ctx := cmd.Context()
			pool, store, err := s.keys(ctx, consumer, "", "")
			if err != nil {
				return err
			}
			defer pool.Close()
			res, err := pruneKeys(ctx, pool, store, batch, dryRun)
			if err != nil {
				return err
			}
			return s.emit(res, func(w io.Writer) { res.print(w, dryRun) })
		},
	}
	cmd.Flags().IntVar(&batch, "batch", 1000, "rows per transaction")
	cmd.Flags().StringVar(&consumer, "consumer", "", "find the schema by a consumer in it (default: the only schema)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "only count what would be deleted")
	return cmd
}
