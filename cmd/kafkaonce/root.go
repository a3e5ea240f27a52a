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
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
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
	tlsFiles    kafkaconn.TLSFiles
	saslMech    string
	saslUser    string
	// plaintextSASL lets --kafka-sasl plain go without TLS (a loopback
	// development broker): otherwise refused, as in consumer.Config.
	plaintextSASL bool
	json          bool
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	var status exitStatus
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errFindings):
		return 1
	case errors.As(err, &status):
		return int(status) // the command kafkaonce dev ran
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
		Short: "Operate kafkaonce consumers: schema, status, audit, replay, positions, dead letters, pruning",
		Long: `kafkaonce operates the Postgres tables and Kafka consumer groups of kafkaonce
consumers. Settings come from flags or the environment (DATABASE_URL,
KAFKA_BROKERS, KAFKA_PASSWORD, KAFKA_OAUTH_TOKEN, and AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN for AWS_MSK_IAM). Passwords and
tokens are never printed.

What is not given is read from the database: the schema holding kafkaonce's
tables (the only one, or the one that knows --consumer), and the settings
the consumer records when it starts: how it derives message ids (audit's
--id), its group (--group), its topic (--topic, when it reads one) and its
brokers (--brokers, when neither it nor KAFKA_BROKERS is set). A flag always
wins. A consumer that derives ids with a function of its own must be told
--id.

Exit codes: 0 success; 1 the command found a problem (an audit finding, a
failed redrive, a status that could not read Kafka); 2 the command could not
run.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	f := root.PersistentFlags()
	s.root = root
	f.StringVar(&s.databaseURL, "database-url", "", "Postgres connection string (default $DATABASE_URL)")
	f.StringVar(&s.schema, "schema", "", "Postgres schema of kafkaonce's tables (default: the one schema holding them, or of several the one that knows --consumer)")
	f.StringVar(&s.brokers, "brokers", "", "Kafka bootstrap brokers, comma-separated (default $KAFKA_BROKERS, else the brokers --consumer records)")
	f.BoolVar(&s.kafkaTLS, "kafka-tls", false, "connect to Kafka with TLS, checked against the system's roots (default: as --consumer records, when its brokers are used; any --kafka-*-file implies it)")
	f.StringVar(&s.tlsFiles.CAFile, "kafka-ca-file", "", "PEM file of the CA certificates that sign the brokers' certificates")
	f.StringVar(&s.tlsFiles.CertFile, "kafka-cert-file", "", "PEM file of this client's certificate, for brokers that require one (mTLS); with --kafka-key-file")
	f.StringVar(&s.tlsFiles.KeyFile, "kafka-key-file", "", "PEM file of the client certificate's private key")
	f.StringVar(&s.tlsFiles.ServerName, "kafka-server-name", "", "name to check the brokers' certificates against (default: each broker's host)")
	f.StringVar(&s.saslMech, "kafka-sasl", "", "SASL mechanism: "+strings.Join(saslFlagValues, ", ")+" (password from $KAFKA_PASSWORD, token from $KAFKA_OAUTH_TOKEN, AWS credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; default: as --consumer records, when its brokers are used)")
	f.StringVar(&s.saslUser, "kafka-user", "", "SASL user name (plain, scram-sha-256, scram-sha-512)")
	f.BoolVar(&s.plaintextSASL, "kafka-allow-plaintext-sasl", false, "let --kafka-sasl plain send the password without TLS, for a development broker on loopback only")
	f.BoolVar(&s.json, "json", false, "print JSON instead of text")
	root.AddCommand(migrateCmd(s), statusCmd(s), auditCmd(s), replayCmd(s), deadLettersCmd(s), pauseCmd(s), resumeCmd(s), pruneCmd(s), keysCmd(s), outboxCmd(s), serveCmd(s), topicRecreatedCmd(s), positionsCmd(s), devCmd(s))
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

// saslFlagValues are the values --kafka-sasl takes: Kafka's mechanism
// names, lower case.
var saslFlagValues = []string{"plain", "scram-sha-256", "scram-sha-512", "oauthbearer", "aws_msk_iam"}

// kafkaConfig is the Kafka client configuration for k's brokers, TLS and
// SASL mechanism.
func (s *settings) kafkaConfig(k kafkaSettings) (kafkaclient.Config, error) {
	cfg := kafkaclient.Config{Brokers: k.brokers, ClientID: "kafkaonce-cli", MaxBatch: 1000, FetchMaxBytes: 8 << 20}
	tlsCfg, auth, err := s.kafkaAuth(k)
	if err != nil {
		return cfg, err
	}
	cfg.TLS = tlsCfg
	mech, err := kafkaclient.Mechanism(auth)
	if err != nil {
		return cfg, fmt.Errorf("--kafka-sasl: %w", err)
	}
	cfg.SASL = mech
	return cfg, nil
}

// kafkaAuth is the TLS and SASL of k (nil for none), from the flags and
// the environment.
func (s *settings) kafkaAuth(k kafkaSettings) (*tls.Config, *kafkaconn.SASL, error) {
	var tlsCfg *tls.Config
	if k.tls || s.tlsFiles != (kafkaconn.TLSFiles{}) {
		t, err := kafkaconn.TLSConfig(s.tlsFiles)
		if err != nil {
			return nil, nil, fmt.Errorf("--kafka-ca-file, --kafka-cert-file, --kafka-key-file: %w", err)
		}
		tlsCfg = t
	}
	if k.sasl == "" {
		return tlsCfg, nil, nil
	}
	auth := &kafkaconn.SASL{Mechanism: kafkaconn.Mechanism(strings.ToUpper(k.sasl)), Username: s.saslUser, Password: s.st.getenv("KAFKA_PASSWORD"), AllowPlaintext: s.plaintextSASL}
	switch auth.Mechanism {
	case kafkaconn.Plain, kafkaconn.ScramSHA256, kafkaconn.ScramSHA512:
		if auth.Username == "" || auth.Password == "" {
			return nil, nil, fmt.Errorf("--kafka-sasl %s needs --kafka-user and KAFKA_PASSWORD", k.sasl)
		}
		// User and password are there, so what CheckOver refuses is
		// PLAIN without TLS: said here in the flags' words, not the Go
		// fields'.
		if auth.CheckOver(tlsCfg) != nil {
			return nil, nil, errors.New("--kafka-sasl plain without TLS would send the password in clear: pass --kafka-tls (or --kafka-ca-file), use --kafka-sasl scram-sha-512, or, for a development broker on loopback only, --kafka-allow-plaintext-sasl")
		}
	case kafkaconn.OAuthBearer:
		token := s.st.getenv("KAFKA_OAUTH_TOKEN")
		if token == "" {
			return nil, nil, errors.New("--kafka-sasl oauthbearer needs the bearer token in KAFKA_OAUTH_TOKEN")
		}
		auth.Token = func(context.Context) (string, error) { return token, nil }
	case kafkaconn.AWSMSKIAM:
		getenv := s.st.getenv
		auth.AWS = func(context.Context) (kafkaconn.AWSCredentials, error) {
			c := kafkaconn.AWSCredentials{AccessKey: getenv("AWS_ACCESS_KEY_ID"), SecretKey: getenv("AWS_SECRET_ACCESS_KEY"), SessionToken: getenv("AWS_SESSION_TOKEN")}
			if c.AccessKey == "" || c.SecretKey == "" {
				return c, errors.New("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set")
			}
			return c, nil
		}
	default:
		return nil, nil, fmt.Errorf("--kafka-sasl must be one of %s (got %q)", strings.Join(saslFlagValues, ", "), k.sasl)
	}
	return tlsCfg, auth, nil
}

// conn is what most commands need: a pool on the settled schema, the named
// consumer's record, and a Kafka admin client.
type conn struct {
	pool *pgxpool.Pool
	// record is what the named consumer recorded; nil when it recorded
	// nothing, or no consumer is named.
	record *recorded.Settings
	kafka  kafkaSettings
	admin  *kafkaadmin.Admin
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
	cfg, err := s.kafkaConfig(k)
	if err != nil {
		return err
	}
	admin, err := kafkaadmin.New(cfg)
	if err != nil {
		return err
	}
	c.kafka, c.admin = k, admin
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

// redact removes the database password and the Kafka password from a text
// the command prints that came from elsewhere, such as an error it reports
// and goes on.
func (s *settings) redact(text string) string {
	u := s.databaseURL
	if u == "" {
		u = s.st.getenv("DATABASE_URL")
	}
	return redact(text, u, s.st.getenv("KAFKA_PASSWORD"))
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

// optional shows a number that is -1 when unknown as "-".
var optional = consumerstatus.Optional
