package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// streams are the command's input and outputs, replaceable in tests.
type streams struct {
	in       io.Reader
	out, err io.Writer
	// terminal reports whether err is an interactive terminal (progress
	// bars) and in one (prompts).
	terminal func() bool
	getenv   func(string) string
}

func newStreams() streams {
	return streams{in: os.Stdin, out: os.Stdout, err: os.Stderr, getenv: os.Getenv, terminal: func() bool {
		for _, f := range []*os.File{os.Stdin, os.Stderr} {
			st, err := f.Stat()
			if err != nil || st.Mode()&os.ModeCharDevice == 0 {
				return false
			}
		}
		return true
	}}
}

// errFindings makes the command exit with 1: it ran, and found a problem
// the output describes.
var errFindings = errors.New("problems found")

// settings are the flags shared by every command.
type settings struct {
	st          streams
	databaseURL string
	schema      string
	brokers     string
	kafkaTLS    bool
	saslMech    string
	saslUser    string
	json        bool
	// root is the root command, whose global flags tell a flag given from
	// its default.
	root *cobra.Command
}

func run(args []string, st streams) int {
	root := newRoot(st)
	root.SetArgs(args)
	root.SetOut(st.out)
	root.SetErr(st.err)
	root.SetIn(st.in)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := root.ExecuteContext(ctx)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errFindings):
		return 1
	default:
		fmt.Fprintln(st.err, "kafkaonce:", redact(err.Error(), st.getenv("DATABASE_URL"), st.getenv("KAFKA_PASSWORD")))
		return 2
	}
}

func newRoot(st streams) *cobra.Command {
	root, _ := newRootSettings(st)
	return root
}

