package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// What the tools are not told, they take from where the consumer wrote it:
// the schema that holds its tables, and the settings it records in them
// when it starts (its id rule, group, topics and brokers). A flag (or, for
// the brokers, KAFKA_BROKERS) always wins; without either, the record; and
// without a record, the default of old. Nothing is guessed: a schema that
// cannot be told apart from others, or a setting the record cannot give,
// is an error that says which flag to pass.

// given reports whether the global flag name was set on the command line.
func (s *settings) given(name string) bool {
	return s.root.PersistentFlags().Changed(name)
}

// open connects to Postgres and settles the schema (see settleSchema).
func (s *settings) open(ctx context.Context, consumerName string) (*pgxpool.Pool, error) {
	pool, err := s.pool(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.settleSchema(ctx, pool, consumerName); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// settleSchema sets s.schema when --schema was not given: the one schema of
// the database holding kafkaonce's tables; of several, the one that knows
// consumerName (it ran, claimed or stored a position there). Anything less certain is an
// error listing the schemas found: a tool reading the wrong schema would
// report another consumer's state as this one's.
func (s *settings) settleSchema(ctx context.Context, pool *pgxpool.Pool, consumerName string) error {
	if consumerName == "" {
		return s.settleSchemaWith(ctx, pool, "", nil)
	}
	return s.settleSchemaWith(ctx, pool, "consumer "+consumerName, func(ctx context.Context, name string) (bool, error) {
		return consumerKnown(ctx, pool, name, consumerName)
	})
}

// settleSchemaWith is settleSchema for what knows says a schema knows (who
// names it for the error; nil knows: nothing narrows the choice).
func (s *settings) settleSchemaWith(ctx context.Context, pool *pgxpool.Pool, who string, knows func(ctx context.Context, schemaName string) (bool, error)) error {
	if s.given("schema") {
		return nil
	}
	found, err := schema.Find(ctx, pool)
	if err != nil {
		return err
	}
	switch {
	case len(found) == 0:
		return errors.New("no schema of this database holds kafkaonce's tables: pass --schema with the consumer's Config.Schema, or run kafkaonce migrate")
	case len(found) == 1:
		s.schema = found[0]
		return nil
	case knows == nil:
		return fmt.Errorf("%d schemas hold kafkaonce's tables (%s): pass --schema to say which", len(found), strings.Join(found, ", "))
	}
	var knowing []string
	for _, name := range found {
		known, err := knows(ctx, name)
		if err != nil {
			return err
		}
		if known {
			knowing = append(knowing, name)
		}
	}
	if len(knowing) == 1 {
		s.schema = knowing[0]
		return nil
	}
	where := "in none of them"
	if len(knowing) > 1 {
		where = "in " + strings.Join(knowing, " and ")
	}
	return fmt.Errorf("%d schemas hold kafkaonce's tables (%s), and %s is known %s: pass --schema to say which",
		len(found), strings.Join(found, ", "), who, where)
}

// consumerKnown reports whether consumerName ran, claimed or stored a
// position in the schema.
func consumerKnown(ctx context.Context, pool *pgxpool.Pool, schemaName, consumerName string) (bool, error) {
	store, _ := recorded.NewStore(schemaName) // Find checked the name
	known, err := store.Known(ctx, pool, consumerName)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" {
		known, err = false, nil // a schema older than 007: it holds no consumers table, but may hold the consumer's positions
	}
	if err != nil || known {
		return known, err
	}
	// A consumer that ran before 007, or whose row is gone, still has its
	// positions (every batch stores one).
	positions, _ := offsets.NewStore(schemaName)
	ps, err := positions.List(ctx, pool, consumerName)
	if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") { // dropped since Find
		return false, err
	}
	return len(ps) > 0, nil
}

// settleMigrateSchema is settleSchema for migrate, which makes the tables:
// with no schema holding them yet, it makes them in the default one.
func (s *settings) settleMigrateSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if s.given("schema") {
		return nil
	}
	found, err := schema.Find(ctx, pool)
	if err != nil {
		return err
	}
	switch len(found) {
	case 0:
		s.schema = consumer.DefaultSchema
		return nil
	case 1:
		s.schema = found[0]
		return nil
	}
	return fmt.Errorf("%d schemas hold kafkaonce's tables (%s): pass --schema to say which to migrate", len(found), strings.Join(found, ", "))
}

