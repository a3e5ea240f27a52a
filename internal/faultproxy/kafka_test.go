package faultproxy_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// A client given the proxy as its broker reaches the broker through it
// alone, though the broker advertises its own address: Cut takes that
// client off the network, and no other, until Restore.
func TestKafkaCutTakesOnlyTheProxiedClientOff(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p, err := faultproxy.StartKafka(c.ListenAddrs()[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	client := func(broker string) *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.RetryTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	proxied, direct := client(p.Addr()), client(c.ListenAddrs()[0])
	// A metadata request of the client's own, on its connection to the
	// broker it learned.
	reach := func(cl *kgo.Client) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
		return err
	}
	if err := reach(proxied); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	resp, err := kmsg.NewPtrMetadataRequest().RequestWith(context.Background(), proxied)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range resp.Brokers {
		if got := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port))); got != p.Addr() {
			t.Fatalf("the client learned broker %s, not the proxy's %s", got, p.Addr())
		}
	}
	p.Cut()
	if err := reach(proxied); err == nil {
		t.Fatal("the proxied client reached the broker while cut")
	}
	if err := reach(direct); err != nil {
		t.Fatalf("the direct client was cut too: %v", err)
	}
	p.Restore()
	deadline := time.Now().Add(20 * time.Second)
	for reach(proxied) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the proxied client did not reach the broker again after Restore")
		}
	}
}
