package sink

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ingest"
)

// The scope rule, write by write: stored records reset the refused writes
// in a row; a lone refused record is a verdict about it; a uniform refusal
// of two or more records, or after another refused write, fails as a whole
// until its records are answered so again often enough.
func TestRefusalsObserve(t *testing.T) {
	t.Parallel()
	var r refusals
	// A lone bad record after stored ones: a verdict about it.
	require.Zero(t, r.observe("ok", 5, true, false, false))
	require.Zero(t, r.observe("bad1", 1, false, true, true))
	// A second refused write with nothing stored between: suspect; its
	// probe answers the same and it is dead-lettered.
	require.Positive(t, r.observe("bad2", 1, false, true, true))
	require.Zero(t, r.observe("bad2", 1, false, true, true))
	// Stored again: the next lone refusal is a verdict at once.
	require.Zero(t, r.observe("ok2", 3, true, false, false))
	require.Zero(t, r.observe("bad3", 1, false, true, true))

	// A batch refused as a whole, with nothing refused before it: one probe.
	r = refusals{}
	require.Positive(t, r.observe("batch", 10, false, true, true))
	require.Zero(t, r.observe("ok", 3, true, false, false)) // other writes store meanwhile
	require.Zero(t, r.observe("batch", 10, false, true, true))

	// Mixed refusals (400 and 422), or a refusal beside a stored record, are
	// verdicts about the records.
	r = refusals{}
	require.Zero(t, r.observe("mixed", 10, false, true, false))
	require.Zero(t, r.observe("partly", 10, true, true, false))
}

// An API that refuses everything the same way: the writes fail as a whole,
// and the records dead-lettered before the refusals are taken for what they
// are stay few; the probes needed per write grow to maxConfirmations.
func TestRefusalsOfEverythingPauseMoreAndMore(t *testing.T) {
	t.Parallel()
	var r refusals
	deadLettered, probes := 0, 0
	needs := []int{}
	for w := range 6 {
		key := fmt.Sprint("w", w)
		n := 0
		for 0 < r.observe(key, 1, false, true, true) {
			n++
		}
		probes += n
		needs = append(needs, n)
		deadLettered++
	}
	require.Equal(t, []int{0, 1, 3, 7, 15, 16}, needs, "failed answers before each write's records are dead-lettered")
	require.Equal(t, 42, probes)
	require.Equal(t, 6, deadLettered)
	for w := range 3 {
		n := 0
		for 0 < r.observe(fmt.Sprint("later", w), 1, false, true, true) {
			n++
		}
		require.Equal(t, maxConfirmations, n, "capped")
	}
}

// The rule through Write: a bad record among stored ones is dead-lettered
// at once; a write whose every request answered the same 400 with nothing
// stored fails as a whole, and the same write answered so again is
// dead-lettered record by record.
func TestRESTSinkScopeOfRefusals(t *testing.T) {
	t.Parallel()
	var refuseAll atomic.Bool
	api := newFaultAPI(t, func(r restRequest) (int, http.Header, string) {
		if refuseAll.Load() || strings.HasPrefix(r.path, "/items/bad") {
			return http.StatusBadRequest, nil, `{"error":"unknown field"}`
		}
		return http.StatusCreated, nil, ""
	})
	s := api.sink(t, RESTConfig{URL: "/items/{$id}"})
	res, err := s.Write(t.Context(), []ingest.Record{rec("a", `{}`), rec("bad-1", `{}`), rec("c", `{}`)})
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Delivered, ingest.Permanent, ingest.Delivered}, outcomesOf(res))
	res, err = s.Write(t.Context(), []ingest.Record{rec("bad-2", `{}`)})
	require.NoError(t, err, "a lone refused record after stored ones")
	require.Equal(t, ingest.Permanent, res[0].Outcome)

	refuseAll.Store(true)
	batch := []ingest.Record{rec("d", `{}`), rec("e", `{}`)}
	res, err = s.Write(t.Context(), batch)
	require.Nil(t, res)
	var se *ingest.SinkError
	require.ErrorAs(t, err, &se)
	require.ErrorContains(t, err, `HTTP 400: {"error":"unknown field"}: every request of the write was refused so`)
	require.ErrorContains(t, err, "refused so 1 more times")
	// The pipeline's probe: the same write, alone.
	res, err = s.Write(t.Context(), batch)
	require.NoError(t, err)
	require.Equal(t, []ingest.Outcome{ingest.Permanent, ingest.Permanent}, outcomesOf(res))
	// The next write, with nothing stored since, needs more probes: as
	// many as the refused writes in a row before it (d+e twice, bad-2).
	next := []ingest.Record{rec("f", `{}`)}
	for range 3 {
		_, err = s.Write(t.Context(), next)
		require.Error(t, err)
	}
	res, err = s.Write(t.Context(), next)
	require.NoError(t, err)
	require.Equal(t, ingest.Permanent, res[0].Outcome)

	refuseAll.Store(false)
	res, err = s.Write(t.Context(), []ingest.Record{rec("g", `{}`)})
	require.NoError(t, err)
	require.Equal(t, ingest.Delivered, res[0].Outcome)
	res, err = s.Write(t.Context(), []ingest.Record{rec("bad-3", `{}`)})
	require.NoError(t, err, "stored again: a lone refusal is a verdict at once")
	require.Equal(t, ingest.Permanent, res[0].Outcome)
}
