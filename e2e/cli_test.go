package e2e

// The sluice CLI as the deployment files see it: a freshly built binary and
// the --help of its commands, for the checks that every command, flag and
// SLUICE_* variable a deployment file passes is one the CLI accepts. Shared
// by the docker-compose and Helm chart checks; no build tag.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sluiceCLI is a built sluice binary and a cache of its help texts.
type sluiceCLI struct {
	bin   string
	helps map[string]string // command path → its --help
}

// newSluiceCLI builds ./cmd/sluice from the repository at root, as the
// image would contain it.
func newSluiceCLI(t *testing.T, root string) *sluiceCLI {
	return &sluiceCLI{bin: buildSluice(t, root), helps: map[string]string{}}
}

// help returns `sluice <cmdPath> --help`. It fails t, so call it on the
// test's own goroutine.
func (c *sluiceCLI) help(t *testing.T, cmdPath []string) string {
	t.Helper()
	key := strings.Join(cmdPath, " ")
	if h, ok := c.helps[key]; ok {
		return h
	}
	out, err := exec.Command(c.bin, append(slices.Clone(cmdPath), "--help")...).CombinedOutput()
	require.NoError(t, err, "sluice %s --help: %s", key, out)
	c.helps[key] = string(out)
	return string(out)
}

// splitCommand splits a command line into the sluice subcommand it names
// (walking the COMMANDS sections of the help) and its arguments.
func (c *sluiceCLI) splitCommand(t *testing.T, args []string) (cmdPath, rest []string) {
	t.Helper()
	for len(args) > 0 && slices.Contains(subcommands(c.help(t, cmdPath)), args[0]) {
		cmdPath, args = append(cmdPath, args[0]), args[1:]
	}
	require.NotEmpty(t, cmdPath, "command %q names no sluice subcommand (have %v)", args, subcommands(c.help(t, nil)))
	require.Empty(t, subcommands(c.help(t, cmdPath)), "command %q stops at a command group", cmdPath)
	return cmdPath, args
}

// buildSluice builds the CLI the image would contain, with -trimpath as
// the Dockerfile builds it (which also lets the build checks share one
// compile through the build cache).
func buildSluice(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/sluice")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/sluice: %s", out)
	return bin
}

// subcommands lists the COMMANDS section of a urfave/cli help text (names
// and aliases, without help).
func subcommands(help string) []string {
	var names []string
	_, section, ok := strings.Cut(help, "\nCOMMANDS:\n")
	if !ok {
		return nil
	}
	for _, line := range strings.Split(section, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			break
		}
		col, _, _ := strings.Cut(line, "  ") // "name, alias  usage"
		for _, n := range strings.Split(col, ",") {
			if n = strings.TrimSpace(n); n != "help" && n != "h" {
				names = append(names, n)
			}
		}
	}
	return names
}

var (
	envVarRE   = regexp.MustCompile(`\$(SLUICE_[A-Z0-9_]+)`)
	namedVarRE = regexp.MustCompile(`\b(SLUICE_[A-Z0-9_]+)\b`)
	flagRE     = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)`)
	defaultRE  = `(?m)^\s+--%s\b.*\(default: ([^)]*)\)`
)

// envVars lists the variables of a urfave/cli help text's flags ([$SLUICE_X]).
func envVars(help string) []string {
	var vars []string
	for _, m := range envVarRE.FindAllStringSubmatch(help, -1) {
		vars = append(vars, m[1])
	}
	return vars
}

// namedVars lists every SLUICE_* variable a help text names: the flags'
// and the ones read without a flag, such as credentials
// ("SLUICE_SINK_AUTHORIZATION sets Authorization").
func namedVars(help string) []string {
	var vars []string
	for _, m := range namedVarRE.FindAllStringSubmatch(help, -1) {
		vars = append(vars, m[1])
	}
	return vars
}

func flagNames(help string) []string {
	var names []string
	for _, m := range flagRE.FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// flagDefault reads a duration flag's default from a help text.
func flagDefault(t *testing.T, help, flag string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(strings.Replace(defaultRE, "%s", regexp.QuoteMeta(flag), 1)).FindStringSubmatch(help)
	require.NotNil(t, m, "no default for --%s in:\n%s", flag, help)
	d, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	return d
}
