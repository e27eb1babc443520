// weft-oracle: the expected verdicts of Kubernetes NetworkPolicy for scripts/oracle/run.sh,
// computed by cyclonus's policy matcher (github.com/mattfenwick/cyclonus/pkg/matcher, the
// engine the network-policy-api project's policy-assistant was forked from), not by Weft.
//
//	weft-oracle world  --seed N                          the seed's pods and namespaces (no IPs)
//	weft-oracle case   --world W --seed N --case K       random case K of seed N
//	weft-oracle corpus --world W [--case K]              cyclonus's generator's cases (or case K)
//	weft-oracle judge  --world W --case C                every cell's expected verdict, per step
package main

import (
	"flag"
	"fmt"
	"os"
)

// oracleName names the engine behind the verdicts (printed in every judgement).
const oracleName = "github.com/mattfenwick/cyclonus@v0.5.6 pkg/matcher"

type stepVerdicts struct {
	Description string `json:"description"`
	Cells       []Cell `json:"cells"`
}

type judgement struct {
	Oracle string         `json:"oracle"`
	Case   string         `json:"case"`
	Steps  []stepVerdicts `json:"steps"`
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: weft-oracle world|case|corpus|judge [flags] (weft-oracle CMD -h)")
	os.Exit(2)
}

func loadWorld(path string) (*World, error) {
	if path == "" {
		return nil, fmt.Errorf("--world FILE is required")
	}
	w := &World{}
	return w, readJSON(path, w)
}

func run(args []string) error {
	if len(args) < 1 {
		usage()
	}
	fs := flag.NewFlagSet(args[0], flag.ExitOnError)
	seed := fs.Int64("seed", 1, "seed")
	index := fs.Int("case", -1, "case number")
	worldPath := fs.String("world", "", "world JSON (with the pods' IPs)")
	casePath := fs.String("case-file", "", "case JSON (judge)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "world":
		return writeJSON(genWorld(*seed))
	case "case":
		w, err := loadWorld(*worldPath)
		if err != nil {
			return err
		}
		if *index < 0 {
			return fmt.Errorf("--case K is required")
		}
		return writeJSON(genCase(w, *seed, *index))
	case "corpus":
		w, err := loadWorld(*worldPath)
		if err != nil {
			return err
		}
		c, err := genCorpus(w)
		if err != nil {
			return err
		}
		if *index < 0 {
			return writeJSON(c)
		}
		if *index >= len(c.Cases) {
			return fmt.Errorf("cyclonus's generator has %d usable cases: --case %d is past the end", len(c.Cases), *index)
		}
		return writeJSON(c.Cases[*index])
	case "judge":
		w, err := loadWorld(*worldPath)
		if err != nil {
			return err
		}
		if *casePath == "" {
			return fmt.Errorf("--case-file FILE is required")
		}
		c := &Case{}
		if err := readJSON(*casePath, c); err != nil {
			return err
		}
		out := judgement{Oracle: oracleName, Case: c.ID}
		for _, step := range c.Steps {
			cells, err := judge(w, step.Policies)
			if err != nil {
				return fmt.Errorf("%s, step %q: %w", c.ID, step.Description, err)
			}
			out.Steps = append(out.Steps, stepVerdicts{Description: step.Description, Cells: cells})
		}
		return writeJSON(out)
	default:
		usage()
	}
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "weft-oracle:", err)
		os.Exit(1)
	}
}