// loadRecord returns what consumerName recorded in the schema, nil when it
// recorded nothing (it has not started since kafkaonce began recording, or
// the schema is older than that: the commands that need the latest schema
// say so themselves).
func (s *settings) loadRecord(ctx context.Context, pool *pgxpool.Pool, consumerName string) (*recorded.Settings, error) {
	if consumerName == "" {
		return nil, nil
	}
	v, err := schema.Version(ctx, pool, s.schema)
	if err != nil || v < schema.LatestVersion() {
		return nil, err
	}
	store, err := recorded.NewStore(s.schema)
	if err != nil {
		return nil, fmt.Errorf("--schema %w", err)
	}
	rec, ok, err := store.Load(ctx, pool, consumerName)
	if err != nil || !ok {
		return nil, err
	}
	return &rec, nil
}

// loadRecords returns what every consumer of the schema recorded (nothing
// in a schema older than the record).
func (s *settings) loadRecords(ctx context.Context, pool *pgxpool.Pool) ([]recorded.Settings, error) {
	return consumerstatus.Records(ctx, pool, s.schema)
}

// noRecord says why a setting could not come from the consumer's record.
func noRecord(consumerName string) string {
	return fmt.Sprintf("consumer %s has recorded no settings (it has not started since kafkaonce began recording them)", consumerName)
}

// groupOf is the consumer group: --group, else the recorded one, else the
// consumer's name (Config.GroupID's default).
var groupOf = consumerstatus.GroupOf

// topicOf is the one topic a command reads: --topic, else the consumer's
// only recorded topic.
func topicOf(flag string, rec *recorded.Settings, consumerName string) (string, error) {
	switch {
	case flag != "":
		return flag, nil
	case rec == nil:
		return "", fmt.Errorf("--topic is required: %s", noRecord(consumerName))
	case len(rec.Topics) == 1:
		return rec.Topics[0], nil
	}
	return "", fmt.Errorf("--topic is required: consumer %s reads %d topics (%s); name one", consumerName, len(rec.Topics), strings.Join(rec.Topics, ", "))
}

// idChoice is the rule an audit derives ids by, and where it came from.
type idChoice struct {
	rule consumer.MessageIDRule
	// from is "--id", "record" or "default".
	from string
}

// idRuleOf is the rule ids are derived by: --id, else the recorded rule,
// else the default header. A consumer recorded as deriving ids with a
// function of its own is an error at once: no tool can run that function,
// and any rule it assumed would call the messages missing.
func idRuleOf(flag string, rec *recorded.Settings, consumerName string) (idChoice, error) {
	switch {
	case flag != "":
		r, err := consumer.ParseMessageIDRule(flag)
		if err != nil {
			return idChoice{}, fmt.Errorf("--id: %w", err)
		}
		return idChoice{rule: r, from: "--id"}, nil
	case rec == nil:
		return idChoice{rule: consumer.IDFromHeader(consumer.DefaultMessageIDHeader), from: "default"}, nil
	case rec.MessageIDRule == recorded.Custom:
		return idChoice{}, fmt.Errorf("consumer %s derives message ids with a function of its own (its Config.MessageID is a MessageIDFunc), which kafkaonce cannot run: pass --id with the rule that function follows, one of %s",
			consumerName, consumer.MessageIDRuleForms)
	}
	r, err := consumer.ParseMessageIDRule(rec.MessageIDRule)
	if err != nil {
		return idChoice{}, fmt.Errorf("consumer %s records its message ids as %q, which this kafkaonce cannot read (%v): upgrade kafkaonce, or pass --id", consumerName, rec.MessageIDRule, err)
	}
	return idChoice{rule: r, from: "record"}, nil
}

// groupKind is the kind of group a command takes the consumer's to be
// (recorded.ConsumerGroup or recorded.ShareGroup), and where that came
// from: "--group-type", "record" or "default".
type groupKind struct{ typ, from string }

// groupTypeOf is the kind of the consumer's group: --group-type, else
// the kind it recorded, else a consumer group (a consumer that recorded
// nothing last ran before share groups).
func groupTypeOf(flag string, rec *recorded.Settings) (groupKind, error) {
	switch {
	case flag == recorded.ConsumerGroup || flag == recorded.ShareGroup:
		return groupKind{flag, "--group-type"}, nil
	case flag != "":
		return groupKind{}, fmt.Errorf("--group-type: %q is neither %s nor %s", flag, recorded.ConsumerGroup, recorded.ShareGroup)
	case rec == nil:
		return groupKind{recorded.ConsumerGroup, "default"}, nil
	case rec.GroupType == recorded.ShareGroup:
		return groupKind{recorded.ShareGroup, "record"}, nil
	}
	return groupKind{recorded.ConsumerGroup, "record"}, nil
}

