package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// serveOptions are the flags of kafkaonce serve.
type serveOptions struct {
	listen       string
	allowRemote  bool
	allowActions bool
	// hosts are the names the page is served as (its requests' Host),
	// besides loopback and a specific --listen address.
	hosts []string
	// groups maps a consumer's name to its group, for consumers whose
	// Config.GroupID is not their name.
	groups map[string]string
}

func serveCmd(s *settings) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a read-mostly web page of every consumer, dead letter, suspect duplicate and parked outbox row",
		Long: `serve starts a small web page beside the CLI: every consumer with its
partitions (stored position, committed offset, lag, last commit, stopped
partitions and why), dead letters by class (each one openable), suspect
duplicates and fingerprint conflicts, and the outbox backlog with its
parked rows. The HTML is rendered on the server; the page runs no script.

The page is read-only unless --allow-actions is given. Then it offers to
redrive a dead letter, mark one settled, and un-park an outbox row: the same
operations as kafkaonce dead-letters redrive|settle and kafkaonce outbox
retry, each behind a confirmation page that names what it will do.

It listens on the loopback interface only, unless --allow-remote: the page
shows message contents, and it has no login of its own.

A consumer's group is --group's, else the one it records when it starts,
else its name. Without --brokers or KAFKA_BROKERS, the page uses the brokers
the consumers record, when they all record the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkListen(o.listen, o.allowRemote, o.hosts); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := s.connectServe(ctx)
			if err != nil {
				return err
			}
			defer c.close()
			page, err := newPage(s, c, o)
			if err != nil {
				return err
			}
			defer page.close()
			l, err := net.Listen("tcp", o.listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", o.listen, err)
			}
			mode := "read-only: start with --allow-actions to redrive, settle, un-park, pause and resume"
			if o.allowActions {
				mode = "actions allowed"
			}
			fmt.Fprintf(s.st.out, "serving on http://%s (%s)\n", l.Addr(), mode)
			srv := &http.Server{Handler: page.handler(), ReadHeaderTimeout: 10 * time.Second}
			go func() {
				<-ctx.Done()
				shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(shutdown)
			}()
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.listen, "listen", "127.0.0.1:8080", "the address to listen on (loopback only, unless --allow-remote)")
	cmd.Flags().BoolVar(&o.allowRemote, "allow-remote", false, "allow a --listen address other hosts can reach (the page has no login: put it behind one)")
	cmd.Flags().StringSliceVar(&o.hosts, "host", nil, "with --allow-remote, a name the page is served as, with its port if not 80 (the Host header is checked; repeatable)")
	cmd.Flags().BoolVar(&o.allowActions, "allow-actions", false, "offer redrive, settle, un-park, pause and resume (default: read-only)")
	cmd.Flags().StringToStringVar(&o.groups, "group", nil, "a consumer's group when it is neither recorded nor the consumer's name: name=group (repeatable)")
	return cmd
}

// checkListen refuses an address other hosts can reach, unless allowed:
// the page shows message contents and has no login. Listening on every
// interface, it must be told the names it is served as: a Host it cannot
// check would let a site rebind its own name to this machine and use the
// page from a browser here.
func checkListen(addr string, allowRemote bool, hosts []string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen must be host:port, such as 127.0.0.1:8080 (got %q)", addr)
	}
	if isLoopback(host) {
		return nil
	}
	if allowRemote && everyInterface(host) && len(hosts) == 0 {
		return fmt.Errorf("--listen %s listens on every interface: name the host the page is served as with --host (say --host ops.example.com:8080), so that requests for any other name are refused", addr)
	}
	if allowRemote {
		return nil
	}
	return fmt.Errorf("--listen %s is reachable from other hosts, and the page has no login: listen on 127.0.0.1, or pass --allow-remote (behind a proxy that authenticates)", addr)
}

// isLoopback reports whether host names the loopback interface only. An
// empty host listens on every interface.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// connectServe opens Postgres on the settled schema and settles Kafka's
// settings, whose brokers, when neither --brokers nor KAFKA_BROKERS gives
// them, are those every consumer of the schema records. The page makes its
// own Kafka client.
func (s *settings) connectServe(ctx context.Context) (*conn, error) {
	c, err := s.connectDB(ctx, "")
	if err != nil {
		return nil, err
	}
	var shared *recorded.Settings
	if s.brokers == "" && s.st.getenv("KAFKA_BROKERS") == "" {
		records, err := s.loadRecords(ctx, c.pool)
		if err == nil {
			shared, err = sharedKafka(records)
		}
		if err != nil {
			c.close()
			return nil, err
		}
	}
	who := ""
	if shared != nil {
		who = "every consumer of schema " + s.schema
	}
	if c.kafka, err = s.kafkaSettings(shared, who); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}
