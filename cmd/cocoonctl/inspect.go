package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/docker/go-units"

	"github.com/cocoonstack/containerd-shim-cocoon/chain"
)

func init() {
	register(command{
		name:    "inspect",
		summary: "show and verify a chain: an image archive, a link dir or a staged dir",
		flags:   inspectFlags,
	})
}

// inspected is what inspect reports, also as JSON.
type inspected struct {
	Source string          `json:"source"` // archive, link or staged
	Path   string          `json:"path"`
	Name   string          `json:"name,omitempty"`
	Links  []inspectedLink `json:"links"`
}

type inspectedLink struct {
	ID   string      `json:"id"`
	Link *chain.Link `json:"link"`
}

func inspectFlags(fs *flag.FlagSet) action {
	var asJSON bool
	fs.BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return func(ctx context.Context, e env, args []string) error {
		if len(args) != 1 {
			return errors.New("want exactly one PATH: an image archive, a link dir or a staged dir")
		}
		r, err := inspectPath(args[0])
		if err != nil {
			return err
		}
		if asJSON {
			enc := json.NewEncoder(e.out)
			enc.SetIndent("", "  ")
			return enc.Encode(r)
		}
		return printChain(e.out, r)
	}
}

// inspectPath reads and verifies whatever path is.
func inspectPath(path string) (*inspected, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	r := &inspected{Path: path}
	var links []*chain.Link
	switch {
	case !fi.IsDir():
		r.Source = "archive"
		a, err := chain.ReadArchive(path)
		if err != nil {
			return nil, err
		}
		r.Name, links = a.Name, a.Links
	case exists(filepath.Join(path, chain.StagedChain)):
		r.Source = "staged"
		s, err := chain.OpenStaged(path)
		if err != nil {
			return nil, err
		}
		if err := checkStagedMemory(s); err != nil {
			return nil, err
		}
		links = s.Links
	case exists(filepath.Join(path, chain.LinkFile)):
		r.Source = "link"
		l, err := chain.ValidateDir(path)
		if err != nil {
			return nil, err
		}
		links = []*chain.Link{l}
	default:
		return nil, fmt.Errorf("%s: a directory without %s or %s is neither a link nor a staged dir", path, chain.LinkFile, chain.StagedChain)
	}
	for _, l := range links {
		r.Links = append(r.Links, inspectedLink{ID: l.ID().String(), Link: l})
	}
	return r, nil
}

// checkStagedMemory checks the staged memory file has the chain's size.
func checkStagedMemory(s *chain.Staged) error {
	fi, err := os.Stat(s.MemoryPath())
	if err != nil {
		return fmt.Errorf("staged memory: %w", err)
	}
	if want := s.Top().MemoryBytes; fi.Size() != want {
		return fmt.Errorf("%s: %d bytes, the chain's memory is %d", s.MemoryPath(), fi.Size(), want)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func printChain(out io.Writer, r *inspected) error {
	fmt.Fprintf(out, "%s %s", r.Source, r.Path)
	if r.Name != "" {
		fmt.Fprintf(out, " (%s)", r.Name)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tID\tKIND\tHYPERVISOR\tGUEST\tVCPUS\tMEMORY\tPAGE\tEXTENTS\tDATA\tSTATE")
	for i, il := range r.Links {
		l := il.Link
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\t%s\t%s\n",
			i, shortID(il.ID), l.Kind, l.Hypervisor, l.GuestOS, l.VCPUs,
			units.BytesSize(float64(l.MemoryBytes)), l.PageSize, l.Memory.Extents,
			units.BytesSize(float64(l.Memory.DataBytes)), strings.Join(l.StateFiles, ","))
	}
	return tw.Flush()
}

func shortID(id string) string {
	if _, hex, ok := strings.Cut(id, ":"); ok && len(hex) > 12 {
		return hex[:12]
	}
	return id
}