// newRootSettings returns the root command and the settings its flags
// fill.
func newRootSettings(st streams) (*cobra.Command, *settings) {
	s := &settings{st: st}
	root := &cobra.Command{
		Use:   "kafkaonce",
		Short: "Operate kafkaonce consumers: schema, status, audit, replay, dead letters, pruning",
		Long: `kafkaonce operates the Postgres tables and Kafka consumer groups of kafkaonce
consumers. Settings come from flags or the environment (DATABASE_URL,
KAFKA_BROKERS, KAFKA_PASSWORD). Passwords are never printed.

What is not given is read from the database: the schema holding kafkaonce's
tables (the only one, or the one that knows --consumer), and the settings
the consumer records when it starts: how it derives message ids (audit's
--id), its group (--group), its topic (--topic, when it reads one) and its
brokers (--brokers, when neither it nor KAFKA_BROKERS is set). A flag always
wins. A consumer that derives ids with a function of its own must be told
--id.

Exit codes: 0 success; 1 the command found a problem (an audit finding, a
failed redrive); 2 the command could not run.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f := root.PersistentFlags()
	s.root = root
	f.StringVar(&s.databaseURL, "database-url", "", "Postgres connection string (default $DATABASE_URL)")
	f.StringVar(&s.schema, "schema", "", "Postgres schema of kafkaonce's tables (default: the one schema holding them, or of several the one that knows --consumer)")
	f.StringVar(&s.brokers, "brokers", "", "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS, else the brokers --consumer records)")
	f.BoolVar(&s.kafkaTLS, "kafka-tls", false, "connect to Kafka with TLS (default: as --consumer records, when its brokers are used)")
	f.StringVar(&s.saslMech, "kafka-sasl", "", "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (password from $KAFKA_PASSWORD; default: as --consumer records, when its brokers are used)")
	f.StringVar(&s.saslUser, "kafka-user", "", "SASL user name")
	f.BoolVar(&s.json, "json", false, "print JSON instead of text")
	root.AddCommand(migrateCmd(s), statusCmd(s), auditCmd(s), replayCmd(s), deadLettersCmd(s), pruneCmd(s), keysCmd(s), outboxCmd(s), serveCmd(s))
	return root, s
}

// pool connects to Postgres.
func (s *settings) pool(ctx context.Context) (*pgxpool.Pool, error) {
	u := s.databaseURL
	if u == "" {
		u = s.st.getenv("DATABASE_URL")
	}
	if u == "" {
		return nil, errors.New("no database: set DATABASE_URL or pass --database-url")
	}
	if s.given("schema") {
		if err := schema.ValidateName(s.schema); err != nil {
			return nil, fmt.Errorf("--schema %w", err)
		}
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, fmt.Errorf("the database URL is not valid: %s", redact(err.Error(), u, ""))
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to Postgres: %s", redact(err.Error(), u, ""))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to Postgres at %s: %s", safeHost(u), redact(err.Error(), u, ""))
	}
	return pool, nil
}

// dialer builds the Kafka dialer for k's TLS and SASL mechanism.
func (s *settings) dialer(k kafkaSettings) (*kafka.Dialer, error) {
	d := &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true}
	if k.tls {
		d.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if k.sasl == "" {
		return d, nil
	}
	pass := s.st.getenv("KAFKA_PASSWORD")
	var mech sasl.Mechanism
	var err error
	switch strings.ToLower(k.sasl) {
	case "plain":
		mech = plain.Mechanism{Username: s.saslUser, Password: pass}
	case "scram-sha-256":
		mech, err = scram.Mechanism(scram.SHA256, s.saslUser, pass)
	case "scram-sha-512":
		mech, err = scram.Mechanism(scram.SHA512, s.saslUser, pass)
	default:
		return nil, fmt.Errorf("--kafka-sasl must be plain, scram-sha-256 or scram-sha-512 (got %q)", k.sasl)
	}
	if err != nil {
		return nil, fmt.Errorf("--kafka-sasl: %w", err)
	}
	d.SASLMechanism = mech
	return d, nil
}

// conn is what most commands need: a pool on the settled schema, the named
// consumer's record, and a Kafka admin client.
type conn struct {
	pool *pgxpool.Pool
	// record is what the named consumer recorded; nil when it recorded
	// nothing, or no consumer is named.
	record  *recorded.Settings
	kafka   kafkaSettings
	brokers []string
	dialer  *kafka.Dialer
	admin   *kafkaadmin.Admin
}

func (c *conn) close() {
	if c.admin != nil {
		c.admin.Close()
	}
	c.pool.Close()
}

// connectDB opens Postgres on the settled schema and reads consumerName's
// record ("" for none): what a command needs to check before it reaches
// Kafka.
func (s *settings) connectDB(ctx context.Context, consumerName string) (*conn, error) {
	pool, err := s.open(ctx, consumerName)
	if err != nil {
		return nil, err
	}
	rec, err := s.loadRecord(ctx, pool, consumerName)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &conn{pool: pool, record: rec}, nil
}

// connectKafka makes c's Kafka admin client, for consumerName ("" for
// none; see kafkaSettings).
func (s *settings) connectKafka(c *conn, consumerName string) error {
	who := ""
	if consumerName != "" {
		who = "consumer " + consumerName
	}
	return s.connectKafkaAs(c, c.record, who)
}

// connectKafkaAs makes c's Kafka admin client, falling back on rec, the
// record of who.
func (s *settings) connectKafkaAs(c *conn, rec *recorded.Settings, who string) error {
	k, err := s.kafkaSettings(rec, who)
	if err != nil {
		return err
	}
	d, err := s.dialer(k)
	if err != nil {
		return err
	}
	c.kafka, c.brokers, c.dialer, c.admin = k, k.brokers, d, kafkaadmin.New(k.brokers, d)
	return nil
}

// connect opens Postgres and Kafka for consumerName ("" for none).
func (s *settings) connect(ctx context.Context, consumerName string) (*conn, error) {
	c, err := s.connectDB(ctx, consumerName)
	if err != nil {
		return nil, err
	}
	if err := s.connectKafka(c, consumerName); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// emit prints v as JSON with --json, else calls text.
func (s *settings) emit(v any, text func(w io.Writer)) error {
	if s.json {
		enc := json.NewEncoder(s.st.out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	text(s.st.out)
	return nil
}

// table writes aligned columns.
func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	tw.Flush()
}

// redact removes secrets from a text: the password of a connection URL, and
// any other secret given.
func redact(text, connURL, secret string) string {
	if u, err := url.Parse(connURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			text = strings.ReplaceAll(text, p, "xxxxx")
		}
	}
	for _, kv := range strings.Fields(connURL) { // key=value form
		if k, v, ok := strings.Cut(kv, "="); ok && k == "password" && v != "" {
			text = strings.ReplaceAll(text, v, "xxxxx")
		}
	}
	if secret != "" {
		text = strings.ReplaceAll(text, secret, "xxxxx")
	}
	return text
}

// safeHost names the server of a connection URL without credentials.
func safeHost(connURL string) string {
	if u, err := url.Parse(connURL); err == nil && u.Host != "" {
		return u.Host + u.Path
	}
	return "the configured server"
}

// parseDuration accepts Go durations and a d suffix for days ("7d").
func parseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a duration (use 36h, 90m or 7d)", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a duration (use 36h, 90m or 7d)", s)
	}
	return v, nil
}

func optional(v int64) string {
	if v < 0 {
		return "-"
	}
	return strconv.FormatInt(v, 10)
}
