package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// The rolling restart measures the consumer protocol's variants only on a
// broker that serves the protocol: on one that does not, the classic
// variants still run, and the section says which rows are left out and
// why instead of failing.
func TestRollingRestartVariants(t *testing.T) {
	unavailable := fmt.Errorf("franz: %w: the broker serves ConsumerGroupHeartbeat only up to version 0", franz.ErrConsumerProtocolUnavailable)
	classic := []string{
		"classic: eager (kafka-go)",
		"classic: cooperative (franz-go)",
		"classic: cooperative, static members (franz-go, InstanceID)",
	}
	all := append(classic[:len(classic):len(classic)],
		"consumer: the broker assigns (franz-go)",
		"consumer: the broker assigns, static members (franz-go, InstanceID)")
	for _, tc := range []struct {
		name    string
		served  error
		want    []string
		skipped []string // what the skipped line says; none: no line
	}{
		{"a broker serving the consumer protocol: all five", nil, all, nil},
		{"a broker without it: the classic three, and why not the others", unavailable, classic,
			[]string{"The consumer protocol's rows are left out", "only up to version 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := planRolling(tc.served)
			var got []string
			for _, v := range plan.variants {
				got = append(got, v.key())
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("variants %q, want %q", got, tc.want)
			}
			if len(tc.skipped) == 0 && plan.skipped != "" {
				t.Fatalf("skipped %q, want none", plan.skipped)
			}
			for _, s := range tc.skipped {
				if !strings.Contains(plan.skipped, s) {
					t.Errorf("skipped %q, want it to say %q", plan.skipped, s)
				}
			}

			// The section has a row per variant run, naming its
			// protocol, and the skipped line under the table.
			var results []rollingResult
			for _, v := range plan.variants {
				results = append(results, rollingResult{Variant: v.key(), Bystanders: time.Second, Own: 2 * time.Second, Assigned: 4})
			}
			md := rollingMarkdown(results, plan, "4.3", options{rounds: 1}, &env{brokerDesc: "Kafka at test"})
			for _, v := range plan.variants {
				row := fmt.Sprintf("| %s | %s | 4 | 1.00 | 1.00 | 2.00 | 2.00 |", v.protocolName(), v.name)
				if !strings.Contains(md, row) {
					t.Errorf("no row %q in:\n%s", row, md)
				}
			}
			if n := strings.Count(md, "| consumer (KIP-848) |"); n != len(tc.want)-len(classic) {
				t.Errorf("%d consumer protocol rows, want %d:\n%s", n, len(tc.want)-len(classic), md)
			}
			if plan.skipped != "" && !strings.Contains(md, "\n"+plan.skipped+"\n") {
				t.Errorf("the skipped line is missing:\n%s", md)
			}
		})
	}
}
