package e2e

// Checks docker-compose.yml against the CLI it runs, without a Docker
// engine: the file is loaded with compose-go (the loader docker compose
// itself uses, with the same interpolation and path resolution), and every
// sluice command and SLUICE_* variable in it is checked against the
// `--help` of a freshly built sluice binary. Unlike the rest of the package
// this file has no build tag: it runs with `go test ./...`.

import (
	"context"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

const composeProjectName = "sluice"

// The connection variables whose host names another compose service.
var composeConnVars = []string{"SLUICE_BROKERS", "SLUICE_REDIS_ADDR", "SLUICE_SINK"}

func TestDockerCompose(t *testing.T) {
	c := loadComposeStack(t)
	t.Run("commands and variables are real", c.testCommandsAndVariables)
	t.Run("connections name services the command waits for", c.testConnections)
	t.Run("worker", c.testWorker)
	t.Run("kafka", c.testKafka)
	t.Run("redis keeps nothing", c.testRedis)
	t.Run("sink is provisioned at the pool capacity", c.testSink)
	t.Run("loader reads the repository's testdata", c.testLoader)
}

// composeStack is the repository's docker-compose.yml with the tools profile
// active, and what each of its sluice services runs. Its help texts are
// fetched when it is loaded, on the test's own goroutine (sluiceCLI.help
// fails the test it is given); subtests only read them.
type composeStack struct {
	root string
	p    *types.Project
	// sluiceServices are the services that run the sluice image, sorted.
	sluiceServices []string
	commands       map[string][]string          // service → sluice subcommand
	args           map[string][]string          // service → the rest of its command
	env            map[string]map[string]string // service → its environment
	helps          map[string]string            // service → the --help of its subcommand
	statusVars     []string                     // the variables of `sluice pool status`
}

// loadComposeStack loads docker-compose.yml with and without the tools
// profile, checks which services each starts and which run the sluice
// image, and reads those services' commands against a freshly built CLI.
func loadComposeStack(t *testing.T) *composeStack {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	c := &composeStack{
		root:     root,
		p:        loadComposeProfiles(t, root, filepath.Join(root, "docker-compose.yml")),
		commands: map[string][]string{},
		args:     map[string][]string{},
		env:      map[string]map[string]string{},
		helps:    map[string]string{},
	}
	require.Equal(t, []string{"tools"}, c.service(t, "loader").Profiles)
	c.sluiceServices = composeSluiceServices(t, c.p, root)

	sluice := newSluiceCLI(t, root)
	for _, name := range c.sluiceServices {
		s := c.service(t, name)
		c.commands[name], c.args[name] = sluice.splitCommand(t, s.Command)
		c.env[name] = map[string]string{}
		for k, v := range s.Environment {
			require.NotNil(t, v, "service %s: %s has no value (would come from the host)", name, k)
			c.env[name][k] = *v
		}
		c.helps[name] = sluice.help(t, c.commands[name])
	}
	statusPath, statusArgs := sluice.splitCommand(t, []string{"pool", "status"})
	require.Empty(t, statusArgs)
	c.statusVars = envVars(sluice.help(t, statusPath))
	return c
}

// loadComposeProfiles checks the services `docker compose up` starts (no
// profile active) and the ones the tools profile adds (`docker compose
// --profile tools ...` / `docker compose run loader`), and returns the
// project with the tools profile active.
func loadComposeProfiles(t *testing.T, root, composeFile string) *types.Project {
	t.Helper()
	p := loadCompose(t, root, composeFile)
	require.Equal(t, composeProjectName, p.Name)
	require.ElementsMatch(t, []string{"kafka", "redis", "sink", "worker"}, p.ServiceNames(),
		"services started by `docker compose up`")
	require.Contains(t, p.DisabledServices, "loader", "loader belongs to a profile, not to `up`")

	p = loadCompose(t, root, composeFile, "tools")
	require.ElementsMatch(t, []string{"kafka", "redis", "sink", "worker", "loader"}, p.ServiceNames())
	return p
}

// composeSluiceServices returns the services that run the sluice image:
// built from the repository (Dockerfile, whose entrypoint is the sluice
// binary) by one service, and reused by image name.
func composeSluiceServices(t *testing.T, p *types.Project, root string) []string {
	t.Helper()
	var sluiceImage string
	for _, s := range p.Services {
		if s.Build != nil && s.Build.Context == root {
			require.Empty(t, sluiceImage, "one service builds the sluice image")
			require.NotEmpty(t, s.Image, "service %s: the built image needs a name the others can use", s.Name)
			sluiceImage = s.Image
		}
	}
	require.NotEmpty(t, sluiceImage, "a service builds the repository's Dockerfile")
	var sluiceServices []string
	for _, s := range p.Services {
		if s.Image == sluiceImage {
			require.Empty(t, s.Entrypoint, "service %s: keep the image's sluice entrypoint", s.Name)
			sluiceServices = append(sluiceServices, s.Name)
		}
	}
	slices.Sort(sluiceServices)
	require.Equal(t, []string{"loader", "sink", "worker"}, sluiceServices)
	return sluiceServices
}

func (c *composeStack) service(t *testing.T, name string) types.ServiceConfig {
	t.Helper()
	s, err := c.p.GetService(name)
	require.NoError(t, err)
	return s
}

func (c *composeStack) testCommandsAndVariables(t *testing.T) {
	require.Equal(t, []string{"worker"}, c.commands["worker"])
	require.Equal(t, []string{"bulk-load"}, c.commands["loader"])
	require.Equal(t, []string{"sink-sim"}, c.commands["sink"])
	for _, name := range c.sluiceServices {
		h := c.helps[name]
		vars := envVars(h)
		for k := range c.env[name] {
			if strings.HasPrefix(k, "SLUICE_") {
				require.True(t, slices.Contains(vars, k), "service %s: `sluice %s` has no flag for %s",
					name, strings.Join(c.commands[name], " "), k)
			}
		}
		for _, a := range c.args[name] {
			if flag, ok := strings.CutPrefix(a, "--"); ok {
				flag, _, _ = strings.Cut(flag, "=")
				require.True(t, slices.Contains(flagNames(h), flag), "service %s: `sluice %s` has no flag --%s",
					name, strings.Join(c.commands[name], " "), flag)
			}
		}
	}
	// The header's `docker compose run --rm worker pool status` gets the
	// worker's environment: it must name the same Redis and pool.
	for _, k := range []string{"SLUICE_REDIS_ADDR", "SLUICE_POOL"} {
		require.Contains(t, c.statusVars, k)
		require.Contains(t, c.env["worker"], k, "`docker compose run --rm worker pool status` needs %s", k)
	}
}

func (c *composeStack) testConnections(t *testing.T) {
	for _, name := range c.sluiceServices {
		for _, k := range composeConnVars {
			v, ok := c.env[name][k]
			if !ok {
				continue
			}
			for _, hp := range splitAddrs(t, v) {
				host, _ := splitHostPort(t, hp)
				require.Contains(t, c.p.ServiceNames(), host, "service %s: %s=%s names no service", name, k, v)
				require.Contains(t, c.service(t, name).DependsOn, host, "service %s: %s=%s, but no depends_on %s", name, k, v, host)
			}
		}
	}
	// Every sluice service shares one pool definition (a worker started
	// with other pool settings refuses to start).
	for _, k := range []string{"SLUICE_POOL", "SLUICE_CAPACITY", "SLUICE_PARTITIONS", "SLUICE_UNIT", "SLUICE_LEASE_TTL", "SLUICE_TOPIC"} {
		require.Equal(t, c.env["worker"][k], c.env["loader"][k], "worker and loader disagree on %s", k)
	}
}

func (c *composeStack) testWorker(t *testing.T) {
	w := c.service(t, "worker")
	require.GreaterOrEqual(t, w.GetScale(), 2, "several workers share the pool")
	grace := flagDefault(t, c.helps["worker"], "grace")
	if v, ok := c.env["worker"]["SLUICE_GRACE"]; ok {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		grace = d
	}
	require.NotNil(t, w.StopGracePeriod, "worker needs a stop_grace_period (docker's default is 10 s)")
	require.GreaterOrEqual(t, time.Duration(*w.StopGracePeriod), grace+3*time.Second,
		"stop_grace_period must cover --grace (%s) plus the final commit and lease release", grace)
}

func (c *composeStack) testKafka(t *testing.T) {
	k := c.service(t, "kafka")
	kenv := func(name string) string {
		v := k.Environment[name]
		require.NotNil(t, v, "kafka: %s unset", name)
		return *v
	}
	roles := strings.Split(kenv("KAFKA_PROCESS_ROLES"), ",")
	require.ElementsMatch(t, []string{"broker", "controller"}, trimAll(roles), "a single KRaft node")
	require.NotContains(t, k.Environment, "KAFKA_ZOOKEEPER_CONNECT")
	require.Contains(t, kenv("KAFKA_CONTROLLER_QUORUM_VOTERS"), "@kafka:", "the controller quorum is this node")

	listeners := parseListeners(t, kenv("KAFKA_LISTENERS"))
	advertised := parseListeners(t, kenv("KAFKA_ADVERTISED_LISTENERS"))
	protocols := map[string]string{}
	for _, m := range strings.Split(kenv("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"), ",") {
		name, proto, ok := strings.Cut(strings.TrimSpace(m), ":")
		require.True(t, ok, "listener protocol map entry %q", m)
		protocols[name] = proto
	}
	for _, name := range c.sluiceServices {
		v, ok := c.env[name]["SLUICE_BROKERS"]
		if !ok {
			continue
		}
		for _, hp := range splitAddrs(t, v) {
			var listener string
			for l, a := range advertised {
				if a == hp {
					listener = l
				}
			}
			require.NotEmpty(t, listener, "service %s: SLUICE_BROKERS %s is not an advertised listener %v", name, hp, advertised)
			require.Equal(t, "PLAINTEXT", protocols[listener], "sluice speaks plaintext Kafka")
			_, port := splitHostPort(t, hp)
			_, lport := splitHostPort(t, listeners[listener])
			require.Equal(t, port, lport, "listener %s binds another port than it advertises", listener)
		}
	}
}

func (c *composeStack) testRedis(t *testing.T) {
	r := c.service(t, "redis")
	require.Empty(t, r.Volumes, "redis: no volumes")
	cmd := []string(r.Command)
	require.NotEmpty(t, cmd)
	require.Equal(t, "redis-server", cmd[0])
	require.Equal(t, "", optionValue(t, cmd, "--save"), "redis: no RDB snapshots")
	require.Equal(t, "no", optionValue(t, cmd, "--appendonly"), "redis: no AOF")
	port := "6379"
	if slices.Contains(cmd, "--port") {
		port = optionValue(t, cmd, "--port")
	}
	for _, name := range c.sluiceServices {
		if v, ok := c.env[name]["SLUICE_REDIS_ADDR"]; ok {
			for _, hp := range splitAddrs(t, v) {
				_, p := splitHostPort(t, hp)
				require.Equal(t, port, p, "service %s: SLUICE_REDIS_ADDR port", name)
			}
		}
	}
}

func (c *composeStack) testSink(t *testing.T) {
	cmd := []string(c.service(t, "sink").Command)
	capacity := optionValue(t, cmd, "--capacity")
	_, listenPort := splitHostPort(t, optionValue(t, cmd, "--listen"))
	for _, name := range c.sluiceServices {
		if v, ok := c.env[name]["SLUICE_CAPACITY"]; ok {
			require.Equal(t, v, capacity, "service %s: SLUICE_CAPACITY ≠ the sink's --capacity (one provisioned rate)", name)
		}
		if v, ok := c.env[name]["SLUICE_SINK"]; ok {
			u, err := url.Parse(v)
			require.NoError(t, err)
			require.Equal(t, "http", u.Scheme)
			require.Equal(t, listenPort, u.Port(), "service %s: SLUICE_SINK port ≠ the sink's --listen port", name)
		}
	}
}

func (c *composeStack) testLoader(t *testing.T) {
	var target string
	for _, v := range c.service(t, "loader").Volumes {
		if v.Type == types.VolumeTypeBind && v.Source == filepath.Join(c.root, "testdata") {
			target = v.Target
			require.True(t, v.ReadOnly, "loader: mount testdata read-only")
		}
	}
	require.NotEmpty(t, target, "loader: mounts ./testdata")
	var files []string
	for _, a := range c.args["loader"] {
		if !strings.HasPrefix(a, "-") {
			files = append(files, a)
		}
	}
	require.Len(t, files, 1, "bulk-load takes one FILE: %q", c.args["loader"])
	rel, ok := strings.CutPrefix(path.Clean(files[0]), target+"/")
	require.True(t, ok, "loader: FILE %s is not under the testdata mount %s", files[0], target)
	st, err := os.Stat(filepath.Join(c.root, "testdata", filepath.FromSlash(rel)))
	require.NoError(t, err, "loader: FILE %s", files[0])
	require.True(t, st.Mode().IsRegular())
}

// loadCompose loads the compose file as `docker compose` would: OS
// environment and an optional .env for interpolation, paths resolved
// against the project directory.
func loadCompose(t *testing.T, dir, file string, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{file},
		cli.WithWorkingDirectory(dir),
		cli.WithOsEnv,
		cli.WithEnvFiles(),
		cli.WithDotEnv,
		cli.WithName(composeProjectName),
		cli.WithProfiles(profiles),
		cli.WithResolvedPaths(true),
	)
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "docker-compose.yml does not load")
	return p
}

