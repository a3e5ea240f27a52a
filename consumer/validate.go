package consumer

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// validate checks a Config that went through withDefaults and returns every
// problem found, each naming the field, the rule and a fix.
func validate(c *Config) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("consumer: "+format, args...))
	}
	checkNames(c, bad)
	checkUserCode(c, bad)
	checkBatching(c, bad)
	checkKafka(c, bad)
	checkSessionTimeouts(c, bad)
	checkGroup(c, bad)
	checkRetry(c, bad)
	checkRetryLater(c, bad)
	checkBreaker(c.CircuitBreaker, bad)
	checkHandlerTimeout(c, bad)
	checkFailures(c, bad)
	checkPruning(c, bad)
	checkShareGroup(c, bad)
	checkGroupProtocol(c, bad)
	return errors.Join(errs...)
}

// checkUnsetUnderConsumerProtocol checks the Config as the user gave it,
// before defaults: under the consumer protocol the broker keeps a group's
// session timeout and heartbeat interval, so a member's own would be
// ignored without a word.
func checkUnsetUnderConsumerProtocol(c *Config) error {
	if c.GroupProtocol != ConsumerProtocol {
		return nil
	}
	var errs []error
	for _, f := range []struct {
		field, config string
		d             time.Duration
	}{{"SessionTimeout", "consumer.session.timeout.ms", c.SessionTimeout}, {"HeartbeatInterval", "consumer.heartbeat.interval.ms", c.HeartbeatInterval}} {
		if f.d != 0 {
			errs = append(errs, fmt.Errorf("consumer: %s is the group's setting under GroupProtocol ConsumerProtocol, which the broker keeps: leave %s unset and set the group's %s, e.g. kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config %s=%d",
				f.field, f.field, f.config, cmp.Or(c.GroupID, c.Name), f.config, f.d.Milliseconds()))
		}
	}
	return errors.Join(errs...)
}

// checkNames checks what the consumer is called and reads: its name and
// group, the brokers and the topics.
func checkNames(c *Config, bad func(string, ...any)) {
	if err := validateName(c.Name); err != nil {
		bad("Name %v; it names the dedupe scope, e.g. \"ledger\"", err)
	}
	if c.GroupID != c.Name {
		if err := validateName(c.GroupID); err != nil {
			bad("GroupID %v (or leave it empty to use Name)", err)
		}
	}
	if len(c.Brokers) == 0 {
		bad(`Brokers must list at least one broker address, e.g. []string{"localhost:9092"}`)
	}
	for i, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("Brokers[%d] must be host:port (got %q)", i, b)
		}
	}
	if len(c.Topics) == 0 {
		bad(`Topics must name at least one topic, e.g. []string{"transfers"}`)
	}
	seen := map[string]bool{}
	for i, t := range c.Topics {
		if err := validateTopic(t); err != nil {
			bad("Topics[%d] %v", i, err)
		}
		if seen[t] {
			bad("Topics[%d] repeats %q; name each topic once", i, t)
		}
		seen[t] = true
	}
}

// checkUserCode checks the handlers and the message id source.
func checkUserCode(c *Config, bad func(string, ...any)) {
	switch {
	case c.Handler == nil && c.BatchHandler == nil:
		bad("Handler must be set: it applies each message, e.g. consumer.HandlerFunc(func(ctx, tx, msg) error { ... }) (or set BatchHandler to apply a batch per call)")
	case c.Handler != nil && c.BatchHandler != nil:
		bad("Handler and BatchHandler are both set; set one: Handler for a call per message, BatchHandler for a call per batch")
	}
	if isNilInside(c.MessageID) {
		// A nil *MessageIDRule (or a nil value of a type of your own)
		// would panic on every message and set each one aside.
		bad("MessageID is a nil %T: set a rule (consumer.IDFromHeader(\"message-id\"), IDFromJSONField, …), a MessageIDFunc, or leave it unset for the default", c.MessageID)
	}
	if r, ok := ruleOf(c.MessageID); ok {
		if err := r.check(); err != nil {
			bad("MessageID %v", err)
		}
	}
}

// checkBatching checks how batches are filled.
func checkBatching(c *Config, bad func(string, ...any)) {
	if c.MaxBatch < 1 || c.MaxBatch > MaxMaxBatch {
		bad("MaxBatch must be between 1 and %d (got %d)", MaxMaxBatch, c.MaxBatch)
	}
	if c.MaxWait < 0 || c.MaxWait > 10*time.Second {
		bad("MaxWait must be between 0 and 10s (got %v)", c.MaxWait)
	}
}