// kafkaSettings are how a command reaches Kafka.
type kafkaSettings struct {
	brokers []string
	// from names where the brokers came from: --brokers, KAFKA_BROKERS or
	// the consumer's record.
	from string
	tls  bool
	sasl string
}

// kafkaSettings chooses the brokers: --brokers, else KAFKA_BROKERS (the
// operator's own settings, which know how Kafka is reached from where the
// tool runs), else rec, the record of who (a phrase: "consumer ledger"),
// whose TLS and SASL mechanism then apply unless --kafka-tls or
// --kafka-sasl say otherwise. Credentials are never recorded: SASL still
// needs --kafka-user and KAFKA_PASSWORD.
func (s *settings) kafkaSettings(rec *recorded.Settings, who string) (kafkaSettings, error) {
	k := kafkaSettings{brokers: splitBrokers(s.brokers), from: "--brokers", tls: s.kafkaTLS, sasl: s.saslMech}
	if len(k.brokers) == 0 {
		k.brokers, k.from = splitBrokers(s.st.getenv("KAFKA_BROKERS")), "KAFKA_BROKERS"
	}
	if len(k.brokers) > 0 {
		if rec != nil && !slices.ContainsFunc(k.brokers, func(b string) bool { return slices.Contains(rec.Brokers, b) }) {
			// Another address of the same cluster is likely (a port-forward,
			// another listener), another cluster possible: say so.
			fmt.Fprintf(s.st.err, "kafkaonce: using the brokers of %s (%s); %s records %s\n", k.from, strings.Join(k.brokers, ","), who, strings.Join(rec.Brokers, ","))
		}
		return k, nil
	}
	if rec == nil || len(rec.Brokers) == 0 {
		why := "no Kafka brokers: set KAFKA_BROKERS or pass --brokers host:port"
		if who != "" {
			why += "; " + who + " has recorded none"
		}
		return k, errors.New(why)
	}
	k.brokers, k.from = rec.Brokers, "the record of "+who
	if !s.given("kafka-tls") {
		k.tls = rec.KafkaTLS
	}
	if !s.given("kafka-sasl") && rec.KafkaSASL != "" {
		k.sasl = strings.ToLower(rec.KafkaSASL)
		if !slices.Contains(saslFlagValues, k.sasl) {
			return k, fmt.Errorf("%s reaches Kafka (%s) with SASL %s, as it records, which kafkaonce does not support: pass --brokers and --kafka-sasl for a listener it can use (%s)",
				who, strings.Join(rec.Brokers, ","), rec.KafkaSASL, strings.Join(saslFlagValues, ", "))
		}
		if (k.sasl == "plain" || strings.HasPrefix(k.sasl, "scram")) && s.saslUser == "" {
			return k, fmt.Errorf("%s reaches Kafka (%s) with SASL %s, as it records: pass --kafka-user and set KAFKA_PASSWORD (or --kafka-sasl to choose another mechanism)",
				who, strings.Join(rec.Brokers, ","), rec.KafkaSASL)
		}
	}
	return k, nil
}

// splitBrokers parses a comma-separated broker list (--brokers,
// KAFKA_BROKERS), ignoring blanks, as the library's dev environment reads
// KAFKA_BROKERS.
func splitBrokers(s string) []string {
	var out []string
	for _, b := range strings.Split(s, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

// sharedKafka is the Kafka connection every consumer of the schema
// records, for a command that serves them all (serve): nil when none
// records one, an error when they name different ones.
func sharedKafka(records []recorded.Settings) (*recorded.Settings, error) {
	var shared *recorded.Settings
	var differ []string
	for i := range records {
		r := &records[i]
		switch {
		case shared == nil:
			shared = r
		case !slices.Equal(slices.Sorted(slices.Values(r.Brokers)), slices.Sorted(slices.Values(shared.Brokers))) || r.KafkaTLS != shared.KafkaTLS || r.KafkaSASL != shared.KafkaSASL:
			differ = append(differ, r.Consumer+" ("+strings.Join(r.Brokers, ",")+")")
		}
	}
	if len(differ) > 0 {
		return nil, fmt.Errorf("no Kafka brokers given, and the consumers record different ones: %s (%s), %s: pass --brokers or set KAFKA_BROKERS",
			shared.Consumer, strings.Join(shared.Brokers, ","), strings.Join(differ, ", "))
	}
	return shared, nil
}
