package bench

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Col is one measured figure of an entry. Name is the field's name in the
// table and in results.json; Ideal, when set, is the physical limit shown
// beside it (in the table header and under "ideal" in the JSON).
type Col struct {
	Name   string
	Ideal  string
	Value  float64
	Digits int // decimals printed
}

// Entry is one alternative's figures in one scenario: the median of Reps
// repetitions.
type Entry struct {
	Alternative string
	Reps        int
	Cols        []Col
	// Extra holds figures that are not numbers (series), JSON only.
	Extra map[string]any
}

// MarshalJSON writes the entry as one object whose fields are named as in
// the table, in table order.
func (e Entry) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"alternative":`)
	name, _ := json.Marshal(e.Alternative)
	b.Write(name)
	fmt.Fprintf(&b, `,"reps":%d`, e.Reps)
	ideal := map[string]string{}
	for _, c := range e.Cols {
		key, _ := json.Marshal(c.Name)
		v := c.Value
		if math.IsNaN(v) || math.IsInf(v, 0) {
			fmt.Fprintf(&b, `,%s:null`, key)
		} else {
			fmt.Fprintf(&b, `,%s:%s`, key, strconvRound(v, c.Digits))
		}
		if c.Ideal != "" {
			ideal[c.Name] = c.Ideal
		}
	}
	if len(ideal) > 0 {
		data, _ := json.Marshal(ideal)
		b.WriteString(`,"ideal":`)
		b.Write(data)
	}
	for _, k := range sortedKeys(e.Extra) {
		key, _ := json.Marshal(k)
		data, err := json.Marshal(e.Extra[k])
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, `,%s:%s`, key, data)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads what MarshalJSON wrote, so that a run of some
// scenarios keeps the others' figures: the numbers become Cols in the
// order written, with as many Digits as their literal has decimals, and
// the other fields Extra. A null figure is NaN.
func (e *Entry) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("bench entry: want an object, got %.40s", data)
	}
	*e = Entry{}
	var ideal map[string]string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := t.(string)
		var v any
		switch key {
		case "alternative":
			err = dec.Decode(&e.Alternative)
		case "reps":
			err = dec.Decode(&e.Reps)
		case "ideal":
			err = dec.Decode(&ideal)
		default:
			if err = dec.Decode(&v); err != nil {
				break
			}
			switch v := v.(type) {
			case json.Number:
				f, ferr := v.Float64()
				_, decimals, _ := strings.Cut(v.String(), ".")
				e.Cols, err = append(e.Cols, Col{Name: key, Value: f, Digits: len(decimals)}), ferr
			case nil:
				e.Cols = append(e.Cols, Col{Name: key, Value: math.NaN()})
			default:
				if e.Extra == nil {
					e.Extra = map[string]any{}
				}
				e.Extra[key] = v
			}
		}
		if err != nil {
			return fmt.Errorf("bench entry %q, field %q: %w", e.Alternative, key, err)
		}
	}
	for i, c := range e.Cols {
		e.Cols[i].Ideal = ideal[c.Name]
	}
	return nil
}

func strconvRound(v float64, digits int) string {
	return fmt.Sprintf("%.*f", digits, v)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Scenario is one scenario's result: a table of entries, notes that
// explain the setup (and any scaling down), and the charts drawn.
type Scenario struct {
	ID      string   `json:"id"`
	Title   string   `json:"title"`
	Notes   []string `json:"notes,omitempty"`
	Entries []Entry  `json:"entries"`
	Charts  []string `json:"charts,omitempty"`
	// Commit and Started say which run measured the scenario: a run of
	// some scenarios keeps the others from the results.json it updates.
	Commit  string `json:"commit,omitempty"`
	Started string `json:"started,omitempty"`
}

// Report is the content of results.json. Machine, GoVersion, Commit,
// Services, Started and DurationS describe the latest run; each scenario
// names the run that measured it.
type Report struct {
	Machine   Machine    `json:"machine"`
	GoVersion string     `json:"go_version"`
	Commit    string     `json:"commit"`
	Services  string     `json:"services"`
	Started   string     `json:"started"`
	DurationS float64    `json:"duration_s"`
	Scenarios []Scenario `json:"scenarios"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	CPU   string `json:"cpu"`
	Cores int    `json:"cores"`
	OS    string `json:"os"`
}

// WriteMarkdown prints the scenario as a markdown section with its table.
func (s Scenario) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "### %s. %s\n\n", s.ID, s.Title)
	var cols []string
	ideal := map[string]string{}
	for _, e := range s.Entries {
		for _, c := range e.Cols {
			if !slices.Contains(cols, c.Name) {
				cols = append(cols, c.Name)
			}
			if c.Ideal != "" {
				ideal[c.Name] = c.Ideal
			}
		}
	}
	head := []string{"alternative", "reps"}
	for _, c := range cols {
		h := c
		if ideal[c] != "" {
			h += " (ideal " + ideal[c] + ")"
		}
		head = append(head, h)
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, e := range s.Entries {
		row := []string{e.Alternative, fmt.Sprint(e.Reps)}
		for _, name := range cols {
			cell := "–"
			for _, c := range e.Cols {
				if c.Name == name {
					cell = strconvRound(c.Value, c.Digits)
				}
			}
			row = append(row, cell)
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintln(w)
	for _, n := range s.Notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	for _, c := range s.Charts {
		fmt.Fprintf(w, "- chart: `%s`\n", c)
	}
	fmt.Fprintln(w)
}

// median combines repetitions of one alternative: each column is the
// median of its values; Extra comes from the repetition whose first column
// is the median one.
func median(reps []Entry) Entry {
	if len(reps) == 1 {
		return reps[0]
	}
	out := Entry{Alternative: reps[0].Alternative, Reps: len(reps)}
	for i, c := range reps[0].Cols {
		vals := make([]float64, 0, len(reps))
		for _, r := range reps {
			if i < len(r.Cols) {
				vals = append(vals, r.Cols[i].Value)
			}
		}
		slices.Sort(vals)
		m := vals[len(vals)/2]
		if len(vals)%2 == 0 {
			m = (vals[len(vals)/2-1] + vals[len(vals)/2]) / 2
		}
		c.Value = m
		out.Cols = append(out.Cols, c)
	}
	out.Extra = reps[len(reps)/2].Extra
	return out
}

// keep adds to rep, after its own scenarios, those of the report at path
// that rep did not run again; a missing or unreadable file adds nothing.
func (rep *Report) keep(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	var old Report
	if json.Unmarshal(data, &old) != nil {
		return
	}
	for _, sc := range old.Scenarios {
		if slices.ContainsFunc(rep.Scenarios, func(n Scenario) bool { return n.ID == sc.ID }) {
			continue
		}
		if sc.Commit == "" {
			sc.Commit, sc.Started = old.Commit, old.Started
		}
		rep.Scenarios = append(rep.Scenarios, sc)
	}
	slices.SortStableFunc(rep.Scenarios, func(a, b Scenario) int { return cmp.Compare(scenarioOrder(a.ID), scenarioOrder(b.ID)) })
}

// scenarioOrder sorts scenario IDs ("3", "3-b", "10") by their number.
func scenarioOrder(id string) int {
	n, _ := strconv.Atoi(strings.SplitN(id, "-", 2)[0])
	return n
}
