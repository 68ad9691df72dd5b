package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"
	"mvdan.cc/sh/v3/expand"
	"mvdan.cc/sh/v3/syntax"
)

var updateDocs = flag.Bool("update", false, "rewrite docs/cli.md from the app")

// cliReference is the CLI reference in docs/cli.md, generated from the app
// itself by urfave/cli, so that it cannot drift from --help.
const cliReference = "../../docs/cli.md"

// docs/cli.md is what the app generates: a flag added, renamed or reworded
// without `make docs` fails here.
func TestCLIReferenceIsCurrent(t *testing.T) {
	md, err := newApp(io.Discard, io.Discard).ToMarkdown()
	require.NoError(t, err)
	md = "<!-- Generated from the sluice CLI by `make docs`; do not edit. -->\n\n" + md
	if *updateDocs {
		require.NoError(t, os.WriteFile(cliReference, []byte(md), 0o644))
	}
	have, err := os.ReadFile(cliReference)
	require.NoError(t, err)
	require.Equal(t, md, string(have), "docs/cli.md is stale: run make docs")
}

// Every sluice command in the shell blocks of README and docs/ parses
// against the CLI: its commands exist and every flag is one of theirs.
func TestDocCommandsUseRealFlags(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	files, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	files = append([]string{"../../README.md"}, files...)
	var checked int
	for _, file := range files {
		for _, c := range docCommands(t, file) {
			checked++
			if err := checkCommand(app, c.args); err != nil {
				t.Errorf("%s:%d: sluice %s: %v", filepath.Base(file), c.line, strings.Join(c.args, " "), err)
			}
		}
	}
	require.Greater(t, checked, 10, "the docs run sluice commands")
}

// docCommand is a sluice command found in a Markdown file.
type docCommand struct {
	line uint
	args []string // after "sluice"
}

// fencedShell finds the shell code blocks of a Markdown file.
var fencedShell = regexp.MustCompile("(?ms)^```(?:sh|bash|shell|console)\n(.*?)^```")

// docCommands returns the sluice commands of file's shell blocks, expanded
// as a POSIX shell would (quotes, line continuations), with every variable
// set to a stand-in value.
func docCommands(t *testing.T, file string) []docCommand {
	t.Helper()
	md, err := os.ReadFile(file)
	require.NoError(t, err)
	var out []docCommand
	for _, m := range fencedShell.FindAllSubmatchIndex(md, -1) {
		block := string(md[m[2]:m[3]])
		startLine := uint(strings.Count(string(md[:m[2]]), "\n"))
		f, err := syntax.NewParser(syntax.Variant(syntax.LangBash)).Parse(strings.NewReader(block), file)
		if err != nil {
			t.Errorf("%s:%d: a shell block that does not parse: %v", filepath.Base(file), startLine, err)
			continue
		}
		syntax.Walk(f, func(n syntax.Node) bool {
			call, ok := n.(*syntax.CallExpr)
			if !ok || len(call.Args) == 0 || !slices.Contains([]string{"sluice", "bin/sluice", "./bin/sluice"}, call.Args[0].Lit()) {
				return true
			}
			cfg := &expand.Config{Env: expand.FuncEnviron(func(name string) string { return "stand-in-" + strings.ToLower(name) })}
			words, err := expand.Fields(cfg, call.Args[1:]...)
			if err != nil {
				t.Errorf("%s:%d: the shell cannot expand the command: %v", filepath.Base(file), startLine+call.Pos().Line(), err)
				return true
			}
			out = append(out, docCommand{line: startLine + call.Pos().Line(), args: words})
			return true
		})
	}
	return out
}

// checkCommand resolves args' commands in app and checks each flag is the
// command's (or the app's); a flag's value is skipped unless the flag is a
// boolean. Arguments after "--" are not checked.
func checkCommand(app *cli.App, args []string) error {
	commands, flags := app.Commands, app.Flags
	path := "sluice"
	i := 0
	for i < len(args) && !strings.HasPrefix(args[i], "-") {
		c := findCommand(commands, args[i])
		if c == nil {
			if path == "sluice" {
				return fmt.Errorf("no command %q", args[i])
			}
			break // an argument of the command
		}
		path += " " + c.Name
		commands, flags = c.Subcommands, c.Flags
		i++
	}
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "help" || name == "h" || name == "version" || name == "v" {
			continue
		}
		f := findFlag(flags, name)
		if f == nil {
			return fmt.Errorf("%s has no flag --%s", path, name)
		}
		if _, isBool := f.(*cli.BoolFlag); !isBool && !hasValue {
			i++ // its value
		}
	}
	return nil
}

func findCommand(commands []*cli.Command, name string) *cli.Command {
	for _, c := range commands {
		if c.Name == name || slices.Contains(c.Aliases, name) {
			return c
		}
	}
	return nil
}

func findFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}
