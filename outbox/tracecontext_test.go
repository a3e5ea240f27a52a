package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func TestWriteStoresTheTraceContextOfItsSpan(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ob, err := outbox.New(db.Schema)
	require.NoError(t, err)
	// The span a request's tracer would have started, sampled: the trace
	// API alone carries it (no SDK needed).
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	traceparent := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	mine := []outbox.Header{{Key: "a", Value: []byte("1")}}
	ids, err := ob.Write(ctx, db.Pool,
		outbox.Message{Destination: "t", Headers: mine},
		outbox.Message{Destination: "t", Headers: []outbox.Header{{Key: "traceparent", Value: []byte("chosen")}}})
	require.NoError(t, err)
	require.Len(t, mine, 1, "the caller's slice is left alone")
	untraced, err := ob.Write(context.Background(), db.Pool, outbox.Message{Destination: "t"})
	require.NoError(t, err)

	headers := func(id string) map[string]string {
		var raw []byte
		require.NoError(t, db.Pool.QueryRow(context.Background(), `SELECT headers FROM `+db.Table("outbox")+` WHERE id = $1`, id).Scan(&raw))
		var hs []outbox.Header
		require.NoError(t, json.Unmarshal(raw, &hs))
		out := map[string]string{}
		for _, h := range hs {
			out[h.Key] = string(h.Value)
		}
		return out
	}
	require.Equal(t, map[string]string{"a": "1", "traceparent": traceparent}, headers(ids[0]))
	require.Equal(t, map[string]string{"traceparent": "chosen"}, headers(ids[1]), "a parent the caller chose stands")
	require.Empty(t, headers(untraced[0]), "no span, no trace context")
}
