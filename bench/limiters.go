package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"golang.org/x/time/rate"
)

// staticLimiter is the per-worker limiter alternative: a token bucket at
// capacity ÷ workers (golang.org/x/time/rate), burst one 200 ms slice of
// it or one batch, whichever is larger. It needs no coordination and
// wastes the share of any worker that has nothing to do.
func staticLimiter(unitsPerSecond float64, maxBatchCost int64) func(context.Context, int64) error {
	burst := max(int(unitsPerSecond*slice.Seconds()), int(maxBatchCost))
	lim := rate.NewLimiter(rate.Limit(unitsPerSecond), burst)
	return func(ctx context.Context, units int64) error { return lim.WaitN(ctx, int(units)) }
}

// gcraLimiter is the global Redis limiter alternative: GCRA
// (github.com/go-redis/redis_rate/v10) on one key shared by every worker,
// one AllowN call per batch, sleeping the answer's RetryAfter when denied.
// Its burst is one 200 ms slice of the capacity (or one batch), like
// sluice's; the library's PerSecond would allow a full second of burst.
func gcraLimiter(lim *redis_rate.Limiter, key string, unitsPerSecond float64, maxBatchCost int64) func(context.Context, int64) error {
	limit := redis_rate.Limit{Rate: int(unitsPerSecond), Period: time.Second,
		Burst: max(int(unitsPerSecond*slice.Seconds()), int(maxBatchCost))}
	return func(ctx context.Context, units int64) error {
		for {
			res, err := lim.AllowN(ctx, key, limit, int(units))
			if err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				return fmt.Errorf("gcra allow: %w", err)
			}
			if res.Allowed > 0 {
				return nil
			}
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(max(res.RetryAfter, time.Millisecond)):
			}
		}
	}
}
