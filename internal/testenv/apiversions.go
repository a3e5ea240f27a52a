package testenv

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// apiVersionsAsked caches, per broker list, a broker's ApiVersions answer:
// what the tests that need a feature of it (share groups, the consumer
// group protocol) are skipped on.
var apiVersionsAsked sync.Map // string -> *kmsg.ApiVersionsResponse

// apiVersions returns a broker of brokers' ApiVersions answer, asked once
// per broker list; the test fails when it cannot be had.
func apiVersions(tb testing.TB, brokers []string) *kmsg.ApiVersionsResponse {
	tb.Helper()
	key := strings.Join(brokers, ",")
	if v, ok := apiVersionsAsked.Load(key); ok {
		return v.(*kmsg.ApiVersionsResponse)
	}
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
	v, _ := apiVersionsAsked.LoadOrStore(key, resp)
	return v.(*kmsg.ApiVersionsResponse)
}
