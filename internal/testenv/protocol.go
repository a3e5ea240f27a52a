package testenv

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// consumerProtocolOffered caches, per broker list, whether the brokers
// offer the consumer group protocol.
var consumerProtocolOffered sync.Map // string -> error (nil: offered)

// RequireConsumerProtocol skips the test unless brokers serve the consumer
// group protocol (KIP-848) as kgo speaks it: ConsumerGroupHeartbeat v1
// among their ApiVersions (Kafka 4.0 and later; 3.9 serves v0 at most, and
// only when enabled). The answer is asked once per broker list.
func RequireConsumerProtocol(tb testing.TB, brokers []string) {
	tb.Helper()
	if err := consumerProtocolOffer(tb, brokers); err != nil {
		tb.Skipf("the consumer group protocol is not tested on %v: %v", brokers, err)
	}
}

// ConsumerProtocolServed reports whether brokers serve the consumer group
// protocol (see RequireConsumerProtocol).
func ConsumerProtocolServed(tb testing.TB, brokers []string) bool {
	tb.Helper()
	return consumerProtocolOffer(tb, brokers) == nil
}

func consumerProtocolOffer(tb testing.TB, brokers []string) error {
	tb.Helper()
	key := fmt.Sprint(brokers)
	v, ok := consumerProtocolOffered.Load(key)
	if !ok {
		v, _ = consumerProtocolOffered.LoadOrStore(key, consumerProtocolCheck(tb, brokers))
	}
	err, _ := v.(error)
	return err
}

func consumerProtocolCheck(tb testing.TB, brokers []string) any {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		tb.Fatalf("testenv: ApiVersions of %v: %v", brokers, err)
	}
	for _, k := range resp.ApiKeys {
		if k.ApiKey == kmsg.ConsumerGroupHeartbeat.Int16() && k.MaxVersion >= 1 {
			return nil
		}
	}
	return fmt.Errorf("the broker serves no ConsumerGroupHeartbeat v1: the consumer group protocol needs Kafka 4.0 or later")
}
