package kafkaclient

import "context"

// SetBounds replaces the log-bounds lookup of f.
func SetBounds(f *Fetcher, bounds func(ctx context.Context) (Bounds, error)) { f.bounds = bounds }
