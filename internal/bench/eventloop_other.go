//go:build !linux

package bench

import (
	"context"
	"time"
)

// offerEvents is offer with a goroutine per connection where there is no
// epoll.
func offerEvents(ctx context.Context, base string, rate float64, d, timeout time.Duration, l openLoad) error {
	return offerGoroutines(ctx, base, rate, d, timeout, l)
}
