package bench

import (
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Table is a fixed-width text table for the bench report. Columns whose cells
// are all numbers are right-aligned so that digits line up for comparison;
// everything else is left-aligned.
type Table struct {
	headers []string
	rows    [][]string
}

// NewTable returns a table with the given column headers.
func NewTable(headers ...string) *Table {
	return &Table{headers: headers}
}

// Row appends a row. Short rows are padded with empty cells and long rows add
// unnamed columns, so a caller's mistake shows up in the output instead of
// silently dropping data.
func (t *Table) Row(cells ...string) {
	t.rows = append(t.rows, append([]string(nil), cells...))
}

// Write renders the table to w in a single write, so that concurrent
// loggers sharing w cannot interleave with it.
func (t *Table) Write(w io.Writer) error {
	ncol := len(t.headers)
	for _, r := range t.rows {
		ncol = max(ncol, len(r))
	}
	if ncol == 0 {
		return nil
	}
	width := make([]int, ncol)
	numeric := make([]bool, ncol)
	for c := range ncol {
		width[c] = utf8.RuneCountInString(cell(t.headers, c))
		seen := false
		all := true
		for _, r := range t.rows {
			s := cell(r, c)
			width[c] = max(width[c], utf8.RuneCountInString(s))
			if s == "" {
				continue
			}
			seen = true
			if !isNumber(s) {
				all = false
			}
		}
		numeric[c] = seen && all
	}

	var b strings.Builder
	line := func(cells []string) {
		var l strings.Builder
		for c := range ncol {
			if c > 0 {
				l.WriteString("  ")
			}
			s := cell(cells, c)
			pad := strings.Repeat(" ", width[c]-utf8.RuneCountInString(s))
			if numeric[c] {
				l.WriteString(pad)
				l.WriteString(s)
			} else {
				l.WriteString(s)
				l.WriteString(pad)
			}
		}
		// Trailing blanks from a padded last column only make diffs and
		// golden files fragile.
		b.WriteString(strings.TrimRight(l.String(), " "))
		b.WriteByte('\n')
	}
	line(t.headers)
	under := make([]string, ncol)
	for c := range ncol {
		under[c] = strings.Repeat("-", width[c])
	}
	line(under)
	for _, r := range t.rows {
		line(r)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cell(cells []string, i int) string {
	if i < len(cells) {
		return cells[i]
	}
	return ""
}

// isNumber accepts the forms the bench report prints: plain numbers, and
// percentages or ratios such as "87%" and "0.91x".
func isNumber(s string) bool {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(s, "%")
	s = strings.TrimSuffix(s, "x")
	if s == "" {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