// checkKafka checks how the consumer reads Kafka: the client, the
// connection and the fetching.
func checkKafka(c *Config, bad func(string, ...any)) {
	switch c.KafkaClient {
	case FranzGo:
		if c.Dialer != nil {
			bad("Dialer is kafka-go's and is used only with KafkaClient: consumer.KafkaGo; with franz-go (the default) set TLS and SASL instead")
		}
	case KafkaGo:
		if c.InstanceID != "" {
			bad("InstanceID (static membership) needs KafkaClient: consumer.FranzGo; kafka-go has no static membership")
		}
	default:
		bad("KafkaClient must be consumer.FranzGo or consumer.KafkaGo (got %d)", c.KafkaClient)
	}
	if c.Dialer != nil && (c.TLS != nil || c.SASL != nil) {
		bad("Dialer and TLS or SASL are both set: set the Dialer's own TLS and SASLMechanism, or leave Dialer unset")
	}
	if err := c.SASL.CheckOver(c.TLS); err != nil {
		bad("%v", err)
	}
	if c.InstanceID != "" {
		if err := validateName(c.InstanceID); err != nil {
			bad("InstanceID %v; give each process its own stable id, e.g. the pod's name", err)
		}
	}
	if c.MetadataMaxAge < time.Second || c.MetadataMaxAge > time.Hour {
		bad("MetadataMaxAge must be between 1s and 1h (got %v)", c.MetadataMaxAge)
	}
	if c.OpenTransactionAfter < 100*time.Millisecond {
		bad("OpenTransactionAfter must be at least 100ms (got %v)", c.OpenTransactionAfter)
	}
	if c.StallAfter < time.Second {
		bad("StallAfter must be at least 1s (got %v): it is how long a partition may make no progress before the consumer is reported not live", c.StallAfter)
	}
	if c.StartOffset != StartEarliest && c.StartOffset != StartLatest {
		bad("StartOffset must be StartEarliest or StartLatest (got %d)", c.StartOffset)
	}
	if c.FetchMaxBytes < 1024 || c.FetchMaxBytes > 256<<20 {
		bad("FetchMaxBytes must be between 1 KiB and 256 MiB (got %d)", c.FetchMaxBytes)
	}
}

// checkSessionTimeouts checks the schema, the shutdown bound and the
// settings of each transaction.
func checkSessionTimeouts(c *Config, bad func(string, ...any)) {
	if err := schema.ValidateName(c.Schema); err != nil {
		bad("Schema %v", err)
	}
	if c.ShutdownTimeout < 0 {
		bad("ShutdownTimeout must not be negative (got %v)", c.ShutdownTimeout)
	}
	for _, st := range []struct {
		name string
		d    time.Duration
	}{{"StatementTimeout", c.StatementTimeout}, {"LockTimeout", c.LockTimeout}, {"IdleInTransactionTimeout", c.IdleInTransactionTimeout}} {
		if st.d != LeaveUnset && st.d < time.Millisecond {
			bad("%s must be at least 1ms, or consumer.LeaveUnset to keep the server's setting (got %v)", st.name, st.d)
		}
	}
}

// checkGroup checks the consumer group protocol's settings.
func checkGroup(c *Config, bad func(string, ...any)) {
	if c.SessionTimeout < time.Second {
		bad("SessionTimeout must be at least 1s (got %v)", c.SessionTimeout)
	}
	if c.RebalanceTimeout < time.Second {
		bad("RebalanceTimeout must be at least 1s (got %v)", c.RebalanceTimeout)
	}
	if c.HeartbeatInterval <= 0 || c.HeartbeatInterval*3 > c.SessionTimeout {
		bad("HeartbeatInterval must be positive and at most a third of SessionTimeout (%v), so a member heartbeats a few times per session (got %v)", c.SessionTimeout, c.HeartbeatInterval)
	}
}

// checkRetry checks the retries in place (Config.Retry).
func checkRetry(c *Config, bad func(string, ...any)) {
	if c.Retry.InitialInterval <= 0 || c.Retry.MaxInterval < c.Retry.InitialInterval {
		bad("Retry.InitialInterval must be positive and at most Retry.MaxInterval (got %v and %v)", c.Retry.InitialInterval, c.Retry.MaxInterval)
	}
	if c.Retry.MaxAttempts < 1 || c.Retry.MaxAttempts > 1000 {
		bad("Retry.MaxAttempts must be between 1 and 1000 (got %d)", c.Retry.MaxAttempts)
	}
	if c.Retry.MaxElapsed < 0 {
		bad("Retry.MaxElapsed must not be negative (got %v)", c.Retry.MaxElapsed)
	}
}

