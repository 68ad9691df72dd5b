package bench

import "context"

func (r *runner) scenario5(ctx context.Context) ([]Scenario, error) { return nil, nil }
func (r *runner) scenario6(ctx context.Context) ([]Scenario, error) { return nil, nil }
func (r *runner) scenario7(ctx context.Context) ([]Scenario, error) { return nil, nil }
