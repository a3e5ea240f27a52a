package otelhooks_test

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/propagation"
)

var errPoison = errors.New("poison")

func w3cInject(ctx context.Context, carrier map[string]string) {
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(carrier))
}