// checkRetryLater checks the retries later (Config.RetryLater), and that
// the failure policy leaves them something to set aside.
func checkRetryLater(c *Config, bad func(string, ...any)) {
	if c.RetryLater.After < 0 || c.RetryLater.After > c.RetryLater.MaxDelay {
		bad("RetryLater.After must be between 0 and RetryLater.MaxDelay (got %v and %v)", c.RetryLater.After, c.RetryLater.MaxDelay)
	}
	switch {
	case c.RetryLater.MaxElapsed < 0:
		bad("RetryLater.MaxElapsed must not be negative (got %v)", c.RetryLater.MaxElapsed)
	case c.RetryLater.MaxElapsed > 0 && c.RetryLater.MaxRetries == 0:
		// Bounded by time alone.
	case c.RetryLater.MaxRetries < 1 || c.RetryLater.MaxRetries > 1000:
		bad("RetryLater.MaxRetries must be between 1 and 1000 (got %d)", c.RetryLater.MaxRetries)
	}
	if c.RetryLater.After > 0 && c.OnPermanentFailure == StopPartition {
		bad("RetryLater.After sets failing messages aside, and OnPermanentFailure StopPartition stops the partition instead: a consumer that must not skip a message cannot retry it later; leave RetryLater.After zero, or use DeadLetter")
	}
}

// checkHandlerTimeout checks HandlerTimeout, and that the lock and idle
// timeouts end on the right side of it.
func checkHandlerTimeout(c *Config, bad func(string, ...any)) {
	if c.HandlerTimeout < 10*time.Millisecond {
		bad("HandlerTimeout must be at least 10ms (got %v)", c.HandlerTimeout)
	}
	if c.LockTimeout != LeaveUnset && c.LockTimeout >= c.HandlerTimeout {
		bad("LockTimeout must be shorter than HandlerTimeout (got %v and %v): a wait for a row lock that HandlerTimeout cuts counts as the message's failure and sets it aside after Retry.MaxAttempts, where one that LockTimeout ends is contention, retried without counting; lower LockTimeout (or leave it unset: it then defaults to half of HandlerTimeout when that is under %v) or raise HandlerTimeout",
			c.LockTimeout, c.HandlerTimeout, 2*DefaultLockTimeout)
	}
	if c.IdleInTransactionTimeout != LeaveUnset && c.IdleInTransactionTimeout >= time.Millisecond && c.IdleInTransactionTimeout <= c.HandlerTimeout {
		bad("IdleInTransactionTimeout must be longer than HandlerTimeout (got %v and %v): a handler working without statements (a slow lookup) would have its transaction ended by the server on every attempt, and the batch would be retried for ever; raise IdleInTransactionTimeout or lower HandlerTimeout",
			c.IdleInTransactionTimeout, c.HandlerTimeout)
	}
}

// checkFailures checks what becomes of messages that cannot be applied or
// look duplicated.
func checkFailures(c *Config, bad func(string, ...any)) {
	if c.OnPermanentFailure != DeadLetter && c.OnPermanentFailure != StopPartition {
		bad("OnPermanentFailure must be DeadLetter or StopPartition (got %d)", c.OnPermanentFailure)
	}
	if c.DeadLetterTopic != "" {
		if err := validateTopic(c.DeadLetterTopic); err != nil {
			bad("DeadLetterTopic %v", err)
		}
		for _, t := range c.Topics {
			if t == c.DeadLetterTopic {
				bad("DeadLetterTopic must not be one of Topics (%q): the consumer would read its own dead letters", t)
			}
		}
	}
	if c.SuspectDuplicateWindow != LeaveUnset && c.SuspectDuplicateWindow < time.Second {
		bad("SuspectDuplicateWindow must be at least 1s, or consumer.LeaveUnset to turn detection off (got %v)", c.SuspectDuplicateWindow)
	}
	if c.SuspectDuplicates != ReportSuspects && c.SuspectDuplicates != SkipSuspects {
		bad("SuspectDuplicates must be ReportSuspects or SkipSuspects (got %d)", c.SuspectDuplicates)
	}
}

