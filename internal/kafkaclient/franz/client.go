// Package franz is the franz-go (kgo) Kafka client behind the engine's
// seam, and kafkaonce's default. It reads committed records only: records
// of aborted transactions and transaction markers are never handed out,
// and a partition does not move past its last stable offset while a
// transaction is open. Groups rebalance cooperatively (cooperative-sticky:
// a member joining or leaving moves only the partitions that change
// owner), members may be static (an instance id), and partitions added to
// a topic are assigned within the metadata refresh interval.
//
// It runs two kgo clients: one is the member of the group, which never
// fetches (its topics are paused) and commits the offsets; the other
// fetches the partitions the engine opens, each from the offset the engine
// chose, in shared fetch requests (see hub). Membership and fetching are
// kept apart so that starting a partition where the stored position says,
// and moving it back after the database lost transactions, are a plain
// seek, never a race with the group's own cursors.
package franz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Client is the franz-go client. Use New.
type Client struct {
	cfg   kafkaclient.Config
	base  []kgo.Opt
	log   *slog.Logger
	admin *kgo.Client

	hubOnce sync.Once
	hub     *hub
	hubErr  error
	// producer publishes (see Publish).
	producer producer

	mu sync.Mutex
	// group is the member's client while RunGroup runs, and committed the
	// fetches of committed offsets made as partitions were assigned.
	group     *kgo.Client
	committed map[kafkaclient.TopicPartition]*committedFetch
}

// New returns a client for cfg. It connects on first use.
func New(cfg kafkaclient.Config) (*Client, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dials == nil {
		cfg.Dials = kafkaclient.NewDials(log, cfg.TLS != nil)
	}
	base := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.WithLogger(logger{log.With(slog.String("component", "franz-go"))}),
		// The TLS handshake is done by kafkaclient's dialer, so that its
		// failure is told apart; the hook reports each connection, set up
		// (SASL included) or failed, to Dials.
		kgo.Dialer(kafkaclient.DialFunc(nil, cfg.TLS.Clone())),
		kgo.WithHooks(connectHook{cfg.Dials, cfg.SASL != nil}),
		kgo.RequestTimeoutOverhead(10 * time.Second),
	}
	if cfg.ClientID != "" {
		base = append(base, kgo.ClientID(cfg.ClientID))
	}
	if cfg.SASL != nil {
		base = append(base, kgo.SASL(cfg.SASL))
	}
	if age := cfg.MetadataMaxAge; age > 0 {
		base = append(base, kgo.MetadataMaxAge(age), kgo.MetadataMinAge(min(age, 5*time.Second)))
	}
	admin, err := kgo.NewClient(base...)
	if err != nil {
		return nil, fmt.Errorf("franz: %w", err)
	}
	return &Client{cfg: cfg, base: base, log: log, admin: admin, committed: map[kafkaclient.TopicPartition]*committedFetch{}}, nil
}

// Dials is the watch of the client's connections.
func (c *Client) Dials() *kafkaclient.Dials { return c.cfg.Dials }

// connectHook tells Dials how each connection to a broker went.
type connectHook struct {
	dials *kafkaclient.Dials
	sasl  bool
}

func (h connectHook) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, conn net.Conn, err error) {
	if errors.Is(err, kgo.ErrClientClosed) {
		return // closing, which says nothing of the broker
	}
	// A broker that hangs up on SASL (a wrong password, with some
	// brokers) is an EOF once the connection is open, but so is a TLS
	// listener's answer to the first request: franz-go says which in
	// its first-read error's message alone (the kind is unexported).
	var eof *kgo.ErrFirstReadEOF
	if h.sasl && conn != nil && errors.Is(err, io.EOF) && !(errors.As(err, &eof) && strings.Contains(eof.Error(), "api versions")) {
		err = fmt.Errorf("%w: %w", kafkaclient.ErrSASLHungUp, err)
	}
	h.dials.Report(net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))), err)
}

// Kgo returns the client's kgo client for requests of its own (bounds,
// metadata): it is not in a group and fetches nothing.
func (c *Client) Kgo() *kgo.Client { return c.admin }

// Close implements kafkaclient.Client.
func (c *Client) Close() {
	if c.hub != nil {
		c.hub.close()
	}
	c.producer.close()
	c.admin.Close()
}

// logger routes kgo's logging into slog. kgo's info level reports every
// assignment and rebalance step: debug for us.
type logger struct{ l *slog.Logger }

func (l logger) Level() kgo.LogLevel {
	ctx := context.Background()
	switch {
	case l.l.Enabled(ctx, slog.LevelDebug):
		return kgo.LogLevelInfo
	case l.l.Enabled(ctx, slog.LevelWarn):
		return kgo.LogLevelWarn
	}
	return kgo.LogLevelError
}

func (l logger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelWarn
	case kgo.LogLevelWarn:
		lv = slog.LevelInfo
	case kgo.LogLevelDebug:
		lv = slog.LevelDebug - 4
	}
	l.l.Log(context.Background(), lv, msg, keyvals...)
}
