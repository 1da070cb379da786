package critest

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Allowance is one entry of the allowed list: a spec runc passes that
// cocoon may fail (or skip) until the issue fixes it. An intermittent one
// (its issue written ~N) may also pass: the spec itself skips from run to
// run on a race that is not the runtime's, so its passing fixes nothing.
type Allowance struct {
	Spec         string
	Issue        int
	Reason       string
	Intermittent bool
}

// ReadAllowed reads the allowed list at path.
func ReadAllowed(path string) (map[string]Allowance, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read allowed list: %w", err)
	}
	allowed, err := ParseAllowed(data)
	if err != nil {
		return nil, fmt.Errorf("allowed list %s: %w", path, err)
	}
	return allowed, nil
}

// ParseAllowed parses the allowed list: one spec a line as
//
//	ISSUE | SPEC'S FULL NAME | REASON
//
// (ISSUE ~N for an intermittent entry) with blank lines and lines starting
// with # ignored. Every field is
// required and a spec is listed once.
func ParseAllowed(data []byte) (map[string]Allowance, error) {
	allowed := map[string]Allowance{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		a, err := parseAllowance(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if _, dup := allowed[a.Spec]; dup {
			return nil, fmt.Errorf("line %d: spec %q listed twice", n, a.Spec)
		}
		allowed[a.Spec] = a
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return allowed, nil
}

func parseAllowance(line string) (Allowance, error) {
	fields := strings.Split(line, " | ")
	if len(fields) != 3 {
		return Allowance{}, fmt.Errorf("%d fields separated by \" | \": want 3: ISSUE | SPEC | REASON", len(fields))
	}
	for i := range fields {
		fields[i] = strings.TrimSpace(fields[i])
	}
	number, intermittent := strings.CutPrefix(fields[0], "~")
	issue, err := strconv.Atoi(number)
	if err != nil || issue <= 0 {
		return Allowance{}, fmt.Errorf("issue %q: want the number of the issue that will fix the spec (~N when the spec may also pass)", fields[0])
	}
	if fields[1] == "" || fields[2] == "" {
		return Allowance{}, fmt.Errorf("empty spec name or reason: want both")
	}
	return Allowance{Spec: fields[1], Issue: issue, Reason: fields[2], Intermittent: intermittent}, nil
}
