package outbox_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

func TestWriteStoresTheTraceContextOfItsSpan(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ob, err := outbox.New(db.Schema)
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	traceparent := "00-" + span.SpanContext().TraceID().String() + "-" + span.SpanContext().SpanID().String() + "-01"

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
