package main

import (
	"bytes"
	"io"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/creack/pty"
	"github.com/stretchr/testify/require"
)

// screen replays what a program wrote to a terminal of width columns:
// text, carriage returns, line feeds, line wraps, and the CSI sequences
// that clear a line (K, 0K, 2K); other CSI sequences are skipped. It
// returns the lines as the terminal shows them at the end.
func screen(raw []byte, width int) []string {
	lines := [][]rune{{}}
	row, col := 0, 0
	put := func(r rune) {
		if col == width { // the terminal wraps before the next character
			row, col = row+1, 0
			if row == len(lines) {
				lines = append(lines, []rune{})
			}
		}
		for len(lines[row]) <= col {
			lines[row] = append(lines[row], ' ')
		}
		lines[row][col] = r
		col++
	}
	s := []rune(string(raw))
	for i := 0; i < len(s); i++ {
		switch r := s[i]; {
		case r == '\r':
			col = 0
		case r == '\n':
			row++
			if row == len(lines) {
				lines = append(lines, []rune{})
			}
		case r == 0x1b && i+1 < len(s) && s[i+1] == '[':
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			if j < len(s) && s[j] == 'K' {
				switch string(s[i+2 : j]) {
				case "2":
					lines[row] = lines[row][:0]
				default:
					lines[row] = lines[row][:min(col, len(lines[row]))]
				}
			}
			i = j
		case r >= ' ':
			put(r)
		}
	}
	out := make([]string, 0, len(lines))
	for _, l := range lines {
		out = append(out, strings.TrimRight(string(l), " "))
	}
	return out
}

var barFrame = regexp.MustCompile(`\d+% \|[█= >]*\|`)

// Item 4: on a terminal the progress bar is one line redrawn in place at
// any width from 60 columns, its figures and a bar of at least 10
// characters in it, log lines above it, and nothing of it left once the
// summary is printed.
func TestProgressBarRedrawsInPlace(t *testing.T) {
	path := sample(t, 2500)
	for _, width := range []int{60, 80, 120} {
		ptmx, tty, err := pty.Open()
		require.NoError(t, err)
		require.NoError(t, pty.Setsize(ptmx, &pty.Winsize{Rows: 50, Cols: uint16(width)}))
		var raw bytes.Buffer
		copied := make(chan struct{})
		go func() { _, _ = io.Copy(&raw, ptmx); close(copied) }()
		var stdout lockedBuffer
		code := run([]string{"sluice", "bulk-load", "--embedded", "--capacity", "1250", "--workers", "2", "--id-field", "id", "--topic", "bar",
			"--dead-letter-file", filepath.Join(t.TempDir(), "dl.ndjson"), path}, strings.NewReader(""), &stdout, tty)
		require.NoError(t, tty.Close())
		<-copied // the master reads EIO once the terminal's last writer closed it
		require.NoError(t, ptmx.Close())
		require.Equal(t, exitOK, code, raw.String())

		frames := barFrame.FindAllString(raw.String(), -1)
		require.Greater(t, len(frames), 5, "the bar was drawn and redrawn at %d columns:\n%q", width, raw.String())
		for _, f := range frames {
			inner := strings.Count(f, "█") + strings.Count(f, "=") + strings.Count(f, " ") - 1
			require.GreaterOrEqual(t, inner, 10, "a bar of at least 10 characters at %d columns: %q", width, f)
		}
		for _, l := range regexp.MustCompile(`\x1b\[2K\r|\r`).Split(raw.String(), -1) {
			if barFrame.MatchString(l) {
				l = strings.TrimSuffix(strings.TrimSuffix(l, "\x1b[0K"), "\n")
				require.Less(t, len([]rune(l)), width, "a frame fits in %d columns: %q", width, l)
			}
		}
		shown := screen(raw.Bytes(), width)
		for _, l := range shown {
			require.NotRegexp(t, barFrame, l, "no stale bar at %d columns; the screen:\n%s", width, strings.Join(shown, "\n"))
			require.NotContains(t, l, "ETA", "no stale bar at %d columns; the screen:\n%s", width, strings.Join(shown, "\n"))
		}
		require.Contains(t, strings.Join(shown, ""), `msg="embedded services started"`, "log lines stay (wrapped as the terminal wraps them)")
		require.Contains(t, raw.String(), "ETA ")
		require.Contains(t, stdout.String(), "2500 delivered")
	}
}
