package pacing_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pacing"
)

// fixedRate is a capacity that never changes: leases worth rate units/s,
// held forever. The lease side (lease.Manager) provides the real one.
type fixedRate float64

func (r fixedRate) Rate(time.Time) float64 { return float64(r) }

func (r fixedRate) Credit(from, to time.Time) float64 { return float64(r) * to.Sub(from).Seconds() }

func Example() {
	// 1,000 units/s in 200 ms slices: 200 units per slice.
	p, err := pacing.New(pacing.Config{}, fixedRate(1000))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()

	budget, err := p.Next(ctx, 1) // the first slice opens at once
	fmt.Println("budget:", budget, err)
	sent, err := p.Spend(ctx, budget) // right before sending that much
	if err != nil {
		fmt.Println(err)
		return
	}
	sent.Answered() // once the sink's answer is in: the send leaves the account 1 s later

	_, err = p.Next(ctx, 1) // the next slice opens after ctx's deadline
	fmt.Println(err)
	// Output:
	// budget: 200 <nil>
	// context deadline exceeded
}

// A record costing more than a slice is admitted whole when the sliding
// account has room for it; the excess is debt, repaid before the next slices
// get a budget.
func Example_debt() {
	p, err := pacing.New(pacing.Config{}, fixedRate(1000))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	budget, _ := p.Next(ctx, 500) // 2.5 slices' worth at the head of the line
	fmt.Println("budget:", budget)
	sent, _ := p.Spend(ctx, budget) // 200 from this slice, 300 owed
	sent.Answered()

	budget, _ = p.Next(ctx, 1) // 200 ms later, repaying
	fmt.Println("budget:", budget)
	// Output:
	// budget: 500
	// budget: 0
}