// optionValue returns the argument after opt (or after opt=).
func optionValue(t *testing.T, args []string, opt string) string {
	t.Helper()
	for i, a := range args {
		if a == opt {
			require.Less(t, i+1, len(args), "%s has no value in %q", opt, args)
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, opt+"="); ok {
			return v
		}
	}
	require.Failf(t, "option missing", "%s not in %q", opt, args)
	return ""
}

// parseListeners maps a Kafka listener list (NAME://host:port,...) by name.
func parseListeners(t *testing.T, v string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, l := range strings.Split(v, ",") {
		name, hp, ok := strings.Cut(strings.TrimSpace(l), "://")
		require.True(t, ok, "listener %q", l)
		out[name] = hp
	}
	return out
}

func splitAddrs(t *testing.T, v string) []string {
	t.Helper()
	if u, err := url.Parse(v); err == nil && u.Scheme != "" && u.Host != "" {
		return []string{u.Host}
	}
	addrs := trimAll(strings.Split(v, ","))
	require.NotEmpty(t, addrs)
	return addrs
}

func splitHostPort(t *testing.T, hp string) (host, port string) {
	t.Helper()
	host, port, err := net.SplitHostPort(hp)
	require.NoError(t, err, "%q is not host:port", hp)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	require.True(t, n > 0 && n < 1<<16, "port %d", n)
	return host, port
}

func trimAll(ss []string) []string {
	out := make([]string, 0, len(ss))
	for _, s := range ss {
		out = append(out, strings.TrimSpace(s))
	}
	return out
}
