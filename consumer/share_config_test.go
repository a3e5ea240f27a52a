package consumer_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// A share group has no partitions of its own and no positions: New
// refuses the settings about them, each error naming the field and the
// fix, and accepts a share group otherwise.
func TestShareGroupConfig(t *testing.T) {
	t.Parallel()
	share := func(mutate func(*consumer.Config)) *consumer.Config {
		c := validConfig()
		c.GroupType = consumer.ShareGroup
		mutate(c)
		return c
	}
	t.Run("accepted", func(t *testing.T) {
		t.Parallel()
		c, err := consumer.New(unusedPool(t), share(func(*consumer.Config) {}))
		require.NoError(t, err)
		require.NotNil(t, c)
	})
	cases := []struct {
		name   string
		mutate func(*consumer.Config)
		want   []string
	}{
		{"kafka-go", func(c *consumer.Config) { c.KafkaClient = consumer.KafkaGo }, []string{"GroupType ShareGroup needs KafkaClient: consumer.FranzGo", "kafka-go has no share groups"}},
		{"start offset", func(c *consumer.Config) { c.StartOffset = consumer.StartLatest }, []string{"StartOffset is not used by a share group", "share.auto.offset.reset"}},
		{"instance id", func(c *consumer.Config) { c.InstanceID = "pod-0" }, []string{"InstanceID (static membership) is for consumer groups"}},
		{"stop partition", func(c *consumer.Config) { c.OnPermanentFailure = consumer.StopPartition }, []string{"OnPermanentFailure StopPartition has no partition to stop", "use DeadLetter"}},
		{"skip suspects", func(c *consumer.Config) { c.SuspectDuplicates = consumer.SkipSuspects }, []string{"SuspectDuplicates SkipSuspects", "ReportSuspects"}},
		{"circuit breaker", func(c *consumer.Config) { c.CircuitBreaker.Failures = 3 }, []string{"CircuitBreaker is not supported in a share group"}},
		{"unknown type", func(c *consumer.Config) { c.GroupType = 7 }, []string{"GroupType must be consumer.ConsumerGroup or consumer.ShareGroup (got 7)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := share(tc.mutate)
			if tc.name == "unknown type" {
				cfg.GroupType = 7
			}
			_, err := consumer.New(unusedPool(t), cfg)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.True(t, strings.HasPrefix(err.Error(), "consumer: "), err.Error())
		})
	}
}