// checkPruning checks the background pruning: Config.Prune and
// Config.Pruners.
func checkPruning(c *Config, bad func(string, ...any)) {
	if c.Prune.Interval < 0 {
		bad("Prune.Interval must not be negative (got %v)", c.Prune.Interval)
	}
	if c.Prune.Retention < dedupe.MinRetention {
		bad("Prune.Retention must be at least %v, so that producer re-sends are still recognised (got %v)", dedupe.MinRetention, c.Prune.Retention)
	}
	if c.Prune.Batch < 1 || c.Prune.Batch > 100000 {
		bad("Prune.Batch must be between 1 and 100000 (got %d)", c.Prune.Batch)
	}
	if len(c.Pruners) > 0 && c.Prune.Interval == 0 {
		bad("Pruners are set but Prune.Interval is 0, so they would never run: set Prune.Interval, or leave Pruners empty and run kafkaonce prune")
	}
	for i, p := range c.Pruners {
		if p.Step == nil {
			bad("Pruners[%d] (%q) has no Step: take a feature's own, such as idempotency.Store.Pruner()", i, p.Table)
		}
	}
}

func validateName(s string) error {
	switch {
	case s == "":
		return errors.New("must be set")
	case len(s) > MaxNameLen:
		return fmt.Errorf("must be at most %d bytes (got %d)", MaxNameLen, len(s))
	case !utf8.ValidString(s):
		return errors.New("must be valid UTF-8")
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("must be printable, without control characters or spaces other than ' ' (got %q)", s)
	case strings.TrimSpace(s) != s:
		return fmt.Errorf("must not start or end with spaces (got %q)", s)
	}
	return nil
}

// validateTopic applies Kafka's rules for topic names.
func validateTopic(t string) error {
	switch {
	case t == "":
		return errors.New("must not be empty")
	case t == "." || t == "..":
		return fmt.Errorf("must not be %q", t)
	case len(t) > 249:
		return fmt.Errorf("must be at most 249 characters (got %d)", len(t))
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("must use only letters, digits, '.', '_' and '-' (got %q)", t)
		}
	}
	return nil
}

// checkGroupProtocol checks the group protocol, and that the client and
// the kind of group can speak it.
func checkGroupProtocol(c *Config, bad func(string, ...any)) {
	switch c.GroupProtocol {
	case ClassicProtocol:
		return
	case ConsumerProtocol:
	default:
		bad("GroupProtocol must be consumer.ClassicProtocol or consumer.ConsumerProtocol (got %d)", c.GroupProtocol)
		return
	}
	if c.KafkaClient == KafkaGo {
		bad("GroupProtocol ConsumerProtocol needs KafkaClient: consumer.FranzGo (the default); kafka-go speaks only the classic protocol")
	}
	if c.GroupType == ShareGroup {
		bad("GroupProtocol ConsumerProtocol is for consumer groups; a share group has a protocol of its own: leave GroupProtocol unset")
	}
}

// checkShareGroup refuses, in a share group, the settings that are about
// partitions and positions, which a share group does not have: its members
// share partitions, read them in no order, and settle each record on its
// own.
func checkShareGroup(c *Config, bad func(string, ...any)) {
	switch c.GroupType {
	case ConsumerGroup:
		return
	case ShareGroup:
	default:
		bad("GroupType must be consumer.ConsumerGroup or consumer.ShareGroup (got %d)", c.GroupType)
		return
	}
	if c.KafkaClient == KafkaGo {
		bad("GroupType ShareGroup needs KafkaClient: consumer.FranzGo (the default); kafka-go has no share groups")
	}
	if c.StartOffset != StartEarliest {
		bad("StartOffset is not used by a share group: the group's own share.auto.offset.reset decides where it starts (\"latest\" unless set); leave StartOffset unset and set the group's config, e.g. kafka-configs.sh --alter --entity-type groups --entity-name %s --add-config share.auto.offset.reset=earliest", c.GroupID)
	}
	if c.InstanceID != "" {
		bad("InstanceID (static membership) is for consumer groups; a share group's members are all alike: leave InstanceID unset")
	}
	if c.OnPermanentFailure == StopPartition {
		bad("OnPermanentFailure StopPartition has no partition to stop in a share group (its members share partitions, and take records in no order): use DeadLetter (the default), which sets the record aside in dead_letters before it is rejected")
	}
	if c.SuspectDuplicates == SkipSuspects {
		bad("SuspectDuplicates SkipSuspects needs a partition read in order by one member, which a share group does not have: leave it at ReportSuspects (suspect duplicates are not looked for in a share group)")
	}
	if c.CircuitBreaker.Failures > 0 {
		bad("CircuitBreaker is not supported in a share group yet: leave CircuitBreaker.Failures at 0")
	}
}
