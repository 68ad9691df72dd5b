package bulkload

import (
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/sluicehq/sluice/ingest"
)

// Screen is a terminal a load draws its progress bar on. Log lines
// written through it (make it the logger's writer) go above the bar: the
// bar's line is cleared first and drawn again at the next update, so no
// stale bar is left behind. The bar is one line that fits the terminal's
// width (at least 60 columns keep every figure; the bar itself is at
// least 10 characters), redrawn in place. Safe for concurrent use.
type Screen struct {
	f *os.File

	mu  sync.Mutex
	bar *progressbar.ProgressBar // nil while none is shown
}

// NewScreen returns a Screen on f; f should be a terminal (term.IsTerminal).
func NewScreen(f *os.File) *Screen { return &Screen{f: f} }

// Write writes p (whole log lines) above the progress bar.
func (s *Screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bar != nil {
		_ = s.bar.Clear()
	}
	return s.f.Write(p)
}

// width is the terminal's width in columns, 80 when unknown.
func (s *Screen) width() int {
	if w, _, err := term.GetSize(int(s.f.Fd())); err == nil && w > 0 {
		return w
	}
	return 80
}

// barOverhead is what the bar's line takes beyond its description and
// the bar: the percentage, spaces and brackets, and one column spare so
// that the cursor never wraps (progressbar's full-width layout).
const barOverhead = 11

// minBar is the least width of the bar itself.
const minBar = 10

// etaWindow is how far back the ETA looks at the rate the sink accepted.
const etaWindow = 5 * time.Second

// display reports a bulk load's advance: a bar on a Screen, log lines
// every few seconds otherwise. The ETA comes from the rate records were
// done at over the last etaWindow (what the sink actually accepted, not
// the leased rate); while the sink is paused it shows why and for how
// long instead.
type display struct {
	cfg     Config
	pods    bool // no in-process workers: delivered comes from committed offsets
	paused  func() (bool, time.Time)
	sinkErr func() string
	screen  *Screen
	started bool
	samples []sample
	lastLog time.Time
	closed  bool
}

// sample is how many records were done at a time.
type sample struct {
	at   time.Time
	done int64
}

func newDisplay(cfg Config, pods bool, paused func() (bool, time.Time), sinkErr func() string) *display {
	return &display{cfg: cfg, pods: pods, paused: paused, sinkErr: sinkErr, screen: cfg.Screen}
}

// status is what the display shows once.
type status struct {
	done, total, produced int64
	rate                  float64 // records done per second over the ETA window, -1 unknown
	eta                   time.Duration
	pausedFor             time.Duration // > 0 while the sink is paused
	pausedBy              string
}

// update shows t and what was produced; leased is the workers' leased
// rate in units/s (logged without a terminal).
func (d *display) update(t ingest.Totals, prod Produced, leased float64) {
	now := time.Now()
	st := status{done: t.Finished() + prod.DeadLettered, total: prod.Read - prod.Skipped, produced: prod.Produced, rate: -1}
	if d.pods {
		st.done = t.Delivered
	}
	d.samples = append(d.samples, sample{now, st.done})
	for len(d.samples) > 2 && now.Sub(d.samples[1].at) >= etaWindow {
		d.samples = d.samples[1:]
	}
	if first := d.samples[0]; now.Sub(first.at) >= time.Second {
		st.rate = float64(st.done-first.done) / now.Sub(first.at).Seconds()
	}
	if left := st.total - st.done; left > 0 && st.rate > 0 {
		st.eta = time.Duration(float64(left) / st.rate * float64(time.Second))
	}
	if d.paused != nil {
		if yes, since := d.paused(); yes {
			st.pausedFor = now.Sub(since).Round(time.Second)
			if d.sinkErr != nil {
				st.pausedBy = d.sinkErr()
			}
		}
	}
	if d.screen != nil {
		d.draw(st)
		return
	}
	if now.Sub(d.lastLog) < 2*time.Second {
		return
	}
	d.lastLog = now
	attrs := []any{"read", prod.Read, "produced", prod.Produced, "done", st.done,
		"delivered", t.Delivered, "duplicates", t.Duplicates, "dead_lettered", t.DeadLettered + prod.DeadLettered,
		"throttled", t.Throttled, "leased_units_per_s", math.Round(leased)}
	switch {
	case st.pausedFor > 0:
		attrs = append(attrs, "paused", st.pausedBy, "paused_for", st.pausedFor.String())
	case st.rate >= 0:
		attrs = append(attrs, "records_per_s", math.Round(st.rate), "eta", etaText(st))
	}
	d.cfg.Logger.Info("progress", attrs...)
}

// etaText is the ETA as shown: "4s", or "?" while unknown.
func etaText(st status) string {
	switch {
	case st.total > 0 && st.done >= st.total:
		return "0s"
	case st.eta > 0 && st.eta < time.Second:
		return "<1s"
	case st.eta > 0:
		return st.eta.Round(time.Second).String()
	}
	return "?"
}

// draw shows st on the screen's bar, creating it at the first update.
func (d *display) draw(st status) {
	s := d.screen
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.closed {
		return
	}
	if !d.started {
		d.started = true
		s.bar = progressbar.NewOptions64(1,
			progressbar.OptionSetWriter(s.f),
			progressbar.OptionFullWidth(),
			progressbar.OptionUseANSICodes(true),
			progressbar.OptionSetPredictTime(false),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	s.bar.ChangeMax64(max(st.total, 1))
	s.bar.Describe(describe(st, s.width()-barOverhead-minBar))
	_ = s.bar.Set64(min(st.done, max(st.total, 1)-1)) // full only at close: a full bar is cleared
}

// describe is the bar's description in at most room columns: the
// records done of those read, then the ETA (or why the sink is paused),
// the rate and what was produced, as many as fit.
func describe(st status, room int) string {
	parts := []string{fmt.Sprintf("%d/%d", st.done, st.total)}
	if st.pausedFor > 0 {
		msg := "paused"
		if st.pausedBy != "" {
			msg += ": " + oneLine(st.pausedBy)
		}
		tail := fmt.Sprintf(" for %s", st.pausedFor)
		fit := room - len(parts[0]) - 2 - len(tail) - 1
		parts = append(parts, truncate(msg, fit)+tail)
	} else {
		parts = append(parts, "ETA "+etaText(st))
	}
	if st.rate >= 0 {
		parts = append(parts, fmt.Sprintf("%.0f rec/s", st.rate))
	}
	if st.produced < st.total || st.total == 0 {
		parts = append(parts, fmt.Sprintf("%d produced", st.produced))
	}
	out := ""
	for i, p := range parts {
		next := out
		if i > 0 {
			next += ", "
		}
		next += p
		if utf8.RuneCountInString(next)+1 > room && i > 0 {
			break
		}
		out = next
	}
	return truncate(out, room-1) + " "
}

// truncate shortens s to at most n runes, ending in "…" when cut.
func truncate(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// oneLine joins an error's lines.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// close clears the bar, so that the summary starts on a clean line.
func (d *display) close() {
	if d.screen == nil {
		return
	}
	s := d.screen
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.closed {
		return
	}
	d.closed = true
	if s.bar != nil {
		_ = s.bar.Finish()
		_ = s.bar.Clear()
		s.bar = nil
	}
}
