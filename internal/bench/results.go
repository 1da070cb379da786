package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// writeResults writes <date>.json, .md and .svg into dir, and the table
// and chart into readme if set.
func writeResults(r *results, dir, readme string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create results dir: %w", err)
	}
	stamp := r.Date.Format("2006-01-02T150405Z")
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	svg := stamp + ".svg"
	files := map[string]string{
		stamp + ".json": string(data) + "\n",
		stamp + ".md":   r.markdown(svg),
		svg:             r.svg(),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("write results: %w", err)
		}
	}
	if readme == "" {
		return nil
	}
	rel, err := filepath.Rel(filepath.Dir(readme), filepath.Join(dir, svg))
	if err != nil {
		return fmt.Errorf("chart path: %w", err)
	}
	return replaceSection(readme, r.markdown(rel))
}

// The part of a readme that bench rewrites; the rest is left alone.
const (
	sectionBegin = "<!-- bench:begin -->"
	sectionEnd   = "<!-- bench:end -->"
)

// replaceSection puts body between the bench markers in the file at path.
func replaceSection(path, body string) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read readme: %w", err)
	}
	before, rest, ok1 := strings.Cut(string(old), sectionBegin)
	_, after, ok2 := strings.Cut(rest, sectionEnd)
	if !ok1 || !ok2 {
		return fmt.Errorf("%s: no %s ... %s section to write the results into", path, sectionBegin, sectionEnd)
	}
	text := before + sectionBegin + "\n" + body + sectionEnd + after
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
